"""Shard assignment from an inventory and the fleet's TOTAL (pure parts of hsextract.ops.fleet)."""

from __future__ import annotations

import json

import pytest

from hsextract.errors import ConfigError
from hsextract.ops.fleet import fleet_total, render_total, to_json
from hsextract.ops.inventory import Target, assign_shards, targets_from_inventory_json
from hsextract.ops.status import HostStatus, Progress


def test_shards_follow_the_sorted_group_unless_set() -> None:
    assert assign_shards(["c", "a", "b"], {}) == ({"a": 0, "b": 1, "c": 2}, 3)
    # a replacement host takes the lost host's index; the count stays
    hostvars = {"a": {"hsx_num_shards": 3}, "d": {"hsx_shard_index": 1, "hsx_num_shards": 3}, "c": {"hsx_num_shards": 3}}
    assert assign_shards(["a", "c", "d"], hostvars) == ({"a": 0, "c": 2, "d": 1}, 3)
    assert assign_shards(["a", "b"], {"b": {"hsx_shard_index": 0}}) == ({"a": 1, "b": 0}, 2)
    # node 1 of a two-node server extracts nothing: no shard
    assert assign_shards(["big-0", "big-1", "solo"], {"big-1": {"hsx_node_rank": 1}}) == ({"big-0": 0, "solo": 1}, 2)


@pytest.mark.parametrize(
    ("hostvars", "message"),
    [
        ({"a": {"hsx_shard_index": 1}, "b": {"hsx_shard_index": 1}}, "a and b both extract shard 1"),
        ({"b": {"hsx_shard_index": 2}}, "b: shard index 2 is outside 0..1"),
        ({"a": {"hsx_num_shards": 2}, "b": {"hsx_num_shards": 3}}, "hsx_num_shards differs"),
    ],
)
def test_bad_shard_settings_are_refused(hostvars: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        assign_shards(["a", "b"], hostvars)


def test_inventory_targets_carry_their_shard() -> None:
    data = {
        "extraction_containers": {"hosts": ["z2", "z1"]},
        "_meta": {"hostvars": {"z1": {"ansible_host": "10.0.0.1"}, "z2": {"ansible_host": "10.0.0.2"}}},
    }
    targets = {t.name: t for t in targets_from_inventory_json(data)}
    assert (targets["z1"].shard_index, targets["z2"].shard_index, targets["z2"].num_shards) == (0, 1, 2)


def _status(
    name: str, running: bool, settled: int, planned: int, tokens: int, planned_tokens: int, rate: float | None
) -> HostStatus:
    eta = None if not rate else max(0, planned_tokens - tokens) / rate
    progress = Progress(
        running=running,
        server_up=True,
        planned=planned,
        settled=settled,
        by_status={"ok": settled - 1, "failed": 1},
        tokens=tokens,
        tokens_planned=planned_tokens,
        errors={"dump_timeout": 2},
        inflight=0,
        elapsed_s=100.0,
        tokens_per_s=rate,
        eta_s=eta,
    )
    return HostStatus(name, "10.0.0.1", progress=progress)


def _targets(*names: str) -> list[Target]:
    return [Target(n, "h", shard_index=i, num_shards=len(names)) for i, n in enumerate(names)]


def test_total_sums_the_shards_and_names_the_one_that_ends_last() -> None:
    statuses = [
        _status("fast", True, 80, 100, 8000, 10000, 100.0),  # 20 s left
        _status("slow", True, 30, 100, 3000, 10000, 10.0),  # 700 s left
        _status("done", False, 100, 100, 10000, 10000, 50.0),
    ]
    total = fleet_total(statuses, _targets("fast", "slow", "done"))
    assert (total.settled, total.planned, total.tokens, total.tokens_planned) == (210, 300, 21000, 30000)
    assert total.tokens_per_s == 110.0  # running shards only
    assert total.eta_s == 700.0 and total.slowest == "slow" and total.running == 2
    assert total.errors == 6 and total.failed == 3
    text = render_total(total)
    assert "TOTAL: 210/300 samples (70.0%), 21000/30000 tokens, 110 tokens/s, ETA 11m 40s" in text
    assert "slowest shard: slow (shard 1/3, running, 30% settled)" in text
    loaded = json.loads(to_json(statuses, _targets("fast", "slow", "done"), total))
    assert [h["shard_index"] for h in loaded["hosts"]] == [0, 1, 2] and loaded["total"]["slowest"] == "slow"


def test_a_stopped_or_unreachable_shard_makes_the_end_unknown_and_is_the_slowest() -> None:
    statuses = [
        _status("moving", True, 50, 100, 5000, 10000, 100.0),
        _status("stopped", False, 10, 100, 1000, 10000, 10.0),
        HostStatus("gone", "10.0.0.9", reachable=False, error="refused"),
    ]
    total = fleet_total(statuses, _targets("moving", "stopped", "gone"))
    assert total.eta_s is None and set(total.unknown) == {"stopped", "gone"}
    assert total.slowest == "gone"  # of the shards without a known end, the one with the least known progress
    assert "ETA unknown (stopped, gone stopped or without metrics" in render_total(total)
