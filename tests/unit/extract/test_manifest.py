"""The manifest after a crash: torn last lines, missing files, failed rows retried."""

from __future__ import annotations

from pathlib import Path

from hsextract.contract.states import ErrorKind
from hsextract.extract.manifest import ERRORS_FILE, SAMPLES_FILE, ErrorRecord, Manifest, WrittenSample


def test_torn_lines_and_missing_files_are_redone(tmp_path: Path) -> None:
    (tmp_path / "a.ckpt").write_bytes(b"x")
    manifest = Manifest(tmp_path)
    manifest.add_written(WrittenSample(0, "a.ckpt", 5, 5, 1))
    manifest.add_written(WrittenSample(1, "gone.ckpt", 5, 5, 1))
    manifest.add_error(ErrorRecord(2, ErrorKind.BAD_INPUT, "empty_input_ids", "row 2: input_ids is empty"))
    manifest.add_error(ErrorRecord(3, ErrorKind.FAILED, "dump_timeout", "no dump"))
    manifest._samples_handle.write('{"row": 4, "file": "b.ck')  # a write torn by SIGKILL
    manifest._samples_handle.flush()
    reopened = Manifest(tmp_path)
    assert set(reopened.written) == {0}  # row 1's file is missing, row 4's line is torn
    assert reopened.is_settled(0) and reopened.is_settled(2)  # bad input stays settled
    assert not reopened.is_settled(3)  # a failed row is retried
    reopened.close()
    lines = (tmp_path / SAMPLES_FILE).read_text().splitlines()
    assert len(lines) == 1 and '"row": 0' in lines[0]
    assert '"kind": "bad_input"' in (tmp_path / ERRORS_FILE).read_text()


def test_unknown_error_kind_is_skipped_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / ERRORS_FILE).write_text('{"row": 1, "kind": "weird", "reason": "r", "message": "m"}\n')
    manifest = Manifest(tmp_path)
    assert not manifest.is_settled(1)
    manifest.close()
