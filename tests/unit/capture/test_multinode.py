"""A server over several nodes: the flags rendered per node, and the settings refused before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.launcher import build_command
from hsextract.capture.sglang.multinode import multinode_args, parse_dist_init_addr
from hsextract.errors import ConfigError

KIMI: dict[str, Any] = {
    "python": "/opt/ml-env/bin/python",
    "model_path": "/models/Kimi-K2.5",
    "num_hidden_layers": 61,
    "architecture": "deepseek",
    "tp_size": 16,
    "layer_ids": [2, 30, 58],
}


def test_each_node_gets_the_same_command_but_its_rank() -> None:
    commands = [
        build_command(SGLangLaunchConfig(**KIMI, nnodes=2, node_rank=rank, dist_init_addr="10.0.0.11:29500"))
        for rank in (0, 1)
    ]
    for rank, argv in enumerate(commands):
        at = argv.index("--nnodes")
        assert argv[at : at + 6] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.0.0.11:29500"]
        assert argv[argv.index("--tp-size") + 1] == "16"
    assert [a for a in commands[0] if a != "0"] == [a for a in commands[1] if a != "1"]


def test_one_node_adds_nothing() -> None:
    assert multinode_args(SGLangLaunchConfig(**{**KIMI, "tp_size": 8})) == []
    assert "--nnodes" not in build_command(SGLangLaunchConfig(**{**KIMI, "tp_size": 8}))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"nnodes": 2}, "needs dist_init_addr"),
        ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, r"node_rank 2 must be in 0\.\.1"),
        ({"node_rank": 1}, "node_rank 1 with nnodes 1"),
        ({"nnodes": 3, "dist_init_addr": "h:29500"}, "tp_size 16 does not split over nnodes 3"),
        ({"nnodes": 2, "dist_init_addr": "10.0.0.11"}, "is not host:port"),
        ({"nnodes": 2, "dist_init_addr": "h:1", "enable_dp_attention": True}, "enable_dp_attention with nnodes > 1"),
        ({"extra_args": ["--node-rank=1"]}, "use the config key node_rank"),
        ({"extra_args": ["--dist-init-addr", "h:1"]}, "use the config key dist_init_addr"),
    ],
)
def test_bad_multinode_settings_are_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_command(SGLangLaunchConfig(**{**KIMI, **settings}))


def test_dist_init_addr_forms() -> None:
    assert parse_dist_init_addr("10.0.0.11:29500") == ("10.0.0.11", 29500)
    assert parse_dist_init_addr("[fd00::11]:29500") == ("fd00::11", 29500)
    for bad in ("h:0", "h:70000", ":29500", "h:port"):
        with pytest.raises(ConfigError):
            parse_dist_init_addr(bad)
