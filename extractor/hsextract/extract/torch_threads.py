"""One torch intra-op thread while the extractor runs.

The extractor's parallelism is its request threads and pack processes; its own torch work (a row's checks and
sample file, the spot check's comparison) is small. Torch ran some of it on intra-op threads anyway: on a 2-core
CPU, request threads that wrote a sample (``torch.save``) each started a pool thread of their own (OpenMP keeps a
pool per calling thread), and pool workers spin for a while waiting for more. On one H200 with a wide model that
was 14 of the extractor's 24 ms of user CPU a row (``OMP_NUM_THREADS=1``: 9.4 ms, the rate 1.13 x).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch's intra-op threads set to one (each thread takes the setting at its first torch operation), then back."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
