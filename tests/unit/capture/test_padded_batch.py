"""A batch of prompts right-padded into one id tensor, and each request's rows picked back out (padded_batch.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from hsextract.capture.embedded.padded_batch import PaddedBatch

CPU = torch.device("cpu")


def test_prompts_are_right_padded_to_their_longest_or_to_a_bucket() -> None:
    batch = PaddedBatch.of([[5, 6, 7], [8]])
    assert batch.ids.tolist() == [[5, 6, 7], [8, 0, 0]] and batch.slots == 6
    bucketed = PaddedBatch.of([[5, 6, 7], [8]], shape=(4, 5))
    assert bucketed.ids.tolist() == [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [0] * 5, [0] * 5] and bucketed.slots == 20


def test_each_requests_rows_come_back_from_a_padded_output_in_batch_order() -> None:
    batch = PaddedBatch.of([[5, 6, 7], [8], [9, 10]], shape=(4, 4))
    output = torch.arange(16 * 2).reshape(4, 4, 2)  # [rows, length, hidden]: position (r, p) holds 8r + 2p, +1
    rows, ids = batch.picker([2, 0], CPU)
    assert ids.tolist() == [9, 10, 5, 6, 7]
    assert rows(output).tolist() == [[16, 17], [18, 19], [0, 1], [2, 3], [4, 5]]


def test_a_whole_batch_of_its_own_outputs_is_handed_on_as_it_is_and_a_graphs_outputs_are_copied() -> None:
    batch = PaddedBatch.of([[1, 2], [3, 4]])
    output = torch.randn(2, 2, 3)
    rows, ids = batch.picker([0, 1], CPU)
    assert ids.tolist() == [1, 2, 3, 4] and rows(output).data_ptr() == output.data_ptr()  # no copy needed
    rows, _ = batch.picker([0, 1], CPU, own_outputs=False)  # the next replay overwrites them: copied out
    picked = rows(output)
    assert picked.data_ptr() != output.data_ptr() and torch.equal(picked, output.reshape(4, 3))


def test_ids_and_rows_match_a_token_by_token_reference_on_uneven_prompts_and_members() -> None:
    """The vectorised padding and picking against the plain per-token loops, for any subset of requests in any order."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 50_000, (n,), generator=generator).tolist() for n in (7, 1, 300, 64, 5, 129)]
    batch = PaddedBatch.of(prompts, shape=(8, 320))
    expected = torch.zeros(8, 320, dtype=torch.int64)
    for slot, prompt in enumerate(prompts):
        for place, token in enumerate(prompt):
            expected[slot, place] = token
    assert torch.equal(batch.ids, expected) and batch.lengths == [len(p) for p in prompts]
    output = torch.randn(8, 320, 3)
    for members in ([5, 0, 2], [1], [3, 4, 1, 0, 2, 5], [2, 2]):
        rows, ids = batch.picker(members, CPU, own_outputs=False)
        assert ids.tolist() == [token for i in members for token in prompts[i]]
        assert torch.equal(rows(output), torch.cat([output[i, : len(prompts[i])] for i in members]))
    assert PaddedBatch.of([[]], shape=(1, 4)).ids.tolist() == [[0] * 4]


def test_padding_and_picking_wake_no_intra_op_threads() -> None:
    """Torch ran the index of a batch of a few thousand tokens on its intra-op threads; on a 16-core host each batch
    woke 15 of them, which spun waiting for more (one H200: 46 ms of the server's user CPU a wide row, was 7). The
    scheduler's bookkeeping starts none: in a fresh process allowed 4 of them, its thread count stays the same."""
    script = """
import os, torch
from hsextract.capture.embedded.padded_batch import PaddedBatch
torch.set_num_threads(4)
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
prompts = [list(range(1, n + 1)) for n in (4000, 3000, 2500, 900, 6000)]
for _ in range(3):
    batch = PaddedBatch.of(prompts, shape=(8, 6144))
    rows, ids = batch.picker([4, 0, 2], torch.device("cpu"), own_outputs=False)
    assert ids.shape == (12500,)
print(before, threads())
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True)
    before, after = result.stdout.split()
    assert after == before, f"the padded batch started {int(after) - int(before)} threads"
