"""What a resume checks of a sample file: its size and checksum, or with ``--resume-check size`` its size and
whether either end reads as zeros (a file a power loss kept the size of but not the data of)."""

from __future__ import annotations

import os
from pathlib import Path

from hsextract.output.checksum import END_BYTES, check_sample_file, file_checksum


def test_size_mode_finds_a_file_whose_data_was_lost_but_not_its_size(tmp_path: Path) -> None:
    whole = tmp_path / "whole.ckpt"
    whole.write_bytes(os.urandom(3 * END_BYTES))
    size, checksum = whole.stat().st_size, file_checksum(whole)
    assert check_sample_file(whole, size, checksum, with_checksum=False) is None
    assert check_sample_file(whole, size, checksum, with_checksum=True) is None
    data = bytearray(whole.read_bytes())
    for where, block in (("start", slice(0, END_BYTES)), ("end", slice(-END_BYTES, None))):
        lost = tmp_path / f"lost-{where}.ckpt"
        damaged = bytearray(data)
        damaged[block] = bytes(END_BYTES)
        lost.write_bytes(damaged)
        assert "reads as zeros at its " + where in (check_sample_file(lost, size, checksum, with_checksum=False) or "")
        assert "checksum" in (check_sample_file(lost, size, checksum, with_checksum=True) or "")
    middle = tmp_path / "middle.ckpt"
    damaged = bytearray(data)
    damaged[END_BYTES : 2 * END_BYTES] = bytes(END_BYTES)
    middle.write_bytes(damaged)
    assert check_sample_file(middle, size, checksum, with_checksum=False) is None  # what size mode cannot see
    assert check_sample_file(middle, size, checksum, with_checksum=True) is not None  # verify and the default can
