"""Registers the fixtures and hooks of tests/faults; their code is in helpers.py."""

from __future__ import annotations

from .helpers import (  # noqa: F401 - pytest finds fixtures and hooks by their names here
    models,
    proxy,
    server_process,
    tmpfs,
)
