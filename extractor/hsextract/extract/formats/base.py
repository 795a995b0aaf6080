"""What every output format provides: the one place that knows a format.

A format class owns its file layout (``sample_path``, ``write_sample``, ``read_sample``,
``finalize``), the dtypes it stores, its trainer's rules (how many aux layers it takes, its default
sequence length and the setting that raises it, the settings ``data_config.json`` records and the
summary prints), bytes per token for the disk preflight, and its hooks into ``verify`` and
``merge``. Nothing outside ``formats/`` branches on a format's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from hsextract.contract.dumps import Dump
from hsextract.errors import ConfigError
from hsextract.extract.checksum import WrittenFile
from hsextract.extract.dataset import Sample

if TYPE_CHECKING:
    from hsextract.extract.merge_plan import MergePlan
    from hsextract.extract.serving_hints import SGLangServing

#: bytes per element of the dtypes an output can store hidden states in
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
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
    #: the trainer that reads the format, and its released version the settings are for
    trainer_name: ClassVar[str]
    trainer_version: ClassVar[str]
    #: the trainer's default sequence length (a longer sample loses its tail there) and the setting that raises it
    trainer_default_length: ClassVar[int]
    trainer_length_setting: ClassVar[str]

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- rules checked before any work --------------------------------------------------------------
    @classmethod  # noqa: B027  (a trainer that takes any count of aux layers keeps it empty)
    def check_layers(cls, aux_layer_ids: list[int]) -> None:
        """ConfigError when the trainer would refuse these aux layers."""

    @classmethod
    def stored_dtype_for(cls, computed: str | None) -> str | None:
        """The dtype the sample files hold when the server computes ``computed`` (None: not known yet)."""
        return cls.stored_dtype or computed

    @classmethod
    def bytes_per_token(cls, num_aux: int, hidden_size: int, stored: str) -> int:
        """Bytes one token takes in the output (the disk preflight's estimate)."""
        return (num_aux + 1) * hidden_size * element_bytes(stored) + TOKEN_OVERHEAD_BYTES

    # -- the trainer ----------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def trainer_settings(cls, serving: SGLangServing, longest_sample: int) -> dict[str, Any]:
        """The settings the trainer needs for this output (``data_config.json`` ``trainer``). Paths are
        relative to the output directory (outputs move to the training cluster)."""

    @classmethod
    @abstractmethod
    def trainer_summary(cls, trainer: dict[str, Any], output: Path) -> str:
        """The end-of-run summary line that says how to train on the output (paths resolved)."""

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

    def sample_files(self) -> Iterator[Path]:
        """Every sample file in the output, listed in samples.jsonl or not."""
        return self.root.glob(self.sample_glob)

    def relative(self, row: int) -> str:
        return str(self.sample_path(row).relative_to(self.root))

    # -- hooks of verify and merge --------------------------------------------------------------------
    def verify_index(self, rows: set[int], problem: Callable[[str], None]) -> None:  # noqa: B027
        """``hsextract verify``: check what spans all samples (``finalize``'s files) against the written rows."""

    def merge_index(self, plan: MergePlan) -> None:  # noqa: B027
        """``hsextract merge``: write what spans all samples into this (merged) output from the shards'."""
