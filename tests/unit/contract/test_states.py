"""The states written to files print as the strings on disk."""

from __future__ import annotations

import json
from pathlib import Path

import hsextract
from hsextract.contract.states import DumpState, ErrorKind, ErrorReason, RunStatus


def test_states_are_their_values() -> None:
    assert f"{RunStatus.COMPLETE}" == str(RunStatus.COMPLETE) == "complete"
    assert json.dumps({"kind": ErrorKind.BAD_INPUT}) == '{"kind": "bad_input"}'
    assert RunStatus("interrupted") is RunStatus.INTERRUPTED and DumpState("done") is DumpState.DONE


def test_every_error_reason_is_raised_somewhere() -> None:
    """A reason no code records is a metric series that stays 0 forever and a runbook entry nobody can reach."""
    package = Path(hsextract.__file__).parent
    text = "\n".join(p.read_text() for p in package.rglob("*.py") if p.name != "states.py")
    unused = [r.name for r in ErrorReason if f"ErrorReason.{r.name}" not in text]
    assert unused == []
