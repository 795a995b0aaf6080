"""FP8 storage end to end with the real embedded server: a speculators FP8 output of the same rows as a
bf16 one differs from it by FP8's own rounding only, takes about half the bytes, says what it is in
data_config.json, passes verify (which catches a bad scale); what cannot mix is refused with nothing
written: FP8 with specforge, a resume in the other storage, a merge of both storages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hsextract.cli import main
from hsextract.contract.files.fp8 import FP8_STORAGE, max_error_over_amax, relative_frobenius_error
from hsextract.dev.sample_data import make_sample_data
from hsextract.errors import ConfigError, IdentityMismatchError, MergeError
from hsextract.extract.config import ExtractConfig
from hsextract.output.checksum import file_checksum
from hsextract.output.formats import open_format
from hsextract.output.merge import merge_outputs
from hsextract.output.verify import verify_output

from .helpers import run_extraction

FP8 = {"format": "speculators", "storage": FP8_STORAGE, "concurrency": 2, "max_seq_len": 64}
BF16 = {"format": "speculators", "concurrency": 2, "max_seq_len": 64}
#: e4m3 keeps 3 mantissa bits: an element's rounding error is at most 2**-4 of its token's amax
FP8_ROUNDING = 2.0**-4


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def server(model_dir, start_server):
    return start_server(model_dir("llama", "bfloat16"))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return make_sample_data(tmp_path / "data.jsonl", num=8, vocab_size=1024, seed=5, max_len=60)


def test_fp8_output_is_the_bf16_output_within_fp8_rounding_at_half_the_bytes(server, dataset: Path, tmp_path: Path) -> None:
    bf16_out, fp8_out = tmp_path / "bf16", tmp_path / "fp8"
    assert run_extraction(server.url, dataset, bf16_out, None, **BF16).status == "complete"
    summary = run_extraction(server.url, dataset, fp8_out, None, **FP8)
    assert summary.status == "complete" and summary.total_samples == 8
    assert any("--hidden-states-backend fp8" in line for line in summary.hints), summary.hints
    bf16_fmt, fp8_fmt = open_format("speculators", bf16_out), open_format("speculators", fp8_out)
    worst = 0.0
    for row in range(8):
        tensors = load_file(str(fp8_fmt.sample_path(row)))
        assert set(tensors) == {"token_ids", "hidden_states", "hidden_states_scales"}
        assert tensors["hidden_states"].dtype == torch.float8_e4m3fn and tensors["hidden_states_scales"].dtype == torch.float32
        tokens = tensors["token_ids"].shape[0]
        assert tensors["hidden_states_scales"].shape == (tokens, 1, 1)
        reference = load_file(str(bf16_fmt.sample_path(row)))
        assert torch.equal(reference["token_ids"], tensors["token_ids"])
        restored = tensors["hidden_states"].float() * tensors["hidden_states_scales"]
        per_element = max_error_over_amax(restored, reference["hidden_states"])
        frobenius = relative_frobenius_error(restored, reference["hidden_states"])
        assert per_element.max <= FP8_ROUNDING, (row, per_element)
        assert frobenius.max <= FP8_ROUNDING, (row, frobenius)
        worst = max(worst, frobenius.max)
        stored = fp8_fmt.read_sample(row)
        aux, final = stored.dequantized(torch.float32)
        assert torch.equal(torch.cat([aux, final.unsqueeze(1)], dim=1), restored)
    assert worst > 0  # really quantized
    sizes = [sum(p.stat().st_size for p in fmt.sample_files()) for fmt in (bf16_fmt, fp8_fmt)]
    assert 0.45 < sizes[1] / sizes[0] < 0.6, sizes  # (K+1)H + 4 bytes a token against 2 (K+1)H, plus headers
    config = json.loads((fp8_out / "data_config.json").read_text())
    assert config["dtype"] == FP8_STORAGE and config["computed_dtype"] == "bfloat16"
    assert config["quantization"]["scheme"] == "per-token amax/448, hs-connectors 0.9.0 layout"
    assert config["quantization"]["scales_key"] == "hidden_states_scales" and config["quantization"]["final_slot"] == "prenorm"
    assert config["trainer"]["flags"]["--hidden-states-backend"] == "fp8"
    plain = json.loads((bf16_out / "data_config.json").read_text())
    assert "quantization" not in plain and "--hidden-states-backend" not in plain["trainer"]["flags"]
    identity = json.loads((fp8_out / "identity.json").read_text())
    assert identity["stored_dtype"] == FP8_STORAGE
    report = verify_output(fp8_out)
    assert report.ok, report.summary()

    # a zero scale (the file's checksum rewritten too, so only the scale is wrong) is caught
    path = fp8_fmt.sample_path(3)
    tensors = load_file(str(path))
    tensors["hidden_states_scales"][1] = 0.0
    save_file(tensors, str(path))
    records = [json.loads(line) for line in (fp8_out / "samples.jsonl").read_text().splitlines()]
    for record in records:
        if record["row"] == 3:
            record.update(bytes=path.stat().st_size, checksum=file_checksum(path))
    (fp8_out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = verify_output(fp8_out)
    assert not report.ok and any("row 3: 1 hidden_states_scales not finite and positive (token 1" in p for p in report.problems)


def test_fp8_with_specforge_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError, match="SpecForge has no FP8 reader: use --format speculators with --storage float8_e4m3fn"):
        ExtractConfig(dataset=tmp_path / "d.jsonl", output=tmp_path / "out", format="specforge", storage=FP8_STORAGE)
    code = main(["extract", "--dataset", str(tmp_path / "d.jsonl"), "--output", str(tmp_path / "out"), "--storage", FP8_STORAGE])
    assert code != 0 and "SpecForge has no FP8 reader" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("first", "then"), [(FP8, BF16), (BF16, FP8)])
def test_a_resume_in_the_other_storage_is_refused_with_nothing_written(
    server, dataset: Path, tmp_path: Path, first, then
) -> None:
    out = tmp_path / "out"
    assert run_extraction(server.url, dataset, out, **first).status == "complete"
    before = _tree(out)
    with pytest.raises(IdentityMismatchError, match="FP8 and unquantized rows never share an output") as caught:
        run_extraction(server.url, dataset, out, **then)
    assert FP8_STORAGE in str(caught.value) and "bfloat16" in str(caught.value)
    assert _tree(out) == before


def test_a_merge_of_fp8_and_bf16_shards_is_refused_with_nothing_written(server, dataset: Path, tmp_path: Path) -> None:
    shards = []
    for index, settings in enumerate((FP8, BF16)):
        out = tmp_path / f"shard{index}"
        assert run_extraction(server.url, dataset, out, None, shard_index=index, num_shards=2, **settings).status == "complete"
        shards.append(out)
    with pytest.raises(MergeError, match="FP8 and unquantized shards never merge") as caught:
        merge_outputs(shards, tmp_path / "merged")
    assert FP8_STORAGE in str(caught.value) and "bfloat16" in str(caught.value)
    assert not (tmp_path / "merged").exists() and os.listdir(tmp_path / "shard0" / "hidden_states") != []
