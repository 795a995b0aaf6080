"""What every output format provides: the one place that knows a format.

A format class owns its file layout (``sample_path``, ``write_sample``, ``read_sample``,
``finalize``), the dtypes it stores, its trainer's rules (how many aux layers it takes, its default
sequence length and the setting that raises it, the settings ``data_config.json`` records and the
summary prints), bytes per token for the disk preflight, and its hooks into ``verify`` and
``merge``. Nothing outside ``formats/`` branches on a format's name.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from hsextract.contract.files import fp8
from hsextract.contract.files.dumps import Dump
from hsextract.errors import ConfigError
from hsextract.output.checksum import WrittenFile
from hsextract.output.sample import Sample

if TYPE_CHECKING:
    from hsextract.output.merge_plan import MergePlan
    from hsextract.output.serving_hints import SGLangServing

#: ``--storage`` (``ExtractConfig.storage``): the model's dtype, or FP8 with per-token scales (contract.fp8)
AUTO_STORAGE = "auto"
#: bytes per element of the dtypes an output can store hidden states in (FP8 adds a float32 scale a token)
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, fp8.FP8_STORAGE: 1}
#: per token besides the states: the token id (int64) and, for some formats, the loss mask
TOKEN_OVERHEAD_BYTES = 16


def element_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; ConfigError for a dtype no format stores (never a guess)."""
    try:
        return ELEMENT_BYTES[dtype]
    except KeyError:
        raise ConfigError(
            f"no output stores hidden states as {dtype!r} (known: {', '.join(sorted(ELEMENT_BYTES))}); serve the model "
            "in one of them"
        ) from None


@dataclass
class StoredSample:
    """A sample read back from the output, in the bundle's own terms."""

    row: int
    input_ids: torch.Tensor  # [T]
    loss_mask: torch.Tensor | None  # [T], None when the format keeps it elsewhere
    aux_hidden_states: torch.Tensor  # [T, K, H]
    final_hidden_state: torch.Tensor  # [T, H], in the format's own convention (see final_norm_applied)
    #: FP8 files: [T, 1, 1] float32, one scale per token over all slots (the states above are float8_e4m3fn)
    hidden_states_scales: torch.Tensor | None = None

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux, final)`` as values: an FP8 sample's states times its scales (hs-connectors' arithmetic),
        any other sample's states as stored."""
        if self.hidden_states_scales is None:
            return self.aux_hidden_states, self.final_hidden_state
        aux = fp8.dequantize(self.aux_hidden_states, self.hidden_states_scales, dtype)
        final = fp8.dequantize(self.final_hidden_state.unsqueeze(1), self.hidden_states_scales, dtype)
        return aux, final.squeeze(1)


