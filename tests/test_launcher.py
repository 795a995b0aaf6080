"""launch-sglang without SGLang installed: the command, the refusals, the exec."""

from __future__ import annotations

import json
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.launcher import build_command
from hsextract.errors import ConfigError

KIMI = {
    "python": "/opt/ml-env/bin/python",
    "model_path": "/models/Kimi-K2.5",
    "num_hidden_layers": 61,
    "architecture": "deepseek",
    "tp_size": 8,
    "layer_ids": [2, 30, 58],
}


def launch(tmp_path: Path, config: dict[str, object], *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "sglang.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "hsextract", "launch-sglang", "--config", str(path), *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_dry_run_prints_the_full_command(tmp_path: Path) -> None:
    result = launch(tmp_path, KIMI, "--dry-run")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[:3] == ["/opt/ml-env/bin/python", "-m", "sglang.launch_server"]
    for flag in ("--disable-radix-cache", "--enable-return-aux-hidden-states", "--disable-prefill-cuda-graph", "--forward-hooks"):
        assert flag in argv
    assert argv[argv.index("--tp-size") + 1] == "8"
    ids_at = argv.index("--return-aux-hidden-state-layer-ids")
    assert argv[ids_at + 1 : ids_at + 4] == ["3", "31", "59"]  # DeepSeek in 0.5.23 takes capture indices


def test_custom_all_reduce_is_disabled_only_when_asked(tmp_path: Path) -> None:
    default = shlex.split(launch(tmp_path, KIMI, "--dry-run").stdout)
    assert "--disable-custom-all-reduce" not in default
    result = launch(tmp_path, {**KIMI, "disable_custom_all_reduce": True}, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert shlex.split(result.stdout).count("--disable-custom-all-reduce") == 1
    # the key is the one place to set it: the flag through extra_args is refused and the key named
    result = launch(tmp_path, {**KIMI, "extra_args": ["--disable-custom-all-reduce"]}, "--dry-run")
    assert result.returncode == 2 and "use the config key disable_custom_all_reduce" in result.stderr, result.stderr


def test_model_config_json_gives_layers_and_architecture(tmp_path: Path, model_dir) -> None:
    config: dict[str, object] = {"python": "/usr/bin/python3", "model_path": str(model_dir("llama"))}
    argv = shlex.split(launch(tmp_path, config, "--dry-run").stdout)
    ids_at = argv.index("--return-aux-hidden-state-layer-ids")
    # the default outputs [1, 3, 4] of 8 layers; llama adds one itself, so they are passed as they are
    assert argv[ids_at + 1 : ids_at + 4] == ["1", "3", "4"]


def test_unknown_model_family_is_refused_with_the_fix(tmp_path: Path) -> None:
    model = tmp_path / "mistral"
    model.mkdir()
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "num_hidden_layers": 32}
    (model / "config.json").write_text(json.dumps(config))
    result = launch(tmp_path, {"python": "/usr/bin/python3", "model_path": str(model)}, "--dry-run")
    assert result.returncode == 2 and "set architecture: deepseek, llama or qwen2" in result.stderr, result.stderr


def test_refusals_name_the_setting_and_the_fix(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"python": "python3"}, "not an absolute path"),
        ({"disable_radix_cache": False}, "set disable_radix_cache: true"),
        ({"layer_ids": [2, 30, 60]}, "outside 0..59"),
        ({"extra_args": ["--cuda-graph-backend-prefill=breakable"]}, "nothing would be dumped"),
        ({"num_hidden_layers": None, "model_path": "/nowhere"}, "set num_hidden_layers"),
        ({"tp_sise": 8}, "tp_sise"),
    ]
    for override, message in cases:
        result = launch(tmp_path, {**KIMI, **override}, "--dry-run")
        assert result.returncode == 2 and message in result.stderr, (override, result.stderr)
        assert "Traceback" not in result.stderr


def test_exec_runs_the_given_interpreter_and_refuses_a_busy_port(tmp_path: Path) -> None:
    recorder = tmp_path / "ml-env-python"
    recorder.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv.txt"}\n')
    recorder.chmod(0o755)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {**KIMI, "python": str(recorder), "port": port, "dump_dir": str(tmp_path / "dumps")}
    result = launch(tmp_path, config)
    assert result.returncode == 0, result.stderr
    recorded = (tmp_path / "argv.txt").read_text()
    assert recorded.startswith("-m sglang.launch_server --model-path /models/Kimi-K2.5")
    # the dump root is created as the server's DumpSink creates it: mode 0700 (README: untrusted dump directory)
    assert stat.S_IMODE((tmp_path / "dumps").stat().st_mode) == 0o700
    # and an existing one others can write is refused before SGLang starts, as the hook would refuse it
    open_dumps = tmp_path / "open-dumps"
    open_dumps.mkdir()
    open_dumps.chmod(0o777)
    refused = launch(tmp_path, {**config, "dump_dir": str(open_dumps)})
    assert refused.returncode == 2 and "UnsafeDumpDirError" in refused.stderr and str(open_dumps) in refused.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        result = launch(tmp_path, config)
    assert result.returncode == 2 and f"fuser -k {port}/tcp" in result.stderr


def test_generate_profile_keeps_the_radix_cache_and_has_no_hook(tmp_path: Path, model_dir) -> None:
    model = model_dir("llama")
    config = SGLangLaunchConfig(profile="generate", model_path=str(model), python="/opt/ml-env/bin/python")
    argv = build_command(config)
    for flag in ("--disable-radix-cache", "--forward-hooks", "--enable-return-aux-hidden-states",
                 "--speculative-algorithm", "--disable-prefill-cuda-graph"):  # fmt: skip
        assert flag not in argv, flag
    assert argv[argv.index("--model-path") + 1] == str(model)
    assert "--disable-radix-cache" in build_command(config.model_copy(update={"disable_radix_cache": True}))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"layer_ids": [1, 2, 3]}, "layer_ids is set with profile generate"),
        ({"final_prenorm": True}, "final_prenorm is set with profile generate"),
        ({"storage": "float8_e4m3fn"}, "storage is set with profile generate"),
        ({"extra_args": ["--forward-hooks=[]"]}, "profile generate dumps nothing"),
        ({"extra_args": ["--disable-radix-cache"]}, "use the config key disable_radix_cache"),
    ],
)
def test_generate_profile_refuses_what_only_extraction_uses(model_dir, override: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"profile": "generate", "model_path": str(model_dir("llama")), **override}
    with pytest.raises(ConfigError, match=message):
        build_command(SGLangLaunchConfig(**settings))  # type: ignore[arg-type]


def test_extract_profile_still_refuses_the_radix_cache(model_dir) -> None:
    config = SGLangLaunchConfig(model_path=str(model_dir("llama")), disable_radix_cache=False)
    with pytest.raises(ConfigError, match="disable_radix_cache is false"):
        build_command(config)
    assert "--disable-radix-cache" in build_command(config.model_copy(update={"disable_radix_cache": None}))
