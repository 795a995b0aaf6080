"""The manifest after a crash: torn last lines cut off, later lines win, failed rows retried,
settled only for the row content it was made from."""

from __future__ import annotations

from pathlib import Path

from hsextract.contract.states import ErrorKind
from hsextract.output.manifest import ERRORS_FILE, SAMPLES_FILE, ErrorRecord, Manifest, WrittenSample


def test_torn_lines_are_cut_and_failed_rows_retried(tmp_path: Path) -> None:
    manifest = Manifest(tmp_path)
    manifest.add_written(WrittenSample(0, "a.ckpt", 5, 5, 1, "xxh3-128:000000aa", row_hash="h0"))
    manifest.add_error(ErrorRecord(2, ErrorKind.BAD_INPUT, "empty_input_ids", "row 2: input_ids is empty", "h2"))
    manifest.add_error(ErrorRecord(3, ErrorKind.FAILED, "dump_timeout", "no dump", "h3"))
    with open(tmp_path / SAMPLES_FILE, "a") as handle:
        handle.write('{"row": 4, "file": "b.ck')  # a write torn by SIGKILL
    reopened = Manifest(tmp_path)
    assert set(reopened.written) == {0}
    assert reopened.is_settled(0, "h0") and reopened.is_settled(2, "h2")  # bad input stays settled
    assert not reopened.is_settled(3, "h3")  # a failed row is retried
    reopened.add_written(WrittenSample(5, "c.ckpt", 5, 5, 1, "xxh3-128:000000cc", row_hash="h5"))  # starts on a line of its own
    reopened.close()
    lines = (tmp_path / SAMPLES_FILE).read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ['{"row": 0', '{"row": 5']
    assert '"kind": "bad_input"' in (tmp_path / ERRORS_FILE).read_text()


def test_settled_only_for_the_same_row_content_and_a_later_line_wins(tmp_path: Path) -> None:
    manifest = Manifest(tmp_path)
    manifest.add_written(WrittenSample(0, "a.ckpt", 5, 5, 1, "xxh3-128:00000001", row_hash="old"))
    manifest.add_written(WrittenSample(0, "a.ckpt", 6, 6, 2, "xxh3-128:00000002", row_hash="new"))  # redone after an edit
    manifest.add_error(ErrorRecord(1, ErrorKind.BAD_INPUT, "not_json", "row 1", "bad"))
    reopened = Manifest(tmp_path)
    assert reopened.written[0].checksum == "xxh3-128:00000002"
    assert reopened.is_settled(0, "new") and not reopened.is_settled(0, "old")
    assert not reopened.is_settled(1, "edited"), "bad input of other content must be looked at again"
    reopened.close()


def test_unknown_error_kind_is_skipped_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / ERRORS_FILE).write_text('{"row": 1, "kind": "weird", "reason": "r", "message": "m"}\n')
    manifest = Manifest(tmp_path)
    assert not manifest.is_settled(1, "anything")
    manifest.close()
