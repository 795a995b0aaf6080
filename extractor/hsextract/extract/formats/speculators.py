"""vllm-project/speculators' offline layout.

``<out>/hidden_states/hs_<row>.safetensors`` with ``token_ids [T]`` int64 and ``hidden_states
[T, K+1, H]``: the aux layers, then the last decoder layer's output *before* the final norm
(speculators' trainer applies the verifier's norm itself: ``lm_head(norm(h))``). ``<out>/data/``
is a ``datasets`` Arrow dataset (torch format) with ``input_ids``, ``loss_mask``, ``seq_len``;
its index i is dataset row i, the number of ``hs_<i>``, so rows this output does not hold
(bad input, other shards) are entries with ``written`` false, ``seq_len`` 0 and no file. Train
with ``--data-path <out>/data --hidden-states-path <out>/hidden_states --on-missing skip``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hsextract.contract.atomic import remove_quietly, temp_path
from hsextract.contract.dumps import Dump
from hsextract.contract.states import ErrorReason
from hsextract.errors import DumpError
from hsextract.extract.checksum import WrittenFile, file_checksum
from hsextract.extract.dataset import Sample
from hsextract.extract.formats.base import OutputFormat, StoredSample


class SpeculatorsFormat(OutputFormat):
    name = "speculators"
    final_norm_applied = False
    needs_final_prenorm = True
    sample_glob = "hidden_states/hs_*.safetensors"

    def sample_path(self, row: int) -> Path:
        return self.root / "hidden_states" / f"hs_{row}.safetensors"

    def write_sample(self, sample: Sample, dump: Dump) -> WrittenFile:
        aux, _ = dump.plain_states("the speculators writer")
        if dump.final_prenorm_hidden_state is None:
            raise DumpError(
                ErrorReason.MISSING_FINAL_PRENORM, f"dump {dump.rid} has no final_prenorm_hidden_state, which speculators needs"
            )
        stacked = torch.cat([aux, dump.final_prenorm_hidden_state.unsqueeze(1)], dim=1)
        path = self.sample_path(sample.row)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        try:
            save_file({"token_ids": dump.input_ids.to(torch.int64), "hidden_states": stacked}, str(tmp))
            written = WrittenFile(tmp.stat().st_size, file_checksum(tmp))
            os.replace(tmp, path)
        except BaseException:
            remove_quietly(tmp)
            raise
        return written

    def read_sample(self, row: int) -> StoredSample:
        tensors = load_file(str(self.sample_path(row)))
        hidden = tensors["hidden_states"]
        return StoredSample(
            row=row,
            input_ids=tensors["token_ids"],
            loss_mask=None,
            aux_hidden_states=hidden[:, :-1],
            final_hidden_state=hidden[:, -1],
        )

    def finalize(self, samples: Iterable[Sample], written_rows: set[int]) -> None:
        import datasets

        by_row = {s.row: s for s in samples if s.row in written_rows}
        last = max(by_row, default=-1)
        input_ids, loss_mask, seq_len, written = [], [], [], []
        for row in range(last + 1):
            sample = by_row.get(row)
            input_ids.append(sample.input_ids if sample else [])
            loss_mask.append(sample.loss_mask if sample else [])
            seq_len.append(len(sample.input_ids) if sample else 0)
            written.append(sample is not None)
        table = datasets.Dataset.from_dict(
            {"input_ids": input_ids, "loss_mask": loss_mask, "seq_len": seq_len, "written": written},
            features=arrow_features(),
        )
        save_arrow_dataset(table, self.root / "data")


def arrow_features() -> Any:
    """The columns of ``<out>/data``: one entry per dataset row, ``written`` false where no file is."""
    import datasets

    return datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int64")),
            "loss_mask": datasets.Sequence(datasets.Value("int64")),
            "seq_len": datasets.Value("int64"),
            "written": datasets.Value("bool"),
        }
    )


def save_arrow_dataset(table: Any, final: Path) -> None:
    """``save_to_disk`` under a temp name, then swapped in with ``os.replace`` (torch format)."""
    table.set_format("torch")
    tmp = temp_path(final)
    try:
        table.save_to_disk(str(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: no temp directory left behind
        raise
    if final.exists():
        old = temp_path(final.with_name(final.name + "-old"))
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
