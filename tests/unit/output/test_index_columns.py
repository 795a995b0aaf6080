"""speculators' ``data/`` from flat arrays (``IndexColumns``) against ``datasets.Dataset.from_dict`` of the rows' own
lists, the way the finish built it before: the same table, and the same files once saved, holes and chunks included."""

from __future__ import annotations

import filecmp
import random
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from hsextract.output.formats import index_columns
from hsextract.output.formats.index_columns import IndexColumns
from hsextract.output.formats.speculators import SpeculatorsFormat, arrow_features
from hsextract.output.sample import Sample


def _samples(seed: int) -> tuple[list[Sample], set[int]]:
    rng = random.Random(seed)
    samples = []
    for row in range(120):
        if rng.random() < 0.1:
            continue  # a row this output never saw (bad input, another shard)
        length = rng.randrange(1, 300)
        ids = [rng.randrange(128_000) for _ in range(length)]
        samples.append(Sample(row, ids, [int(rng.random() < 0.6) for _ in range(length)], length, True))
    written = {s.row for s in samples if rng.random() < 0.9}  # a validated row whose file is not listed: a hole too
    return samples, written


def _from_lists(samples: list[Sample], written_rows: set[int]) -> datasets.Dataset:
    by_row = {s.row: s for s in samples if s.row in written_rows}
    rows = range(max(by_row, default=-1) + 1)
    return datasets.Dataset.from_dict(
        {
            "input_ids": [by_row[r].input_ids if r in by_row else [] for r in rows],
            "loss_mask": [by_row[r].loss_mask if r in by_row else [] for r in rows],
            "seq_len": [len(by_row[r].input_ids) if r in by_row else 0 for r in rows],
            "written": [r in by_row for r in rows],
        },
        features=arrow_features(),
    )


def _saved(table: datasets.Dataset, where: Path) -> Path:
    table.set_format("torch")
    table.save_to_disk(str(where))
    return where


WHOLE = index_columns.CHUNK_VALUES


@pytest.mark.parametrize("chunk_values", [WHOLE, 1000, 1])
def test_the_index_is_from_dicts_of_the_rows_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_values: int) -> None:
    monkeypatch.setattr(index_columns, "CHUNK_VALUES", chunk_values)  # 1: a row a chunk, each longer than the room
    samples, written = _samples(chunk_values)
    shuffled = random.Random(chunk_values).sample(samples, len(samples))  # the index's order is the rows', not theirs
    ours = datasets.Dataset.from_dict(IndexColumns.of(shuffled, written).arrow(), features=arrow_features())
    theirs = _from_lists(samples, written)
    assert ours.features == theirs.features and ours.to_dict() == theirs.to_dict()
    chunks = ours.data.column("input_ids").chunks
    assert len(chunks) == 1 if chunk_values == WHOLE else len(chunks) > 1
    # a chunk holds at most chunk_values values, or one row (with the empty ones beside it) that alone holds more
    assert all(len(c.values) <= chunk_values or sum(map(len, c.to_pylist())) == max(map(len, c.to_pylist())) for c in chunks)
    a, b = _saved(ours, tmp_path / "ours"), _saved(theirs, tmp_path / "theirs")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all(filecmp.cmp(a / name, b / name, shallow=False) for name in names)


def test_an_output_with_no_written_row_is_an_empty_index() -> None:
    columns = IndexColumns.of([], set())
    assert len(datasets.Dataset.from_dict(columns.arrow(), features=arrow_features())) == 0
    assert columns.token_freq() == {}


def test_prepare_finalize_imports_datasets_in_the_background() -> None:
    script = (
        "import sys, threading; from pathlib import Path\n"
        "from hsextract.output.formats.speculators import SpeculatorsFormat\n"
        "assert 'datasets' not in sys.modules\n"
        "SpeculatorsFormat(Path('.')).prepare_finalize(lambda: [])\n"
        "[t.join() for t in threading.enumerate() if t.name == 'hsextract-import']\n"
        "assert 'datasets' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def _finalized(root: Path, samples: list[Sample], written: set[int], pre_read: list[Sample] | Exception | None) -> Path:
    fmt = SpeculatorsFormat(root)
    if pre_read is not None:

        def read_again() -> list[Sample]:
            if isinstance(pre_read, Exception):
                raise pre_read
            return pre_read

        fmt.prepare_finalize(read_again)
    fmt.finalize(iter(samples), written)
    return root / "data"


@pytest.mark.parametrize("case", ["read", "a written row not read", "the read failed"])
def test_the_finish_from_the_rows_read_while_the_last_ones_finish_is_the_finish_from_its_own_read(
    tmp_path: Path, case: str
) -> None:
    """prepare_finalize reads every row that validates while the rows in flight finish; finalize takes the written ones
    from that read. A written row the read lacks (the dataset changed), or a read that failed, and finalize reads the
    rows again itself: data/ and token_freq.pt are the same files either way."""
    samples, written = _samples(7)
    pre_read: list[Sample] | Exception = samples  # every row that validates: written ones and holes
    if case == "a written row not read":
        pre_read = [s for s in samples if s.row != min(written)]
    elif case == "the read failed":
        pre_read = OSError(5, "Input/output error")
    ours = _finalized(tmp_path / "ours", samples, written, pre_read)
    theirs = _finalized(tmp_path / "theirs", samples, written, None)
    names = sorted(p.name for p in theirs.iterdir())
    assert "token_freq.pt" in names and names == sorted(p.name for p in ours.iterdir())
    assert all(filecmp.cmp(ours / name, theirs / name, shallow=False) for name in names)
    if case == "read":  # taken from the read: finalize's own rows are not looked at
        again = _finalized(tmp_path / "again", [], written, samples)
        assert all(filecmp.cmp(again / name, theirs / name, shallow=False) for name in names)
