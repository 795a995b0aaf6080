"""Where a server's time goes: seconds per stage of the capture path, and batch shape counters.

Stages (``hsextract_server_stage_seconds{stage=...}``, a histogram per stage):

* ``queue``: a request's wait from arrival to the start of its forward (embedded engine)
* ``idle``: the scheduler's wait from running out of work to the next request (embedded engine): long
  ones while requests queue elsewhere mean the client, not the server, sets the pace
* ``wait_device``: the scheduler's wait for the older of the forwards queued on the device to end before
  launching another (embedded engine): the device is the limit while this fills the scheduler's time
* ``launch``: host time the scheduler thread spent queueing one batched forward (on a GPU the
  forward itself runs on; a launch as long as the forward would leave the device waiting)
* ``forward``: GPU time of one forward (batch or chunk), from CUDA events (host time on the CPU)
* ``d2h``: GPU time of one batch's device-to-host copy on the side stream
* ``wait_pinned``: the forward thread's wait for a free pinned buffer (every one still held by batches whose
  dumps are being written: the dump writers are the limit while this grows)
* ``wait_sink``: the forward thread's wait for room in the dump assembler's queue
* ``wait_copy``: how long the dump assembler waited for a copy to land
* ``dump_write``: one dump written (a writer thread; several run at once)
* ``spot_check``: host time the scheduler thread spent launching one spot check's unbatched forward (no other
  forward is launched meanwhile). On a busy GPU this includes waiting for room in the device's queue of
  launched kernels, as ``launch`` does, while the device runs the forwards queued before it
* ``spot_check_forward``: one spot check's span on the device, from CUDA events on the check's own stream (host
  time on the CPU). A batch-1 forward's kernels arrive at the pace of its Python launch, so the span is about
  the launch's time; the rows' forwards run beside it on their stream (embedded engine)

Sums of a stage can exceed the wall time where its work runs in parallel (``dump_write``).
The embedded server serves these on ``GET /metrics``; the SGLang hook keeps only the totals
(:meth:`StageClock.totals`), which its benchmark reads.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Histogram

STAGES = (
    "queue",
    "idle",
    "wait_device",
    "launch",
    "forward",
    "d2h",
    "wait_pinned",
    "wait_sink",
    "wait_copy",
    "dump_write",
    "spot_check",
    "spot_check_forward",
)
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class StageClock:
    """Thread-safe per-stage seconds, mirrored into Prometheus metrics on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._seconds = Histogram(
            "hsextract_server_stage_seconds",
            "Seconds per capture stage and batch or dump",
            ["stage"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.batches = Counter("hsextract_server_batches", "Forward passes run (batches and prefill chunks)", registry=r)
        self.tokens = Counter("hsextract_server_tokens", "Prompt tokens forwarded", registry=r)
        self.padded_tokens = Counter(
            "hsextract_server_padded_tokens", "Token slots forwarded, padding included (a CUDA graph bucket's too)", registry=r
        )
        self.dumps = Counter("hsextract_server_dumps", "Dumps written", registry=r)
        self.dump_bytes = Counter("hsextract_server_dump_bytes", "Bytes of hidden.safetensors written", registry=r)
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(STAGES, 0.0)
        self._counts = dict.fromkeys(STAGES, 0)
        for stage in STAGES:
            self._seconds.labels(stage)

    def observe(self, stage: str, seconds: float) -> None:
        self._seconds.labels(stage).observe(seconds)
        with self._lock:
            self._totals[stage] = self._totals.get(stage, 0.0) + seconds
            self._counts[stage] = self._counts.get(stage, 0) + 1

    def totals(self) -> dict[str, float]:
        """Summed seconds per stage so far."""
        with self._lock:
            return dict(self._totals)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
