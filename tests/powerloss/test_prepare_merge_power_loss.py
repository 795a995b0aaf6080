"""A power cut right after ``hsextract prepare`` (both conventions) and ``hsextract merge``, on a
filesystem that drops what was not synced, with and without the small files written back first: the same
command again ends with the output whole (the prepared dataset loads with every row; the merged output
passes ``verify`` with every row once)."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from hsextract.dev.sample_data import make_sample_conversations
from hsextract.dev.tokenizer import write_tokenizer
from hsextract.output.merge import merge_outputs
from hsextract.output.verify import verify_output
from hsextract.prepare.config import PrepareConfig
from hsextract.prepare.run import run_prepare

from ..faults.helpers import make_rows, run_extract, write_rows
from .helpers import LossyMount

BOOKKEEPING_BYTES = 8192


def _rows(path: Path) -> list[dict[str, list[int]]]:
    loaded = datasets.load_from_disk(str(path))
    return [{"input_ids": list(r["input_ids"]), "loss_mask": list(r["loss_mask"])} for r in loaded]


@pytest.mark.parametrize("small_files_first", [False, True], ids=["cut", "bookkeeping_first"])
@pytest.mark.parametrize("like", ["specforge", "speculators"])
def test_prepare_again_after_a_cut(lossy: LossyMount, tmp_path: Path, like: str, small_files_first: bool) -> None:
    model = write_tokenizer(tmp_path / "tok", "chatml", 1024)
    source = make_sample_conversations(tmp_path / "conversations.jsonl", 40, 2)

    def prepare(output: Path) -> None:
        run_prepare(PrepareConfig(model=model, dataset=source, output=output, like=like, progress=False, chunk_rows=8,
                                  specforge_template="qwen" if like == "specforge" else None))  # fmt: skip

    prepare(tmp_path / "reference")
    output = lossy.path / "prepared"
    prepare(output)
    if small_files_first:
        lossy.persist(BOOKKEEPING_BYTES)
    lossy.cut()
    assert _rows(output) == _rows(tmp_path / "reference")  # a prepare that said it was done left it all on the disk
    prepare(output)  # the same command: nothing else asked of the user
    assert _rows(output) == _rows(tmp_path / "reference")
    provenance = json.loads((output / "prepare.json").read_text())
    assert provenance["counts"] == json.loads((tmp_path / "reference" / "prepare.json").read_text())["counts"]


@pytest.mark.parametrize("small_files_first", [False, True], ids=["cut", "bookkeeping_first"])
def test_merge_again_after_a_cut(  # type: ignore[no-untyped-def]
    models, server_process, lossy: LossyMount, tmp_path: Path, small_files_first: bool
) -> None:
    server = server_process(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(16, seed=41))
    shards = [tmp_path / f"shard{i}" for i in range(2)]
    for index, shard in enumerate(shards):
        done = run_extract(server.url, dataset, shard, "--shard-index", str(index), "--num-shards", "2")
        assert done.returncode == 0, done.stderr
    merged = lossy.path / "merged"
    merge_outputs(shards, merged, copy=True)  # another filesystem: copies
    if small_files_first:
        lossy.persist(BOOKKEEPING_BYTES)
    lossy.cut()
    assert verify_output(merged).ok  # a merge that said it was done left it all on the disk
    merge_outputs(shards, merged, copy=True)
    report = verify_output(merged)
    assert report.ok, report.summary()
    rows = [json.loads(line)["row"] for line in (merged / "samples.jsonl").read_text().splitlines()]
    assert rows == list(range(16))
