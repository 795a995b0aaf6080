"""Registers the fixtures of the deployment tests (their code is in helpers.py) and marks every
test ``root``: they build a real LXC container and run ansible-playbook against it."""

from __future__ import annotations

import pytest

from .helpers import ANSIBLE_BIN, container, deployed, inventory  # noqa: F401 - pytest finds fixtures by name here

# Collected only by the Ansible venv's interpreter (make test-deploy); `make test` with .venv skips the directory.
if not (ANSIBLE_BIN / "ansible-playbook").exists():
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.root)
