"""Two shards merged with ``hsextract merge``, read by the trainers' own released loaders: every row of both
shards in one output, as one unsharded run would give it (speculators' ArrowDataset and multipack loader,
SpecForge's offline reader)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hs_connectors import FileTransfer
from speculators.train.data import ArrowDataset
from speculators.train.recovery import SampleUnavailable

from hsextract.dev.tiny_model import make_tiny_model
from hsextract.output.formats import open_format
from hsextract.output.merge import merge_outputs
from hsextract.output.verify import verify_output

from ..helpers import RunningServer, run_extraction
from .helpers import BAD_ROW, MAX_SEQ_LEN, ROWS, VOCAB, Output, add_checkpoint_index, load_all, write_dataset


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("merged")
    model = make_tiny_model(root / "model", arch="llama", layers=8, hidden=64, vocab_size=VOCAB)
    add_checkpoint_index(model)
    dataset = write_dataset(root / "data.jsonl")
    server = RunningServer.start(model, root / "dumps")
    made: dict[str, Output] = {}
    try:
        for fmt in ("specforge", "speculators"):
            shards = []
            for index in range(2):
                summary = run_extraction(
                    server.url, dataset, root / f"{fmt}-{index}", format=fmt, max_seq_len=MAX_SEQ_LEN,
                    shard_index=index, num_shards=2,
                )  # fmt: skip
                assert summary.status == "complete"
                shards.append(summary.output)
            merge_outputs(shards, root / f"{fmt}-merged")
            made[fmt] = Output("llama", fmt, model, root / f"{fmt}-merged")
    finally:
        server.stop()
    return made


def test_merged_outputs_verify(merged) -> None:
    for out in merged.values():
        assert verify_output(out.path).ok
        assert sorted(out.written_rows) == [r for r in range(len(ROWS)) if r != BAD_ROW]


def test_speculators_reads_every_row_of_both_shards(merged) -> None:
    out = merged["speculators"]
    flags = out.config["trainer"]["flags"]
    assert flags["--total-seq-len"] >= out.config["longest_sample_tokens"]
    dataset = ArrowDataset(
        max_len=flags["--total-seq-len"],
        datapath=str(out.path / flags["--data-path"]),
        transfer=FileTransfer(out.path / flags["--hidden-states-path"]),
        on_missing=flags["--on-missing"],
    )
    assert len(dataset) == len(ROWS)
    fmt = open_format("speculators", out.path)
    for row in range(len(ROWS)):
        item = dataset[row]
        if row == BAD_ROW:
            assert isinstance(item, SampleUnavailable)
            continue
        stored = fmt.read_sample(row)
        assert torch.equal(item["input_ids"], stored.input_ids)
        assert torch.equal(item["verifier_last_hidden_states"], stored.final_hidden_state)


def test_specforge_reads_every_row_of_both_shards(merged) -> None:
    out = merged["specforge"]
    max_length = out.config["trainer"]["config"]["data"]["max_length"]
    batches = load_all(out, max_length)
    assert sorted(rows[0] for rows, _ in batches) == sorted(out.written_rows)
    fmt = open_format("specforge", out.path)
    for rows, batch in batches:
        assert torch.equal(batch["input_ids"][0], fmt.read_sample(rows[0]).input_ids)


def test_the_merged_trainer_length_covers_the_longest_sample_of_any_shard(merged) -> None:
    for out in merged.values():
        per_shard = [Path(p["path"]) for p in out.config["merged_from"]]
        assert len(per_shard) == 2
        assert out.config["longest_sample_tokens"] == max(
            open_format(out.format, out.path).read_sample(r).input_ids.shape[0] for r in out.written_rows
        )


def test_the_merged_token_freq_sums_the_shards_and_equals_speculators_count_of_the_merged_rows(merged, tmp_path) -> None:
    from datasets import load_from_disk
    from speculators.train.vocab_mapping import combine_token_frequency_distributions, save_token_frequency_distribution

    out = merged["speculators"]
    shard_files = [Path(p["path"]) / "data" / "token_freq.pt" for p in out.config["merged_from"]]
    combine_token_frequency_distributions(shard_files, tmp_path / "combined.pt")
    save_token_frequency_distribution(load_from_disk(str(out.path / "data")), tmp_path / "recounted.pt")
    ours = torch.load(out.path / "data" / "token_freq.pt", weights_only=True)
    assert ours == torch.load(tmp_path / "combined.pt", weights_only=True)
    assert ours == torch.load(tmp_path / "recounted.pt", weights_only=True)
