"""What a resume trusts: the row's content hash, the file's place, size and checksum."""

from __future__ import annotations

from pathlib import Path

from hsextract.extract.planning.resume_check import check_resume
from hsextract.extract.planning.scan import DatasetScan
from hsextract.output.checksum import file_checksum
from hsextract.output.formats import open_format
from hsextract.output.manifest import Manifest, WrittenSample


def test_changed_damaged_misplaced_and_vanished_rows_are_forgotten(tmp_path: Path) -> None:
    fmt = open_format("specforge", tmp_path)
    manifest = Manifest(tmp_path)
    for row in range(6):
        path = fmt.sample_path(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"sample {row}".encode() * 10)
        file = fmt.relative(row) if row != 4 else "elsewhere.ckpt"
        manifest.add_written(WrittenSample(row, file, 3, 3, path.stat().st_size, file_checksum(path), row_hash=f"h{row}"))
    fmt.sample_path(2).write_bytes(b"sample 2" * 5)  # truncated
    damaged = bytearray(fmt.sample_path(3).read_bytes())
    damaged[0] ^= 1  # same size, other bytes
    fmt.sample_path(3).write_bytes(bytes(damaged))
    scan = DatasetScan(tmp_path / "d.jsonl", "sha256:x", 5, {0: "h0", 1: "edited", 2: "h2", 3: "h3", 4: "h4"})

    result = check_resume(manifest, scan, fmt, with_checksum=True)
    assert result.verified == 1 and set(manifest.written) == {0}
    assert result.changed_rows == [1] and result.vanished_rows == [5]
    assert [row for row, _, _ in result.damaged] == [2, 3, 4]
    assert not fmt.sample_path(5).exists(), "the file of a row that left the dataset stays"

    sizes_only = Manifest(tmp_path)  # the same lines again: size only does not see row 3's changed bytes
    assert check_resume(sizes_only, scan, fmt, with_checksum=False).verified == 2
    manifest.close()
    sizes_only.close()
