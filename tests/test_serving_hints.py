"""Train and serve on the same layers: data_config.json's serving values, draft-config / check-draft,
and the guards that refuse what a trainer would fail on later (real embedded server, real files)."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hsextract.dev.sample_data import make_sample_data
from hsextract.errors import ConfigError
from hsextract.output.formats import open_format

from .helpers import run_extraction


def hsextract(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hsextract", *map(str, args)], capture_output=True, text=True, timeout=120)


def drafter_config(path: Path, **fields: object) -> Path:
    """A drafter config.json as SpecForge writes one (LlamaForCausalLMEagle3), with the given fields."""
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64, "num_hidden_layers": 1, **fields}
    path.write_text(json.dumps(config))
    return path


def rows_of_lengths(path: Path, lengths: list[int], vocab_size: int = 1024) -> Path:
    rng = random.Random(1)
    with open(path, "w") as handle:
        for length in lengths:
            handle.write(json.dumps({"input_ids": [rng.randrange(vocab_size) for _ in range(length)]}) + "\n")
    return path


@pytest.mark.parametrize("arch", ["llama", "deepseek_v3"])
def test_default_output_is_served_by_the_trainers_default_drafter(model_dir, start_server, tmp_path: Path, arch: str) -> None:
    server = start_server(model_dir(arch))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=3, vocab_size=1024, seed=2, max_len=150)
    out = tmp_path / "out"
    summary = run_extraction(server.url, dataset, out)
    config = json.loads((out / "data_config.json").read_text())
    family = {"llama": "llama", "deepseek_v3": "deepseek"}[arch]
    assert config["model"]["family"] == family
    serving = config["serving"]
    # the default [1, N//2-1, N-4] is served with its own ids in every family: SpecForge's default value
    assert serving["eagle_aux_hidden_state_layer_ids"] == config["aux_layer_ids"] == [1, 3, 4]
    assert serving["layers_to_capture"] == [2, 4, 5] and serving["sglang_version"] == "0.5.23"
    assert serving["draft_config"] == {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "use_aux_hidden_state": True}
    }
    trainer = config["trainer"]
    assert trainer["name"] == "specforge" and trainer["config"]["model"]["aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert trainer["config"]["data"] == {"hidden_states_path": ".", "max_length": 2048}
    assert any("eagle_aux_hidden_state_layer_ids [1, 3, 4]" in line for line in summary.hints)
    assert f"  specforge train --config {out.resolve() / 'specforge_train.yaml'}" in summary.hints
    assert f"hidden_states_path: {out.resolve()}" in (out / "specforge_train.yaml").read_text()

    printed = hsextract("draft-config", out)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    # a drafter config without ids: SGLang captures its default, the states the output holds
    plain = hsextract("check-draft", out, "--draft-config", drafter_config(tmp_path / "plain.json"))
    assert plain.returncode == 0 and plain.stdout.startswith("OK"), plain.stderr
    # the "layer entered" numbering (vLLM, speculators' --target-layer-ids) as a drafter value
    entered = drafter_config(tmp_path / "entered.json", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    result = hsextract("check-draft", out, "--draft-config", entered)
    if family == "llama":  # llama adds one to every id: one layer off
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith("DraftMismatch: ")
        assert "serves the drafter hidden_states[3, 5, 6] (layer outputs [2, 4, 5])" in result.stderr
        assert "holds hidden_states[2, 4, 5] (layer outputs [1, 3, 4])" in result.stderr
    else:  # DeepSeek takes ids not starting with 1 as capture indices: the same states
        assert result.returncode == 0, result.stderr


def test_explicit_layers_on_deepseek_need_the_family_arithmetic(model_dir, start_server, tmp_path: Path) -> None:
    # the reference Kimi run's kind of choice, one layer later than the default
    server = start_server(model_dir("deepseek_v3"), layer_ids=[2, 4, 5])
    dataset = make_sample_data(tmp_path / "data.jsonl", num=2, vocab_size=1024, seed=3, max_len=100)
    out = tmp_path / "out"
    run_extraction(server.url, dataset, out, layer_ids=[2, 4, 5])
    config = json.loads((out / "data_config.json").read_text())
    assert config["serving"]["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]  # DeepSeek: ids as given unless first is 1
    assert config["trainer"]["config"]["model"]["aux_hidden_state_layer_ids"] == [3, 5, 6]

    default_drafter = drafter_config(tmp_path / "draft.json")  # a trainer's default: no ids
    naive = drafter_config(tmp_path / "naive.json", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 5]})
    for drafter in (default_drafter, naive):
        result = hsextract("check-draft", out, "--draft-config", drafter)
        assert result.returncode == 1, result.stdout
        assert "serves the drafter hidden_states[2, 4, 5]" in result.stderr
        assert "holds hidden_states[3, 5, 6] (layer outputs [2, 4, 5])" in result.stderr
        assert "set eagle_config.eagle_aux_hidden_state_layer_ids to [3, 5, 6]" in result.stderr

    before = json.loads(default_drafter.read_text())
    written = hsextract("draft-config", out, "--write", default_drafter)
    assert written.returncode == 0, written.stderr
    after = json.loads(default_drafter.read_text())
    assert after["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [3, 5, 6]
    assert {k: v for k, v in after.items() if k != "eagle_config"} == before  # the rest of the config is kept
    assert hsextract("check-draft", out, "--draft-config", default_drafter).returncode == 0


def test_inexpressible_layers_are_refused_before_any_work(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"), layer_ids=[0, 3, 4])
    dataset = make_sample_data(tmp_path / "data.jsonl", num=1, vocab_size=1024)
    with pytest.raises(ConfigError, match=r"no eagle_aux_hidden_state_layer_ids value makes SGLang 0\.5\.23 \(deepseek\)"):
        run_extraction(server.url, dataset, tmp_path / "out", layer_ids=[0, 3, 4])
    assert not (tmp_path / "out").exists() and list(server.dump_dir.iterdir()) == []


def test_specforge_refuses_other_than_three_aux_layers_before_any_work(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("llama"), layer_ids=[1, 2, 3, 4])
    dataset = make_sample_data(tmp_path / "data.jsonl", num=1, vocab_size=1024)
    with pytest.raises(ConfigError, match=r"format specforge with 4 aux layers \[1, 2, 3, 4\].*--format speculators"):
        run_extraction(server.url, dataset, tmp_path / "out", layer_ids=[1, 2, 3, 4])
    assert not (tmp_path / "out").exists() and list(server.dump_dir.iterdir()) == []


def test_float32_states_are_stored_as_bfloat16_for_specforge_and_recorded(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("llama", "float32"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=2, vocab_size=1024, seed=5, max_len=80)
    run_extraction(server.url, dataset, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["computed_dtype"] == "float32"
    assert config["dtype_conversion"].startswith("float32 -> bfloat16 at packing")
    record = torch.load(tmp_path / "out" / "rows_0-2000" / "data_0.ckpt", weights_only=True)
    assert record["hidden_state"].dtype == record["aux_hidden_state"].dtype == torch.bfloat16
    assert hsextract("verify", tmp_path / "out").returncode == 0
    # an output an older version wrote as float32 (no identity.json then) is not resumed into with bfloat16 files
    config["dtype"] = "float32"
    del config["computed_dtype"]
    (tmp_path / "out" / "data_config.json").write_text(json.dumps(config))
    (tmp_path / "out" / "identity.json").unlink()
    with pytest.raises(ConfigError, match="with stored dtype 'float32' \\(this run: 'bfloat16'\\)"):
        run_extraction(server.url, dataset, tmp_path / "out")


def test_plan_counts_truncation_against_max_seq_len_and_the_trainers_default(
    model_dir, start_server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_server(model_dir("llama", "bfloat16"))
    dataset = rows_of_lengths(tmp_path / "data.jsonl", [40, 2100, 3000])
    caplog.set_level(logging.INFO, logger="hsextract")
    summary = run_extraction(server.url, dataset, tmp_path / "out", max_seq_len=2500)
    plan = "\n".join(r.getMessage() for r in caplog.records if r.getMessage().startswith("plan:"))
    assert "1 of them longer than max_seq_len 2500 (truncated and counted); the longest sample will have 2500 tokens" in plan
    assert "2 samples are longer than specforge's default data.max_length 2048" in plan
    assert "train with data.max_length 2500" in plan
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert summary.truncated == config["truncated_samples"] == 1
    assert config["longest_sample_tokens"] == 2500 and config["trainer"]["config"]["data"]["max_length"] == 2500
    assert open_format("specforge", tmp_path / "out").read_sample(2).input_ids.shape == (2500,)


def test_an_interrupted_run_hints_the_length_of_the_longest_planned_sample(model_dir, start_server, tmp_path: Path) -> None:
    """Stopped after the short row: the trainer hint already fits the long rows not written yet."""
    import threading
    import time

    from hsextract.extract.config import ExtractConfig
    from hsextract.extract.run import Extraction

    server = start_server(model_dir("llama", "bfloat16"))
    dataset = rows_of_lengths(tmp_path / "data.jsonl", [40, 2100, 2300, 2300])
    output = tmp_path / "out"
    config = ExtractConfig(server=server.url, dataset=dataset, output=output, concurrency=1, sort_window=1, health_timeout_s=30)
    extraction = Extraction(config)

    def stop_after_the_first_row() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            samples = output / "samples.jsonl"
            if samples.exists() and samples.read_text().strip():
                extraction.request_stop("test")
                return
            time.sleep(0.005)

    stopper = threading.Thread(target=stop_after_the_first_row)
    stopper.start()
    summary = extraction.run()
    stopper.join()
    assert summary.status == "interrupted" and summary.total_samples < 4
    data_config = json.loads((output / "data_config.json").read_text())
    assert data_config["trainer"]["config"]["data"]["max_length"] == 2300
    assert not any("max_length=2048" in line for line in summary.hints), summary.hints


def test_speculators_flags(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("qwen2"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=2, vocab_size=1024, seed=6, max_len=60)
    summary = run_extraction(server.url, dataset, tmp_path / "out", format="speculators")
    config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert config["serving"]["model_family"] == "qwen2" and config["serving"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    flags = config["trainer"]["flags"]
    assert flags == {
        "--data-path": "data",
        "--hidden-states-path": "hidden_states",
        "--on-missing": "skip",
        "--total-seq-len": 8192,
        "--target-layer-ids": [2, 4, 5],  # speculators numbers the layer entered
    }
    line = summary.hints[summary.hints.index("train with speculators 0.9.0:") + 1]
    assert f"--hidden-states-path {(tmp_path / 'out' / 'hidden_states').resolve()}" in line
    assert "--target-layer-ids 2 4 5" in line
