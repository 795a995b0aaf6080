"""The checks of ``hsextract merge`` before anything is written: agreement, coverage, rows, totals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hsextract.errors import ConfigError, MergeError
from hsextract.output.data_config import DataConfig
from hsextract.output.merge_plan import ShardOutput, build_plan, merged_data_config, provenance_of, rows_of_slice


def _shard(index: int, num: int, total_rows: int, bad: tuple[int, ...] = (), **changes: Any) -> ShardOutput:
    rows = [r for r in range(total_rows) if r % num == index]
    written = [r for r in rows if r not in bad]
    config: dict[str, Any] = {
        "format": "specforge",
        "data_format_version": 1,
        "aux_layer_ids": [2, 4, 5],
        "layer_ids": [2, 4, 5, 7],
        "num_hidden_layers": 8,
        "hidden_size": 64,
        "vocab_size": 1024,
        "dtype": "float32",
        "max_seq_len": 48,
        "final_norm_applied": True,
        "model": {"path": "/models/m", "num_hidden_layers": 8},
        "shard_index": index,
        "num_shards": num,
        "rows_in_shard": len(rows),
        "status": "complete",
        "total_samples": len(written),
        "total_tokens": 10 * len(written),
        "total_bytes": 100 * len(written),
        "truncated_samples": 1,
        "truncated_tokens": 3,
        "bad_input_samples": len(bad),
        "failed_samples": 0,
        "error_counts": {"empty_input_ids": len(bad)} if bad else {},
        "created_at": f"2026-12-01T0{index}:00:00+00:00",
        "created_unix": 1000.0 + index,
    }
    config.update(changes)
    samples = [{"row": r, "file": f"rows_0-2000/data_{r}.ckpt", "num_tokens": 10, "original_length": 10} for r in written]
    errors = [{"row": r, "kind": "bad_input", "reason": "empty_input_ids", "message": "m"} for r in bad]
    return ShardOutput(Path(f"/out/shard{index}"), DataConfig.model_validate(config), samples, errors)


@pytest.mark.parametrize(
    ("total", "index", "num", "expected"), [(11, 0, 2, 6), (11, 1, 2, 5), (2, 2, 3, 0), (0, 0, 1, 0), (7, 2, 3, 2)]
)
def test_rows_of_slice(total: int, index: int, num: int, expected: int) -> None:
    assert rows_of_slice(total, index, num) == expected
    assert rows_of_slice(total, index, num) == len([r for r in range(total) if r % num == index])


def test_a_good_plan_assigns_every_row_once_and_sums_the_totals() -> None:
    shards = [_shard(1, 3, 10), _shard(0, 3, 10, bad=(3,)), _shard(2, 3, 10)]
    plan = build_plan(shards)
    assert [s.shard_index for s in plan.shards] == [0, 1, 2]
    assert plan.total_rows == 10 and set(plan.owner) == set(range(10)) - {3} and set(plan.bad_rows) == {3}
    assert plan.owner[7].shard_index == 1 and plan.last_written_row == 9
    merged = merged_data_config(plan, [provenance_of(s) for s in plan.shards], "2026-12-01T09:00:00+00:00").to_json()
    assert merged["total_samples"] == 9 and merged["total_tokens"] == 90 and merged["rows_in_shard"] == 10
    assert merged["truncated_samples"] == 3 and merged["bad_input_samples"] == 1
    assert merged["error_counts"] == {"empty_input_ids": 1}
    assert (merged["shard_index"], merged["num_shards"], merged["status"]) == (0, 1, "complete")
    assert merged["created_at"] == "2026-12-01T00:00:00+00:00" and merged["created_unix"] == 1000.0
    assert [p["path"] for p in merged["merged_from"]] == ["/out/shard0", "/out/shard1", "/out/shard2"]
    assert merged["merged_from"][1]["created_at"] == "2026-12-01T01:00:00+00:00"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("model", {"path": "/models/other", "num_hidden_layers": 8}),
        ("aux_layer_ids", [1, 3, 4]),
        ("format", "speculators"),
        ("max_seq_len", 4096),
        ("dtype", "bfloat16"),
        ("num_shards", 3),
    ],
)
def test_shards_that_disagree_are_refused(key: str, value: Any) -> None:
    with pytest.raises(MergeError, match=rf"shard 1/\d .* has {key.split('.')[0]}"):
        build_plan([_shard(0, 2, 6), _shard(1, 2, 6, **{key: value})])


def test_the_dataset_fingerprint_is_compared_only_when_every_shard_has_one() -> None:
    build_plan([_shard(0, 2, 6, dataset_fingerprint="a"), _shard(1, 2, 6)])
    build_plan([_shard(0, 2, 6, dataset_fingerprint="a"), _shard(1, 2, 6, dataset_fingerprint="a")])
    with pytest.raises(MergeError, match="another dataset"):
        build_plan([_shard(0, 2, 6, dataset_fingerprint="a"), _shard(1, 2, 6, dataset_fingerprint="b")])


def test_missing_duplicate_incomplete_and_misplaced_shards_are_refused() -> None:
    with pytest.raises(MergeError, match=r"shard\(s\) 1, 2 of 3 are not given"):
        build_plan([_shard(0, 3, 9)])
    with pytest.raises(MergeError, match="both shard 1 of 2"):
        build_plan([_shard(0, 2, 6), _shard(1, 2, 6), _shard(1, 2, 6)])
    with pytest.raises(MergeError, match="is 'incomplete'"):
        build_plan([_shard(0, 2, 6), _shard(1, 2, 6, status="incomplete", failed_samples=2)])
    wrong = _shard(1, 2, 6)
    wrong.samples.append({"row": 2, "file": "rows_0-2000/data_2.ckpt"})
    with pytest.raises(MergeError, match="holds row 2, which belongs to shard 0"):
        build_plan([_shard(0, 2, 6), wrong])
    short = _shard(1, 2, 6)
    short.samples.pop()
    with pytest.raises(MergeError, match="settled 2 of its 3 rows"):
        build_plan([_shard(0, 2, 6), short])
    failed = _shard(1, 2, 6)
    failed.errors.append({"row": 5, "kind": "failed", "reason": "dump_timeout", "message": "m"})
    with pytest.raises(MergeError, match=r"failed rows \[5\]"):
        build_plan([_shard(0, 2, 6), failed])
    with pytest.raises(MergeError, match="no shard output"):
        build_plan([])


def test_the_trainer_settings_come_from_the_shard_with_the_longest_sample() -> None:
    def trainer(longest: int) -> dict[str, Any]:
        return {"flags": {"--total-seq-len": max(longest, 8192)}, "longest_sample": longest}

    shards = [
        _shard(0, 2, 6, longest_sample_tokens=900, trainer=trainer(900)),
        _shard(1, 2, 6, longest_sample_tokens=9000, trainer=trainer(9000)),
    ]
    merged = merged_data_config(build_plan(shards), [], "now").to_json()
    assert merged["longest_sample_tokens"] == 9000 and merged["trainer"] == trainer(9000)


def test_merge_errors_are_configuration_errors() -> None:
    assert issubclass(MergeError, ConfigError)  # the CLI exits 2: nothing was written
