"""An output's identity: what a later run may differ in, and what stops it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hsextract.errors import IdentityMismatchError, OutputError
from hsextract.output.data_config import DataConfig
from hsextract.output.identity import (
    DatasetIdentity,
    ModelIdentity,
    OutputIdentity,
    identity_from_data_config,
    read_identity,
    read_identity_or_torn,
    reconcile_identity,
    write_identity,
)

BASE = OutputIdentity(
    model=ModelIdentity("/models/a", "sha256:aaa", 8),
    aux_layer_ids=[1, 3, 4],
    format="specforge",
    max_seq_len=4096,
    hidden_size=64,
    dtype="bfloat16",
    shard_index=0,
    num_shards=1,
    dataset=DatasetIdentity("/data/d.jsonl", "sha256:ddd", 10),
)


def test_first_run_records_its_identity_and_reads_it_back(tmp_path: Path) -> None:
    identity, notes = reconcile_identity(tmp_path, None, BASE)
    assert notes == [] and identity.created_at
    write_identity(tmp_path, identity)
    assert read_identity(tmp_path) == identity


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"model": ModelIdentity("/models/a", "sha256:bbb", 8)}, "model /models/a (fingerprint sha256:aaa)"),
        ({"aux_layer_ids": [2, 4, 5]}, "aux_layer_ids [1, 3, 4] (this run: [2, 4, 5])"),
        ({"max_seq_len": 2048}, "pass --max-seq-len 4096"),
        ({"format": "speculators"}, "pass --format specforge"),
        ({"dtype": "float16"}, "dtype 'bfloat16' (this run: 'float16')"),
        ({"num_shards": 2}, "pass --shard-index 0 --num-shards 1"),
        ({"dataset": DatasetIdentity("/data/other.jsonl", "sha256:eee", 10)}, "pass --dataset /data/d.jsonl"),
    ],
)
def test_a_run_of_another_kind_is_refused(change: dict[str, object], says: str, tmp_path: Path) -> None:
    with pytest.raises(IdentityMismatchError) as caught:
        reconcile_identity(tmp_path, BASE, replace(BASE, **change))  # type: ignore[arg-type]
    assert says in str(caught.value) and "use a new --output" in str(caught.value)


def test_what_may_change(tmp_path: Path) -> None:
    moved = replace(BASE, model=ModelIdentity("/mnt/copy/a", "sha256:aaa", 8))
    identity, notes = reconcile_identity(tmp_path, BASE, moved)
    assert identity.model.path == "/mnt/copy/a" and "the model moved" in notes[0]
    edited = replace(BASE, dataset=DatasetIdentity("/data/d.jsonl", "sha256:changed", 11))
    _, notes = reconcile_identity(tmp_path, BASE, edited)
    assert "changed since this output was started" in notes[0]
    copied = replace(BASE, dataset=DatasetIdentity("/copy/d.jsonl", "sha256:ddd", 10))
    _, notes = reconcile_identity(tmp_path, BASE, copied)
    assert "the dataset moved" in notes[0]
    unknown_dtype = replace(BASE, dtype=None)  # a server that does not say: the recorded one stays
    assert reconcile_identity(tmp_path, BASE, unknown_dtype)[0].dtype == "bfloat16"


def test_without_fingerprints_the_paths_decide(tmp_path: Path) -> None:
    recorded = replace(BASE, model=ModelIdentity("/models/a", None, 8))
    assert reconcile_identity(tmp_path, recorded, replace(BASE, model=ModelIdentity("/models/a/", None, 8)))
    with pytest.raises(IdentityMismatchError, match="its files are not readable here"):
        reconcile_identity(tmp_path, recorded, replace(BASE, model=ModelIdentity("/models/b", None, 8)))


def test_an_older_output_is_checked_against_its_data_config(tmp_path: Path) -> None:
    legacy = identity_from_data_config(
        DataConfig.model_validate(
            {
                "model": {"path": "work/model"},  # relative: recorded by an older server, nothing to compare
                "num_hidden_layers": 8,
                "aux_layer_ids": [1, 3, 4],
                "format": "specforge",
                "max_seq_len": 4096,
                "hidden_size": 64,
                "dtype": "bfloat16",
                "dataset": "/data/d.jsonl",
            }
        )
    )
    assert legacy is not None and legacy.model.path == ""
    reconcile_identity(tmp_path, legacy, BASE)
    with pytest.raises(IdentityMismatchError, match="aux_layer_ids"):
        reconcile_identity(tmp_path, legacy, replace(BASE, aux_layer_ids=[2, 4, 5]))


@pytest.mark.parametrize("left", ["", "{torn"], ids=["empty", "torn"])
def test_an_empty_or_torn_identity_file_is_told_apart_from_none(tmp_path: Path, left: str) -> None:
    """What a power loss leaves of a file written without a sync: verify names it and the fix (rerun);
    the extractor rewrites it (tests/faults/test_identity.py)."""
    assert read_identity_or_torn(tmp_path) == (None, False)
    (tmp_path / "identity.json").write_text(left)
    assert read_identity_or_torn(tmp_path) == (None, True)
    with pytest.raises(OutputError, match="is empty or torn; rerun the extraction"):
        read_identity(tmp_path)
