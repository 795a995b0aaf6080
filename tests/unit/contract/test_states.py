"""The states written to files print as the strings on disk."""

from __future__ import annotations

import json

from hsextract.contract.states import DumpState, ErrorKind, RunStatus


def test_states_are_their_values() -> None:
    assert f"{RunStatus.COMPLETE}" == str(RunStatus.COMPLETE) == "complete"
    assert json.dumps({"kind": ErrorKind.BAD_INPUT}) == '{"kind": "bad_input"}'
    assert RunStatus("interrupted") is RunStatus.INTERRUPTED and DumpState("done") is DumpState.DONE
