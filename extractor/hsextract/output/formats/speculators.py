"""vllm-project/speculators' offline layout.

``<out>/hidden_states/hs_<row>.safetensors`` with ``token_ids [T]`` int64 and ``hidden_states
[T, K+1, H]``: the aux layers, then the last decoder layer's output *before* the final norm
(speculators' trainer applies the verifier's norm itself: ``lm_head(norm(h))``). ``<out>/data/``
is a ``datasets`` Arrow dataset (torch format) with ``input_ids``, ``loss_mask``, ``seq_len``;
its index i is dataset row i, the number of ``hs_<i>``, so rows this output does not hold
(bad input, other shards) are entries with ``written`` false, ``seq_len`` 0 and no file. Train
with ``--data-path <out>/data --hidden-states-path <out>/hidden_states --on-missing skip``.

With ``--storage float8_e4m3fn`` the files hold speculators' own FP8 layout (hs-connectors 0.9.0,
:mod:`hsextract.contract.files.fp8`): ``hidden_states [T, K+1, H]`` float8_e4m3fn and ``hidden_states_scales
[T, 1, 1]`` float32, one scale per token over all slots; the trainer reads them with
``--hidden-states-backend fp8`` (its default ``file`` backend ignores the scales). The server quantizes
(the dump is already FP8): the writer stores the dump's tensors as they are, no round trip through bf16.
"""

from __future__ import annotations

import importlib
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file

from hsextract.contract.files import fp8
from hsextract.contract.files.dumps import FINAL_SLOT_PRENORM, Dump
from hsextract.contract.files.tensor_file import NonFinite, Stacked, in_library_order, safetensors_size, safetensors_stream
from hsextract.contract.states import ErrorReason
from hsextract.durable.atomic import remove_quietly, temp_path
from hsextract.durable.sync import sync_dir, sync_tree
from hsextract.errors import DumpError, MergeError
from hsextract.output.checksum import WrittenFile
from hsextract.output.formats import token_freq
from hsextract.output.formats.base import OutputFormat, StoredSample
from hsextract.output.formats.index_columns import IndexColumns, RowArrays, row_arrays
from hsextract.output.sample import Sample
from hsextract.output.sample_file import SampleFile
from hsextract.output.serving_hints import SGLangServing

if TYPE_CHECKING:
    from hsextract.output.merge_plan import MergePlan

#: the fix for a missing or wrong data/token_freq.pt: the run's finalize writes it from data/
_REFINALIZE = "rerun the extraction with the same command (it finds the rows done and rewrites data/)"

#: the released speculators the settings are for (tests/trainers checks them against its code)
SPECULATORS_VERSION = "0.9.0"
#: speculators ``--total-seq-len``: the packing budget; a longer sample is cut by the collator
SPECULATORS_DEFAULT_TOTAL_SEQ_LEN = 8192
#: trainer flags whose values are paths relative to the output directory
_PATH_FLAGS = ("--data-path", "--hidden-states-path")


def speculators_args(trainer: dict[str, Any], output: Path) -> list[str]:
    """speculators' command-line flags for this output (``trainer`` as ``trainer_settings`` gave it), paths resolved."""
    args: list[str] = []
    for flag, value in trainer["flags"].items():
        if flag in _PATH_FLAGS:
            value = str(Path(output).resolve() / value)
        args += [flag, *(map(str, value) if isinstance(value, list) else [str(value)])]
    return args


def draft_vocab_hint(distribution: dict[int, int], path: Path, coverage: float = 0.95) -> str:
    """The ``--draft-vocab-size`` hint for an output whose supervised tokens count as ``distribution``: an N above the
    distinct tokens only pads the draft vocabulary with tokens never trained on, so the hint names that bound and the
    N that covers ``coverage`` of the supervised tokens."""
    distinct = len(distribution)
    counts = sorted(distribution.values(), reverse=True)
    total, covered, covering = sum(counts), 0, 0
    for covering, count in enumerate(counts, 1):  # noqa: B007  (the loop's last value is the answer)
        covered += count
        if covered >= coverage * total:
            break
    return (
        f"for a smaller draft vocabulary add --draft-vocab-size N with N at most {distinct}, the distinct supervised "
        f"tokens counted in {path} (the {covering} most frequent cover {coverage:.0%} of the supervised tokens)"
    )


