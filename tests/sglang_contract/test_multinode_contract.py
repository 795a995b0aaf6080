"""A server over two nodes: each node's command parsed by SGLang 0.5.23's own parser and ServerArgs."""

from __future__ import annotations

import argparse

import pytest
from sglang.srt.server_args import ServerArgs

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.launcher import build_command, validate_with_sglang

TWO_NODES = dict(
    python="/opt/ml-env/bin/python", model_path="/models/Kimi-K2.5", architecture="deepseek", num_hidden_layers=61,
    tp_size=16, layer_ids=[2, 30, 58], nnodes=2, dist_init_addr="10.0.0.11:29500",
)  # fmt: skip


@pytest.mark.parametrize("rank", [0, 1])
def test_each_nodes_command_parses_with_sglangs_parser(rank: int) -> None:
    argv = build_command(SGLangLaunchConfig(**TWO_NODES, node_rank=rank))
    assert validate_with_sglang(argv) is True
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(argv[3:]))
    assert (args.nnodes, args.node_rank, args.dist_init_addr) == (2, rank, "10.0.0.11:29500")
    assert args.tp_size == 16 and args.disable_radix_cache is True
    assert list(args.return_aux_hidden_state_layer_ids) == [3, 31, 59]


def test_sglangs_parser_knows_every_flag_the_multinode_module_owns() -> None:
    from hsextract.capture.sglang.multinode import OWNED_FLAGS

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    assert set(OWNED_FLAGS) <= known
