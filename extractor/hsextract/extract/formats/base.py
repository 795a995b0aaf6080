"""What every output format provides."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from hsextract.contract.dumps import Dump
from hsextract.extract.dataset import Sample


@dataclass
class StoredSample:
    """A sample read back from the output, in the bundle's own terms."""

    row: int
    input_ids: torch.Tensor  # [T]
    loss_mask: torch.Tensor | None  # [T], None when the format keeps it elsewhere
    aux_hidden_states: torch.Tensor  # [T, K, H]
    final_hidden_state: torch.Tensor  # [T, H], in the format's own convention (see final_norm_applied)


class OutputFormat(ABC):
    name: str
    #: whether the last hidden state the format stores is after the final norm
    final_norm_applied: bool
    #: whether packing needs the dump's pre-norm final state
    needs_final_prenorm: bool = False
    #: the dtype the states are stored in; None: as the server computed them
    stored_dtype: str | None = None

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @abstractmethod
    def sample_path(self, row: int) -> Path: ...

    @abstractmethod
    def write_sample(self, sample: Sample, dump: Dump) -> int:
        """Write one sample atomically under its final name; return the bytes written."""

    @abstractmethod
    def read_sample(self, row: int) -> StoredSample: ...

    def finalize(self, samples: Iterable[Sample], written_rows: set[int]) -> None:  # noqa: B027
        """Write whatever spans all samples (called at the end of a run)."""

    def relative(self, row: int) -> str:
        return str(self.sample_path(row).relative_to(self.root))
