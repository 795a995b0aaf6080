"""``hsextract extract --help`` says what the command does (issue 29 item 14: it listed options only)."""

from __future__ import annotations

import pytest

from hsextract.cli import main


def test_extract_help_has_a_description(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    text = capsys.readouterr().out
    head = text.split("options:")[0]
    assert "hidden-state dump" in head and "Start the server first" in head and "Resumable" in head
    assert "Exit codes:" in text
