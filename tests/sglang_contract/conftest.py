"""Registers the fixtures and hooks of tests/sglang_contract; their code is in helpers.py."""

from __future__ import annotations

from .helpers import (  # noqa: F401 - pytest finds fixtures and hooks by their names here
    published_server_args,
    pytest_collection_modifyitems,
    served,
)
