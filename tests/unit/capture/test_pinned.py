"""The pinned pool: buffers reused, grown never shrunk, and bounded (acquire blocks when all are out)."""

from __future__ import annotations

import threading

import torch

from hsextract.capture.pinned import PinnedPool


def test_buffers_are_reused_and_grow() -> None:
    pool = PinnedPool(slots=2, pin=False)
    first = pool.acquire(4, 3, 8, torch.bfloat16, prenorm=True)
    assert first.aux.numel() >= 4 * 3 * 8 and first.prenorm.numel() >= 4 * 8 and first.ids.numel() >= 4
    pool.release(first)
    again = pool.acquire(16, 3, 8, torch.bfloat16)
    assert again is first and again.aux.numel() >= 16 * 3 * 8 and again.final.dtype == torch.bfloat16
    pool.release(again)
    smaller = pool.acquire(2, 3, 8, torch.bfloat16)
    assert smaller.aux.numel() >= 16 * 3 * 8  # never shrinks


def test_acquire_blocks_until_a_buffer_is_released() -> None:
    pool = PinnedPool(slots=1, pin=False)
    held = pool.acquire(1, 1, 8, torch.float32)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(1, 1, 8, torch.float32)))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not got  # back-pressure: the pool is bounded
    pool.release(held)
    waiter.join(timeout=5)
    assert got == [held]
