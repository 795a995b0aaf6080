"""The launcher's command against SGLang's own argument parser and capture arithmetic."""

from __future__ import annotations

import argparse
import json

import pytest
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
from sglang.srt.server_args import ServerArgs

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.launcher import _sglang_method, build_command, layer_id_argument, validate_with_sglang
from hsextract.errors import ConfigError

KIMI = dict(
    python="/opt/ml-env/bin/python", model_path="/models/Kimi-K2.5", architecture="deepseek", num_hidden_layers=61,
    tp_size=8, layer_ids=[2, 30, 58], mem_fraction_static=0.85, chunked_prefill_size=8192,
)  # fmt: skip


def parsed(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv[3:]))


def test_kimi_command_parses_with_sglang_and_has_every_required_flag() -> None:
    argv = build_command(SGLangLaunchConfig(**KIMI))
    assert argv[:3] == ["/opt/ml-env/bin/python", "-m", "sglang.launch_server"]
    assert validate_with_sglang(argv) is True
    args = parsed(argv)
    assert args.model_path == "/models/Kimi-K2.5" and args.tp_size == 8
    assert args.disable_radix_cache is True
    assert args.chunked_prefill_size == 8192
    assert args.enable_return_aux_hidden_states is True
    assert args.disable_prefill_cuda_graph is True
    assert args.mem_fraction_static == 0.85 and args.enable_metrics is True
    assert list(args.return_aux_hidden_state_layer_ids) == [3, 31, 59]
    hooks = args.forward_hooks if isinstance(args.forward_hooks, list) else json.loads(args.forward_hooks)
    assert hooks[0]["target_modules"] == ["logits_processor"]
    assert hooks[0]["hook_factory"] == "hsextract.capture.sglang.hook:make_hook"
    assert hooks[0]["config"]["layer_ids"] == [2, 30, 58]


def test_disable_custom_all_reduce_reaches_sglangs_server_args() -> None:
    assert parsed(build_command(SGLangLaunchConfig(**KIMI))).disable_custom_all_reduce is False
    argv = build_command(SGLangLaunchConfig(**KIMI, disable_custom_all_reduce=True))
    assert validate_with_sglang(argv) is True
    assert parsed(argv).disable_custom_all_reduce is True


def test_capture_indices_come_from_sglangs_own_arithmetic() -> None:
    assert _sglang_method("deepseek") is DeepseekV2ForCausalLM.set_eagle3_layers_to_capture
    # DeepSeek in 0.5.23 uses the ids as capture indices unless the first is 1; llama and qwen2 add one.
    assert layer_id_argument("deepseek", [2, 30, 58], 61) == [3, 31, 59]
    assert layer_id_argument("llama", [2, 30, 58], 61) == [2, 30, 58]
    assert layer_id_argument("qwen2", [2, 16, 29], 32) == [2, 16, 29]
    # layer id 0 (capture index 1) hits DeepSeek's "first id is 1 -> add one" rule; ids [0, ...] do too.
    with pytest.raises(ConfigError, match=r"no eagle_aux_hidden_state_layer_ids value makes SGLang 0.5.23 \(deepseek\)"):
        layer_id_argument("deepseek", [0, 30, 58], 61)


def test_llama_command_parses() -> None:
    config = SGLangLaunchConfig(**{**KIMI, "architecture": "llama", "num_hidden_layers": 32, "layer_ids": None})
    args = parsed(build_command(config))
    # default outputs [1, 15, 28] = SGLang's default capture [2, 16, 29], asked for with the drafter's value
    assert list(args.return_aux_hidden_state_layer_ids) == [1, 15, 28]


def test_kimi_default_layers_are_the_ecosystem_default() -> None:
    argv = build_command(SGLangLaunchConfig(**{**KIMI, "layer_ids": None}))
    args = parsed(argv)
    assert list(args.return_aux_hidden_state_layer_ids) == [1, 29, 57]  # DeepSeek: first id 1 -> +1
    hooks = args.forward_hooks if isinstance(args.forward_hooks, list) else json.loads(args.forward_hooks)
    assert hooks[0]["config"]["layer_ids"] == [1, 29, 57]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"disable_radix_cache": False}, "radix cache skips recomputing cached prefixes"),
        ({"layer_ids": [2, 30, 61]}, r"contain \[61\], outside 0..59"),
        (
            {"extra_args": ["--cuda-graph-backend-prefill", "breakable"]},
            "prefill CUDA graphs replay without running Python hooks",
        ),
        ({"extra_args": ["--pp-size", "2"]}, "pipeline parallel size 1"),
        ({"extra_args": ["--tp-size=4"]}, "use the config key tp_size"),
        ({"extra_args": ["--disable-custom-all-reduce"]}, "use the config key disable_custom_all_reduce"),
        ({"extra_args": ["--speculative-draft-model-path", "/d"]}, "extraction needs none"),
    ],
)
def test_data_losing_settings_are_refused(override: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_command(SGLangLaunchConfig(**{**KIMI, **override}))


def test_the_generate_profile_parses_with_sglang_and_keeps_the_radix_cache() -> None:
    generation = {k: v for k, v in KIMI.items() if k != "layer_ids"}
    argv = build_command(SGLangLaunchConfig(**generation, profile="generate"))
    assert validate_with_sglang(argv) is True
    args = parsed(argv)
    assert args.disable_radix_cache is False and args.enable_return_aux_hidden_states is False
    assert not args.forward_hooks and args.speculative_algorithm is None
    assert args.disable_prefill_cuda_graph is False and args.tp_size == 8
