"""``hsextract merge`` on real sharded outputs of the embedded server: both formats, refusals, resume."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import datasets
import pytest
import torch

from hsextract.cli import main
from hsextract.dev.sample_data import make_sample_data
from hsextract.errors import MergeError
from hsextract.output.formats import open_format
from hsextract.output.merge import MERGE_MARKER, merge_outputs
from hsextract.output.verify import verify_output

from .helpers import run_extraction

ROWS = 11


def _dataset(tmp_path: Path) -> Path:
    path = make_sample_data(tmp_path / "data.jsonl", num=ROWS, vocab_size=1024, max_len=60)
    lines = path.read_text().splitlines()
    lines[4] = '{"input_ids": []}'  # a bad-input row (shard 0 of 2) that must stay counted
    path.write_text("\n".join(lines) + "\n")
    return path


def _shards(server, dataset: Path, root: Path, fmt: str, num_shards: int = 2) -> list[Path]:
    outs = []
    for index in range(num_shards):
        out = root / f"{fmt}-shard{index}"
        summary = run_extraction(
            server.url, dataset, out, format=fmt, shard_index=index, num_shards=num_shards, concurrency=1, max_seq_len=48
        )
        assert summary.status == "complete"
        outs.append(out)
    return outs


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_merge_equals_one_unsharded_run(model_dir, start_server, tmp_path: Path, fmt: str) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = _dataset(tmp_path)
    shards = _shards(server, dataset, tmp_path, fmt)
    whole = tmp_path / f"{fmt}-whole"
    run_extraction(server.url, dataset, whole, format=fmt, concurrency=1, max_seq_len=48)
    merged = tmp_path / f"{fmt}-merged"

    assert main(["merge", *map(str, shards), "--into", str(merged)]) == 0

    assert verify_output(merged).ok, verify_output(merged).summary()
    config = json.loads((merged / "data_config.json").read_text())
    reference = json.loads((whole / "data_config.json").read_text())
    for key in (
        "total_samples",
        "total_tokens",
        "truncated_samples",
        "truncated_tokens",
        "bad_input_samples",
        "error_counts",
        "longest_sample_tokens",
        "trainer",
        "serving",
    ):
        assert config[key] == reference[key], key
    assert config["rows_in_shard"] == ROWS and (config["shard_index"], config["num_shards"]) == (0, 1)
    assert config["total_samples"] == ROWS - 1 and config["bad_input_samples"] == 1
    assert [p["shard_index"] for p in config["merged_from"]] == [0, 1]
    for entry, shard in zip(config["merged_from"], shards, strict=True):
        shard_config = json.loads((shard / "data_config.json").read_text())
        assert entry["path"] == str(shard.resolve())
        assert entry["total_samples"] == shard_config["total_samples"]
        assert entry["created_at"] == shard_config["created_at"]
    assert config["merge_files"] == {"hard_linked": ROWS - 1, "copied": 0}
    assert [r["row"] for r in _jsonl(merged / "samples.jsonl")] == [r["row"] for r in _jsonl(whole / "samples.jsonl")]
    assert [r["row"] for r in _jsonl(merged / "errors.jsonl")] == [4]

    # The samples read back with the format's reader equal the unsharded run's, row by row; the files are links.
    got, want = open_format(fmt, merged), open_format(fmt, whole)
    for row in range(ROWS):
        if row == 4:
            assert not got.sample_path(row).exists()
            continue
        a, b = got.read_sample(row), want.read_sample(row)
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.allclose(a.aux_hidden_states, b.aux_hidden_states) and torch.allclose(
            a.final_hidden_state, b.final_hidden_state
        )
        shard_file = open_format(fmt, shards[row % 2]).sample_path(row)
        assert os.path.samefile(got.sample_path(row), shard_file)

    if fmt == "speculators":  # one Arrow dataset with every row, as the trainer reads it
        data, ref = datasets.load_from_disk(str(merged / "data")), datasets.load_from_disk(str(whole / "data"))
        assert len(data) == len(ref) == ROWS
        assert list(data.with_format(None)["written"]) == list(ref.with_format(None)["written"])
        for row in range(ROWS):
            assert torch.equal(data[row]["input_ids"], ref[row]["input_ids"])
            assert torch.equal(data[row]["loss_mask"], ref[row]["loss_mask"])
            assert int(data[row]["seq_len"]) == int(ref[row]["seq_len"])
        # the draft vocabulary: the shards' counts summed are the unsharded run's
        merged_freq = torch.load(merged / "data" / "token_freq.pt", weights_only=True)
        assert merged_freq == torch.load(whole / "data" / "token_freq.pt", weights_only=True) and merged_freq
    else:  # SpecForge's loader: torch.load of each listed file
        for record in _jsonl(merged / "samples.jsonl"):
            loaded = torch.load(merged / record["file"], weights_only=True)
            assert loaded["input_ids"].shape[0] == record["num_tokens"]


def test_merge_copies_when_asked_and_resumes_after_a_kill(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    shards = _shards(server, _dataset(tmp_path), tmp_path, "speculators")
    merged = tmp_path / "merged"
    merge_outputs(shards, merged, copy=True)
    assert verify_output(merged).ok
    config = json.loads((merged / "data_config.json").read_text())
    assert config["merge_files"] == {"hard_linked": 0, "copied": ROWS - 1}
    one = open_format("speculators", merged).sample_path(0)
    assert not os.path.samefile(one, open_format("speculators", shards[0]).sample_path(0))

    # A merge killed half-way: no data_config.json, the marker, a temp file, some samples missing.
    (merged / "data_config.json").unlink()
    (merged / MERGE_MARKER).write_text("[]\n")
    one.unlink()
    (one.parent / f".{one.name}.tmp-123-456").write_bytes(b"partial")
    shutil.rmtree(merged / "data")
    assert not verify_output_ok(merged)
    summary = merge_outputs(shards, merged, copy=True)
    assert (summary.copied, summary.already_present) == (1, ROWS - 2)
    assert verify_output(merged).ok
    assert not (merged / MERGE_MARKER).exists()

    # A shard's file replaced since (re-extracted: a new file, a newer time): the next merge takes the new one.
    source = open_format("speculators", shards[0]).sample_path(0)
    replacement = source.with_name(".replacement")
    replacement.write_bytes(source.read_bytes()[::-1])
    os.replace(replacement, source)
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 10))
    again = merge_outputs(shards, merged, copy=True)
    assert (again.copied, again.already_present) == (1, ROWS - 2)
    assert one.read_bytes() == source.read_bytes()


def verify_output_ok(path: Path) -> bool:
    try:
        return verify_output(path).ok
    except Exception:
        return False


def test_refusals_name_the_shard_and_the_fix(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = _dataset(tmp_path)
    shards = _shards(server, dataset, tmp_path, "specforge")
    into = tmp_path / "merged"

    with pytest.raises(MergeError, match=r"shard\(s\) 1 of 2 are not given"):
        merge_outputs(shards[:1], into)
    with pytest.raises(MergeError, match="both shard 0 of 2: they overlap"):
        copy = tmp_path / "copy-of-0"
        shutil.copytree(shards[0], copy)
        merge_outputs([shards[0], copy, shards[1]], into)

    other = _shards(server, dataset, tmp_path / "other", "speculators")
    with pytest.raises(MergeError, match=r"has format='speculators' but .* has format='specforge'"):
        merge_outputs([shards[0], other[1]], into)

    longer = run_extraction(
        server.url, dataset, tmp_path / "long1", format="specforge", shard_index=1, num_shards=2, concurrency=1, max_seq_len=32
    )
    with pytest.raises(MergeError, match=r"max_seq_len=32 .* max_seq_len=48"):
        merge_outputs([shards[0], longer.output], into)

    # A shard whose run was interrupted: its unfinished rows would be missing.
    config_path = shards[1] / "data_config.json"
    saved = config_path.read_text()
    config_path.write_text(saved.replace('"status": "complete"', '"status": "interrupted"'))
    with pytest.raises(MergeError, match=r"shard 1/2 .* is 'interrupted'.*--shard-index 1 --num-shards 2"):
        merge_outputs(shards, into)
    config_path.write_text(saved)

    # A row lost from a shard's manifest: rows missing, not silently merged.
    samples = shards[1] / "samples.jsonl"
    lines = samples.read_text().splitlines()
    samples.write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(MergeError, match="settled 4 of its 5 rows"):
        merge_outputs(shards, into)
    samples.write_text("\n".join(lines) + "\n")

    # A shard made of another dataset (one row more) is caught by the dataset fingerprint the outputs record
    # (older outputs without one: by the slice sizes).
    bigger = tmp_path / "bigger.jsonl"
    bigger.write_text(dataset.read_text() + "\n".join(dataset.read_text().splitlines()[:3]) + "\n")  # 14 rows
    other_data = run_extraction(
        server.url, bigger, tmp_path / "bigger1", format="specforge", shard_index=1, num_shards=2, concurrency=1, max_seq_len=48
    )
    with pytest.raises(MergeError, match=r"was extracted from another dataset \(dataset_fingerprint"):
        merge_outputs([shards[0], other_data.output], into)

    # A target that holds something else is refused; nothing was written by any refusal.
    assert not into.exists()
    with pytest.raises(MergeError, match="overlaps shard output"):
        merge_outputs(shards, shards[0] / "merged")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["merge", *map(str, shards), "--into", str(foreign)]) == 2
