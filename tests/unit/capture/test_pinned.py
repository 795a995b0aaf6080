"""The pinned pool (buffers reused, grown never shrunk, bounded) and the host copier built on it."""

from __future__ import annotations

import threading

import pytest
import torch

from hsextract.capture.dump_sink import Segment
from hsextract.capture.pinned import HostCopier, PinnedPool
from hsextract.capture.stages import StageClock
from hsextract.contract.rids import make_rid


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


def test_a_kind_first_used_after_the_reserve_is_grown_to_the_reserved_size_once() -> None:
    pool = PinnedPool(slots=1, pin=False)
    pool.reserve(16, 3, 8, torch.bfloat16)
    first = pool.acquire(4, 3, 8, torch.bfloat16, prenorm=True, fp8_tokens=4)
    prenorm, fp8, scales = first.prenorm, first.fp8, first.scales
    assert prenorm.numel() == 16 * 8 and fp8.numel() == 16 * 4 * 8 and scales.numel() == 16
    pool.release(first)
    larger = pool.acquire(12, 3, 8, torch.bfloat16, prenorm=True, fp8_tokens=12)
    assert larger.prenorm is prenorm and larger.fp8 is fp8 and larger.scales is scales  # not pinned again


def test_acquire_blocks_until_a_buffer_is_released() -> None:
    clock = StageClock()
    pool = PinnedPool(slots=1, pin=False, clock=clock)
    held = pool.acquire(1, 1, 8, torch.float32)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(1, 1, 8, torch.float32)))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive() and not got  # back-pressure: the pool is bounded
    pool.release(held)
    waiter.join(timeout=5)
    assert got == [held]
    assert clock.counts()["wait_pinned"] == 2 and clock.totals()["wait_pinned"] >= 0.3  # the wait is on the stage clock


def _rows(n: int, k: int = 3, h: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.arange(n), torch.randn(n, h), torch.randn(n, k, h), torch.randn(n, h)


def test_host_copier_copies_shared_rows_into_a_pooled_buffer_and_returns_it() -> None:
    copier = HostCopier(slots=1, pin=False)
    ids, final, aux, prenorm = _rows(5)
    expected = [t.clone() for t in (ids, final, aux, prenorm)]
    with torch.inference_mode():  # as inside a server's forward
        batch = copier.copy([Segment(make_rid(1, 5), 0, 0, 5)], ids, final, aux, prenorm)
    for source in (ids, final, aux, prenorm):
        source.zero_()  # the caller reuses its buffers once the hook returned
    assert batch.final_prenorm is not None
    got = [batch.input_ids, batch.final, batch.aux, batch.final_prenorm]
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
    assert batch.ready is None and batch.release is not None
    batch.release()
    again = copier.copy([Segment(make_rid(2, 2), 0, 0, 2)], *_rows(2))  # the one slot is free again
    assert again.aux.shape == (2, 3, 8) and again.final_prenorm is not None


def test_host_copier_hands_private_host_rows_over_as_they_are() -> None:
    copier = HostCopier(slots=1, pin=False)
    ids, final, aux, _ = _rows(4)
    batch = copier.copy([Segment(make_rid(1, 4), 0, 0, 4)], ids, final, aux, private=True)
    assert batch.final is final and batch.aux is aux and batch.final_prenorm is None and batch.release is None


def test_host_copier_refuses_aux_not_stacked_n_k_h() -> None:
    copier = HostCopier(slots=1, pin=False)
    ids, final, aux, _ = _rows(4)
    with pytest.raises(ValueError, match=r"aux must be \[n, K, H\]"):
        copier.copy([], ids, final, aux.reshape(4, -1))