class SpeculatorsFormat(OutputFormat):
    name = "speculators"
    final_norm_applied = False
    needs_final_prenorm = True
    sample_glob = "hidden_states/hs_*.safetensors"
    trainer_name = "speculators"
    trainer_version = SPECULATORS_VERSION
    trainer_default_length = SPECULATORS_DEFAULT_TOTAL_SEQ_LEN
    trainer_length_setting = "--total-seq-len"
    storages = (fp8.FP8_STORAGE,)
    checks_values_as_written = True
    #: the trainer flag that reads FP8 files (hs-connectors' FP8Transfer dequantizes them)
    FP8_BACKEND_FLAGS = {"--hidden-states-backend": "fp8"}

    @classmethod
    def quantization(cls, stored: str | None) -> dict[str, Any] | None:
        if stored != fp8.FP8_STORAGE:
            return None
        return {
            "scheme": "per-token amax/448, hs-connectors 0.9.0 layout",
            "dtype": fp8.FP8_STORAGE,
            "scale": f"clamp(amax / {fp8.FP8_MAX:g}, min={fp8.MIN_SCALE:g}), amax over all slots and the hidden dimension",
            "scales_key": "hidden_states_scales",
            "scales_shape": "[T, 1, 1]",
            "scales_dtype": "float32",
            "final_slot": "prenorm",
            "quantized_by": "the server, before the device-to-host copy (the dump is FP8)",
            "dequantize": "hidden_states.to(dtype) * hidden_states_scales.to(dtype) (hs_connectors.fp8_utils)",
            "trainer_flags": dict(cls.FP8_BACKEND_FLAGS),
        }

    @classmethod
    def trainer_settings(cls, serving: SGLangServing, longest_sample: int, stored: str | None = None) -> dict[str, Any]:
        flags: dict[str, Any] = {
            "--data-path": "data",
            "--hidden-states-path": "hidden_states",
            "--on-missing": "skip",  # rows this output does not hold (bad input, other shards) have no file
            "--total-seq-len": cls.trainer_length(longest_sample),
            "--target-layer-ids": serving.layers_to_capture,  # vLLM/speculators: the layer *entered*
        }
        if stored == fp8.FP8_STORAGE:
            flags.update(cls.FP8_BACKEND_FLAGS)  # the default file backend would read the FP8 values unscaled
        return {
            "name": cls.trainer_name,
            "version": cls.trainer_version,
            "paths_relative_to": "the output directory",
            "flags": flags,
            "default_total_seq_len": cls.trainer_default_length,
            "longest_sample": longest_sample,
        }

    @classmethod
    def trainer_command(cls, trainer: dict[str, Any], output: Path, model: str) -> list[str]:
        # `speculators train` (the wheel's console script); --verifier-name-or-path is the one flag it requires
        return ["speculators", "train", "--verifier-name-or-path", model, *speculators_args(trainer, output)]

    @classmethod
    def trainer_note(cls, output: Path) -> str | None:
        path = output / "data" / token_freq.TOKEN_FREQ_FILE
        if not path.exists():
            return None
        return draft_vocab_hint(token_freq.read_as_written(path), path)

    def sample_path(self, row: int) -> Path:
        return self.root / "hidden_states" / f"hs_{row}.safetensors"

    def write_sample(self, sample: Sample, dump: Dump) -> WrittenFile:
        token_ids = dump.input_ids.to(torch.int64)
        if dump.hidden_states is not None:  # stacked by the server (FP8, or the model's dtype) as this file holds it
            if dump.meta.final_slot != FINAL_SLOT_PRENORM:
                raise DumpError(
                    ErrorReason.MISSING_FINAL_PRENORM,
                    f"dump {dump.rid} holds the {dump.meta.final_slot} final state in its last slot; speculators needs "
                    "the pre-norm one (the request asks for it: the server must honour hsextract_final_prenorm)",
                )
            # the server's bytes (and FP8 scales) as they are: no copy to stack them, no dequantize, no requantize
            tensors: dict[str, torch.Tensor | Stacked] = {"token_ids": token_ids, "hidden_states": dump.hidden_states}
            if dump.hidden_states_scales is not None:
                tensors["hidden_states_scales"] = dump.hidden_states_scales
        else:
            aux, _ = dump.plain_states("the speculators writer")
            if dump.final_prenorm_hidden_state is None:
                raise DumpError(
                    ErrorReason.MISSING_FINAL_PRENORM,
                    f"dump {dump.rid} has no final_prenorm_hidden_state, which speculators needs",
                )
            tensors = {
                "token_ids": token_ids,
                # [T, K+1, H] as the file holds it, built a few tokens at a time as it is written (Stacked says why)
                "hidden_states": Stacked((aux, dump.final_prenorm_hidden_state.unsqueeze(1))),
            }
        path = self.sample_path(sample.row)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(path)
        ordered = in_library_order(tensors)
        try:
            # the bytes safetensors' save_file writes, from the tensors' memory, checked and checksummed as they go
            with SampleFile(tmp, self.direct_io, size=safetensors_size(ordered)) as out:
                for piece in safetensors_stream(ordered, finite=True):
                    out.write(piece)
                written = out.finish()
            os.replace(tmp, path)  # synced by the row worker once the dump is freed, before the row is recorded
        except NonFinite as exc:
            remove_quietly(tmp)
            raise DumpError(ErrorReason.NON_FINITE, f"dump {dump.rid} holds NaN or infinite values ({exc})") from None
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
            hidden_states_scales=tensors.get("hidden_states_scales"),
        )

    #: the rows read again while the last ones finish (prepare_finalize), as arrays; None: not started
    _pre_read: Future[RowArrays] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "_pre_read"}  # a replacement pack process's

    def prepare_finalize(self, samples: Callable[[], Iterable[Sample]]) -> None:
        # on threads while the rows in flight finish: datasets' import (most of a second of finalize's otherwise) and
        # the dataset's second read and check (0.2-0.3 s of a 3000-row finish on an H100's host)
        threading.Thread(target=importlib.import_module, args=("datasets",), name="hsextract-import", daemon=True).start()
        self._pre_read = pre_read = Future[RowArrays]()

        def read() -> None:
            try:
                pre_read.set_result(row_arrays(samples()))
            except BaseException as exc:  # finalize reads them again, and meets the error itself
                pre_read.set_exception(exc)

        threading.Thread(target=read, name="hsextract-pre-read", daemon=True).start()

    def finalize(self, samples: Iterable[Sample], written_rows: set[int]) -> None:
        import datasets

        read = self._take_pre_read()
        if read is not None and written_rows <= read.keys():
            columns = IndexColumns.of_arrays(read, written_rows)
        else:  # not read before, or a written row the read did not find
            columns = IndexColumns.of(samples, written_rows)
        save_arrow_dataset(datasets.Dataset.from_dict(columns.arrow(), features=arrow_features()), self.root / "data")
        token_freq.write(self.token_freq_path, columns.token_freq())  # after the swap: data/ is replaced whole

    def _take_pre_read(self) -> RowArrays | None:
        """prepare_finalize's read, once it is done; None when there was none or it failed."""
        pre_read, self._pre_read = self._pre_read, None
        if pre_read is None or pre_read.exception() is not None:
            return None
        return pre_read.result()

    @property
    def token_freq_path(self) -> Path:
        return self.root / "data" / token_freq.TOKEN_FREQ_FILE

    def verify_index(self, rows: set[int], problem: Callable[[str], None]) -> None:
        """``data/`` loads, and its entry of every written row matches the row's file."""
        import datasets

        try:
            data = datasets.load_from_disk(str(self.root / "data"))
        except Exception as exc:
            problem(f"data/ cannot be loaded with datasets.load_from_disk: {exc}")
            return
        lacking = [column for column in ("input_ids", "loss_mask", "seq_len") if column not in data.column_names]
        if lacking:
            problem(f"data/ has no {', '.join(lacking)} column (speculators' trainer reads them); {_REFINALIZE}")
            return
        stored_format = (data.format or {}).get("type")
        if stored_format != "torch":
            problem(
                f"data/ is stored in the {stored_format or 'plain'} format, not torch: speculators' "
                f"trainer compares each entry's input_ids with torch.equal and stops with a TypeError; {_REFINALIZE}"
            )
        for row in sorted(r for r in rows if r >= len(data)):
            problem(f"row {row} is written but data/ has only {len(data)} entries")
        # the columns in batches of plain lists, and only each file's token_ids: a row's torch-formatted
        # entry and a second read of its whole file cost more than the rest of verify's checks of the row
        row = 0
        for batch in data.with_format(None).select_columns(["input_ids", "seq_len"]).iter(batch_size=4096):
            for entry_ids, seq_len in zip(batch["input_ids"], batch["seq_len"], strict=True):
                if row in rows:
                    try:
                        token_ids = self.read_token_ids(row)
                    except Exception:
                        token_ids = None  # reported with the sample
                    if token_ids is not None and (entry_ids != token_ids or int(seq_len) != len(token_ids)):
                        problem(f"row {row}: data/ input_ids or seq_len differ from hs_{row}.safetensors")
                row += 1
        self._verify_token_freq(data, problem)

    def read_token_ids(self, row: int) -> list[int]:
        """A row's ``token_ids`` alone (its states stay on disk)."""
        from safetensors import safe_open

        with safe_open(str(self.sample_path(row)), framework="pt") as handle:
            ids: list[int] = handle.get_tensor("token_ids").tolist()
        return ids

    def _verify_token_freq(self, data: Any, problem: Callable[[str], None]) -> None:
        """``data/token_freq.pt`` counts exactly the supervised tokens of ``data/``'s rows."""
        path = self.token_freq_path
        try:
            recorded = token_freq.read(path)
        except FileNotFoundError:
            problem(f"{path} is missing (speculators would train a full-vocabulary drafter); {_REFINALIZE}")
            return
        except Exception as exc:  # a torn or foreign file: any reader error is a finding
            problem(f"{path} cannot be read ({type(exc).__name__}: {exc}); {_REFINALIZE}")
            return
        rows = (
            (ids, mask)
            for batch in data.with_format(None).iter(batch_size=4096)
            for ids, mask in zip(batch["input_ids"], batch["loss_mask"], strict=True)
        )
        expected = token_freq.count_supervised(rows)
        if recorded != expected:
            differ = sorted(set(recorded.items()) ^ set(expected.items()))[:5]
            problem(f"{path} does not count data/'s supervised tokens (differing entries, e.g. {differ}); {_REFINALIZE}")

    def merge_index(self, plan: MergePlan) -> None:
        """One ``data/`` whose entry i is row i: each written row from its shard's ``data/``, holes elsewhere."""
        import datasets

        features = arrow_features()
        parts = []
        offsets: dict[int, int] = {}
        offset = 0
        for shard in plan.shards:
            rows = [row for row, owner in plan.owner.items() if owner is shard]
            if not rows:
                continue
            try:
                data = datasets.load_from_disk(str(shard.path / "data"))
            except Exception as exc:  # datasets raises several types for a missing or damaged directory
                raise MergeError(
                    f"{shard.label}: data/ cannot be loaded ({exc}); finish it first: {shard.finish_command()}"
                ) from None
            if len(data) <= max(rows):
                raise MergeError(
                    f"{shard.label}: data/ has {len(data)} entries but the shard wrote row {max(rows)}; "
                    f"finish it first: {shard.finish_command()}"
                )
            parts.append(data.with_format(None).cast(features))
            offsets[id(shard)] = offset
            offset += len(data)
        hole = offset
        parts.append(
            datasets.Dataset.from_dict(
                {"input_ids": [[]], "loss_mask": [[]], "seq_len": [0], "written": [False]}, features=features
            )
        )
        combined = datasets.concatenate_datasets(parts)
        indices = [offsets[id(plan.owner[row])] + row if row in plan.owner else hole for row in range(plan.last_written_row + 1)]
        merged = combined.select(indices)
        written = list(merged["written"])
        wrong = [row for row in plan.owner if not written[row]]
        if wrong:
            shard = plan.owner[wrong[0]]
            raise MergeError(
                f"{shard.label}: data/ marks row {wrong[0]} as not written although samples.jsonl lists it; "
                f"repair the shard first: {shard.finish_command()}"
            )
        save_arrow_dataset(merged.flatten_indices(), self.root / "data")
        token_freq.write(self.token_freq_path, token_freq.combine(self._shard_token_freq(plan)))

    @staticmethod
    def _shard_token_freq(plan: MergePlan) -> Iterator[dict[int, int]]:
        for shard in plan.shards:
            path = shard.path / "data" / token_freq.TOKEN_FREQ_FILE
            try:
                yield token_freq.read(path)
            except FileNotFoundError:
                raise MergeError(
                    f"{shard.label}: {path} is missing (a shard written before the draft vocabulary was counted); "
                    f"rerun its extraction, which finds its rows done and writes it: {shard.finish_command()}"
                ) from None


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
        sync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: no temp directory left behind
        raise
    if final.exists():
        old = temp_path(final.with_name(final.name + "-old"))
        os.replace(final, old)
        os.replace(tmp, final)
        sync_dir(final.parent)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
        sync_dir(final.parent)