class OutputFormat(ABC):
    name: ClassVar[str]
    #: whether the last hidden state the format stores is after the final norm
    final_norm_applied: ClassVar[bool]
    #: whether packing needs the dump's pre-norm final state
    needs_final_prenorm: ClassVar[bool] = False
    #: where sample files lie, relative to the root (a glob)
    sample_glob: ClassVar[str]
    #: the dtype the states are stored in; None: as the server computed them
    stored_dtype: ClassVar[str | None] = None
    #: whether :meth:`write_sample` checks every value it stores for NaN and infinity as it writes (DumpError
    #: ``non_finite``, no file left), so that packing skips the dump checks' own pass over the states (issue 37)
    checks_values_as_written: ClassVar[bool] = False
    #: ``--storage`` values besides "auto" the format writes (and its trainer reads)
    storages: ClassVar[tuple[str, ...]] = ()
    #: why the format refuses any other ``--storage``, and what to use instead
    storage_refusal: ClassVar[str] = ""
    #: the trainer that reads the format, and its released version the settings are for
    trainer_name: ClassVar[str]
    trainer_version: ClassVar[str]
    #: the trainer's default sequence length (a longer sample loses its tail there) and the setting that raises it
    trainer_default_length: ClassVar[int]
    trainer_length_setting: ClassVar[str]

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        #: sample files written with direct I/O (``output/sample_file.py``; the run sets it from ``--output-io``)
        self.direct_io = False

    # -- rules checked before any work --------------------------------------------------------------
    @classmethod  # noqa: B027  (a trainer that takes any count of aux layers keeps it empty)
    def check_layers(cls, aux_layer_ids: list[int]) -> None:
        """ConfigError when the trainer would refuse these aux layers."""

    @classmethod
    def check_storage(cls, storage: str) -> None:
        """ConfigError, before any work, when the format cannot store (or its trainer cannot read) ``storage``."""
        if storage != AUTO_STORAGE and storage not in cls.storages:
            raise ConfigError(cls.storage_refusal_message())

    @classmethod
    def storage_refusal_message(cls) -> str:
        """What :meth:`check_storage` says for a storage the format does not write."""
        return cls.storage_refusal or f"format {cls.name} stores only the model's dtype; drop --storage"

    @classmethod
    def stored_dtype_for(cls, computed: str | None, storage: str = AUTO_STORAGE) -> str | None:
        """The dtype the sample files hold when the server computes ``computed`` (None: not known yet)."""
        if storage != AUTO_STORAGE:
            return storage
        return cls.stored_dtype or computed

    @classmethod
    def bytes_per_token(cls, num_aux: int, hidden_size: int, stored: str) -> int:
        """Bytes one token takes in the output (the disk preflight's estimate): the states in the stored
        dtype (FP8: plus its float32 scale) and the token's id."""
        if stored == fp8.FP8_STORAGE:
            return fp8.bytes_per_token(num_aux + 1, hidden_size) + TOKEN_OVERHEAD_BYTES
        return (num_aux + 1) * hidden_size * element_bytes(stored) + TOKEN_OVERHEAD_BYTES

    # -- the trainer ----------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def trainer_settings(cls, serving: SGLangServing, longest_sample: int, stored: str | None = None) -> dict[str, Any]:
        """The settings the trainer needs for this output, whose files hold ``stored`` (``data_config.json``
        ``trainer``). Paths are relative to the output directory (outputs move to the training cluster)."""

    @classmethod
    @abstractmethod
    def trainer_command(cls, trainer: dict[str, Any], output: Path, model: str) -> list[str]:
        """The whole command line (argv, the released trainer's own entry point first) that trains on the output
        made from ``model``, paths resolved."""

    @classmethod
    def trainer_note(cls, output: Path) -> str | None:
        """A hint printed under the command (None: none)."""
        return None

    @classmethod  # noqa: B027  (a trainer that reads only the output's own files keeps it empty)
    def write_trainer_files(cls, trainer: dict[str, Any], output: Path, model: str) -> None:
        """Write into the output the files :meth:`trainer_command` reads (none by default)."""

    @classmethod
    def trainer_summary(cls, trainer: dict[str, Any], output: Path, model: str) -> list[str]:
        """The end-of-run summary's lines on training: the trainer, then its command quoted for a POSIX shell on a
        line of its own (pasteable as it is), then the note."""
        command = shlex.join(cls.trainer_command(trainer, output, model))
        note = cls.trainer_note(output)
        return [f"train with {cls.trainer_name} {cls.trainer_version}:", f"  {command}", *([note] if note else [])]

    @classmethod
    def trainer_length(cls, longest_sample: int) -> int:
        return max(longest_sample, cls.trainer_default_length)

    # -- the files ------------------------------------------------------------------------------------
    @abstractmethod
    def sample_path(self, row: int) -> Path: ...

    @abstractmethod
    def write_sample(self, sample: Sample, dump: Dump) -> WrittenFile:
        """Write one sample atomically under its final name; return its size and checksum.
        A failed write leaves no temp file behind."""

    @abstractmethod
    def read_sample(self, row: int) -> StoredSample: ...

    def finalize(self, samples: Iterable[Sample], written_rows: set[int]) -> None:  # noqa: B027
        """Write whatever spans all samples (called at the end of a run)."""

    def prepare_finalize(self, samples: Callable[[], Iterable[Sample]]) -> None:  # noqa: B027
        """Called once the run has handed out its last row, while the rows in flight finish: start what
        :meth:`finalize` will wait for. ``samples`` reads every row of the shard that validates again, a superset of
        those :meth:`finalize` will be given (which are written is known only then)."""

    def sample_files(self) -> Iterator[Path]:
        """Every sample file in the output, listed in samples.jsonl or not."""
        return self.root.glob(self.sample_glob)

    def relative(self, row: int) -> str:
        return str(self.sample_path(row).relative_to(self.root))

    # -- hooks of verify and merge --------------------------------------------------------------------
    @classmethod
    def quantization(cls, stored: str | None) -> dict[str, Any] | None:
        """``data_config.json`` ``quantization``: how ``stored`` was quantized and what reads it; None: not quantized."""
        return None

    def verify_index(self, rows: set[int], problem: Callable[[str], None]) -> None:  # noqa: B027
        """``hsextract verify``: check what spans all samples (``finalize``'s files) against the written rows."""

    def merge_index(self, plan: MergePlan) -> None:  # noqa: B027
        """``hsextract merge``: write what spans all samples into this (merged) output from the shards'."""
