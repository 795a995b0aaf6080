"""End-to-end GPU benchmark: does ``hsextract serve`` + ``hsextract extract`` keep pace with the model?

Creates everything on the GPU host, nothing downloaded:

* an 8B-Llama-shaped model with random bf16 weights (hidden 4096, 32 layers, 32 heads, 8 KV heads,
  intermediate 14336, vocab 128256), made on the GPU and written with ``save_pretrained``;
* a JSONL dataset of --rows rows (default 2000) with log-normal lengths (median --median 735, the
  longest exactly --longest 4096), truncated by the extractor to --max-seq-len 2048.

Then, in one run:

(a) ``forward``: the plain transformers forward (decoder stack, ``output_hidden_states``, no
    dumping; the saved model loaded as the server loads it) of the same truncated rows, right-padded,
    sorted by length over the whole dataset and batched to the same --max-batch-tokens budget as the
    server: the model's own rate. Like the engine it passes an empty KV cache, which spares every
    forward transformers' packed-sequence check (a read of a device value).
(b) ``e2e_disk``: ``hsextract serve --device cuda`` (a subprocess, started once) and ``Extraction.run()``
    (what ``hsextract extract`` runs, in this process so its stage metrics can be read) with the
    output on the local disk (--disk-dir); wall time including preflight and planning.
(c) ``e2e_tmpfs``: the same with the output on tmpfs (--tmpfs-dir).
    Both in the extractor's --format (default specforge) and --storage (FP8 with ``--format speculators
    --storage float8_e4m3fn``: half the bytes, quantized on the GPU).
(d) ``disk_write``: the disk's limit (``plain_write``): the same files' sizes (from (b)'s samples.jsonl)
    written to --disk-dir by ``DISK_LIMIT_THREADS`` threads, each file fsynced as the extractor syncs
    its samples, in tokens/s.
(t) ``tmpfs_write``: the tmpfs's limit, (d)'s definition on --tmpfs-dir, ``TMPFS_REST_S`` after (c). A virtual
    machine whose kernel hands memory left free a while back to its host (``page_reporting``: the CI machine's) pays a
    fault in the host when it touches it again, and the rest makes (t) meet such memory as (c)'s output does
    (``bench_fresh_memory.py``). Where the kernel reports nothing (the H100 host of 2026-12-07: 37.1 GB/s), (t) meets
    the memory (c) has touched already, an upper bound of what (c) met if this is the machine's first run.
(p) ``pack_pairs`` (with --pack-pairs N): N pairs of (c) on the row threads only and with pack processes, in
    alternating order, and the rate ratio per pair and its median.
(s) ``sync_cost`` (with --sync-pairs N): N pairs of (b) with the extractor's power-loss fsyncs and with every
    fsync a no-op (``hsextract.api.syncs_off``), interleaved: the rate ratio per pair and its median
    (target >= 0.97), and the workers' share of time waiting for their samples' fsyncs.

Each extraction phase also gives when every pack process was up (``pack_processes_up_after_s``: forks, up at once;
until session 31 programs that imported torch, 1.5-2.5 s into a phase on one H100's host), when its last
row was written (``last_row_after_s``) and what the run did after it (``finish_s``: stopping the pack processes, the
format's index, data_config), its tokens a second from every process up to the last row
(``tokens_per_s_once_processes_up``: past the start and before the finish, fixed costs a phase of seconds mostly is,
but also the rows that waited while the processes started, drained faster than the forward makes them) and from the
phase's start to the last row (``tokens_per_s_to_last_row``: the start counted, the finish not); when the server
forwarded its first and last token and the first row was written (``first_forward_after_s``, ``last_forward_after_s``,
``first_row_after_s``), and a ``timeline`` in bins of half a second: the GPU's use, the tokens the server forwarded and
those the extractor wrote, so a phase shows where its GPU waited.
``e2e_vs_forward_ratio`` = (c) / (a); ``e2e_tmpfs_vs_limit_ratio`` = (c) / min((a), (t)); ``e2e_vs_limit_ratio`` = (b) /
min((a), (d)) (each ``..._once_processes_up`` too, from that pace, and (c)'s ``..._to_last_row``; the targets stay on
the whole phase); GPU utilisation (NVML) is sampled during each phase; per-stage seconds come from the server's
``/metrics`` and the extractor's ``hsextract_stage_seconds``; each extraction phase's ``per_row`` gives each side's user
and system CPU milliseconds and context switches per row written (a short row's fixed cost), the extractor's pack
processes as a side of their own (``pack_processes``, per row they packed, less what a process spends starting, measured
once and given as ``pack_process_start_cpu_s``; ``extractor`` is the run's own process); synchronizing CUDA calls on the
engine's forward thread are counted with ``torch.cuda.set_sync_debug_mode``. Reference checks on the GPU: (1) the
first rows of (c)'s output against a batch-1 plain forward of the same rows on the same bf16 model (own layer index vs
the neighbouring ones); (2) a float32 Llama-shaped small model through the embedded engine on CUDA,
batched with padding, against batch-1 float32 forwards at 1e-4. With ``--py-spy BINARY`` (a static
binary can be carried to the GPU host), (b) and (c) also profile the server, the extractor and its pack processes
(``bench/py_spy.py``): each phase's ``py_spy`` gives the share of samples per thread and per function (the pack
processes' as ``extractor_children``; ``--profile-native``: C and C++ frames too).
--cpu-smoke runs the whole script at toy sizes on the CPU (its numbers mean nothing); --device cpu runs it on the
CPU at the sizes given (``make bench-row-cost``: short rows on a tiny model, where the extraction path is all there
is to measure).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import platform
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import httpx
import torch
import transformers
from py_spy import Profiler, find_py_spy

from hsextract.api import (
    Engine,
    ExtractConfig,
    Extraction,
    ExtractMetrics,
    PackProcesses,
    SampleFile,
    ServeConfig,
    choose_direct,
    open_format,
    sync_file,
    syncs_off,
)
from hsextract.contract.files.dump_pages import tmpfs_mount
from hsextract.contract.files.dumps import read_dump
from hsextract.contract.files.fp8 import FP8_STORAGE, bytes_per_token, dequantize
from hsextract.contract.rids import make_rid

log = logging.getLogger("bench_gpu_e2e")
TARGETS = {"e2e_vs_forward_ratio": 0.9, "e2e_vs_limit_ratio": 0.9, "e2e_disk_tokens_per_s": 27000.0}
SYNC_COST_TARGET = 0.97  # (s): the rate with the power-loss fsyncs over the rate without (issue 36)
GB = 1e9
T = TypeVar("T")
DEFAULT_CONCURRENCY: int = ExtractConfig.model_fields["concurrency"].default


# -- helpers ----------------------------------------------------------------------------------------
class Results:
    """The result JSON, rewritten after every phase so a run cut short still leaves its figures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def update(self, **items: Any) -> None:
        self.data.update(items)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")


class GpuSampler:
    """Mean GPU utilisation (NVML, else nvidia-smi) over a phase, sampled every 100 ms."""

    def __init__(self) -> None:
        self._read: Callable[[], float] | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if torch.cuda.is_available() else 0)
            self._read = lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            self.source = "nvml"
        except Exception:
            if shutil.which("nvidia-smi"):
                self._read = _nvidia_smi_util
                self.source = "nvidia-smi"
            else:
                self.source = "none"

    def sampling(self, into: list[float]) -> AbstractContextManager[None]:
        return nullcontext() if self._read is None else sampled_every(0.1, self._read, into)

    def sampling_timed(self, into: list[tuple[float, float]]) -> AbstractContextManager[None]:
        """As :meth:`sampling`, each value with the ``time.perf_counter()`` it was read at."""
        read = self._read
        return nullcontext() if read is None else sampled_every(0.1, lambda: (time.perf_counter(), read()), into)


@contextmanager
def sampled_every(interval_s: float, read: Callable[[], T], into: list[T]) -> Iterator[None]:
    """``read()`` appended to ``into`` every ``interval_s`` during the block, on a thread of its own; a read that
    raises ends the sampling, not the phase."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            try:
                into.append(read())
            except Exception:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _nvidia_smi_util() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    return float(out.stdout.split()[0])


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def hardware(args: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "disk_dir": str(args.disk_dir),
        "disk_free_gb": shutil.disk_usage(args.disk_dir).free / GB,
        "tmpfs_dir": str(args.tmpfs_dir),
        "tmpfs_free_gb": shutil.disk_usage(args.tmpfs_dir).free / GB,
        # huge= of the tmpfs the dumps (and phase c's output) lie on: None when --tmpfs-dir is not a tmpfs
        "tmpfs_huge": (tmpfs_mount(args.tmpfs_dir) or (None, None))[1],
        "kernel": platform.release(),
        # no compiled .pyc beside torch's sources (a venv installed without them, PYTHONDONTWRITEBYTECODE): every pack
        # process's start compiles them, 5 s of CPU on one H100's host against 3.4 with them
        "torch_bytecode_cached": any((Path(torch.__file__).parent / "__pycache__").glob("*.pyc")),
    }
    with suppress(ValueError, OSError):
        info["memory_gb"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gb=props.total_memory / GB, gpu_sms=props.multi_processor_count)
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,pcie.link.gen.max", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        info["nvidia_smi"] = smi.stdout.strip()
    return info


# -- model and data -------------------------------------------------------------------------------
def llama_config(args: argparse.Namespace) -> Any:
    """The Llama of the requested shape (``--hidden``, ``--layers``, ...), Llama-3's RoPE and norm settings."""
    return transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def make_model(directory: Path, args: argparse.Namespace, device: torch.device) -> None:
    """A random-weight Llama of the requested shape, made on ``device`` and saved."""
    config = llama_config(args)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(args.torch_dtype)
    try:
        with device:
            model = transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    finally:
        torch.set_default_dtype(previous)
    model.config.dtype = args.dtype
    started = time.perf_counter()
    model.save_pretrained(str(directory))
    log.info(
        "model: %.2f B parameters, saved to %s in %.1f s", model.num_parameters() / 1e9, directory, time.perf_counter() - started
    )


def load_model(directory: Path, device: torch.device) -> Any:
    """The saved model loaded as ``hsextract serve`` loads it (same weights, same buffers: RoPE
    frequencies stay float32, which a model cast to bf16 in memory would not have)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    return model.to(device).eval()


def make_dataset(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Log-normal lengths around ``args.median``, the longest exactly ``args.longest``."""
    rng = random.Random(1234)
    lengths = [min(args.longest, max(16, round(rng.lognormvariate(math.log(args.median), args.sigma)))) for _ in range(args.rows)]
    lengths[max(range(args.rows), key=lengths.__getitem__)] = args.longest
    with open(path, "w") as handle:
        for length in lengths:
            ids = [rng.randrange(args.vocab) for _ in range(length)]
            mask = [0] * min(length, 64) + [1] * max(0, length - 64)
            handle.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    truncated = [min(length, args.max_seq_len) for length in lengths]
    return {
        "rows": args.rows,
        "median_length": statistics.median(lengths),
        "mean_length": statistics.fmean(lengths),
        "longest": max(lengths),
        "rows_truncated": sum(length > args.max_seq_len for length in lengths),
        "tokens_before_truncation": sum(lengths),
        "tokens": sum(truncated),
        "lengths_truncated": truncated,
    }


def read_rows(path: Path, max_seq_len: int) -> list[list[int]]:
    with open(path) as handle:
        return [json.loads(line)["input_ids"][:max_seq_len] for line in handle]


# -- (a) the plain forward ----------------------------------------------------------------------------
def sorted_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Row indices in batches: all rows sorted by length, consecutive rows while the padded batch fits."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and lengths[index] * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


@torch.inference_mode()
def plain_forward(model: Any, rows: list[list[int]], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    base = model.base_model
    lengths = [len(r) for r in rows]
    batches = sorted_batches(lengths, args.max_batch_tokens)

    def run(batch: list[int]) -> None:
        longest = max(lengths[i] for i in batch)
        ids = torch.zeros((len(batch), longest), dtype=torch.int64)
        for slot, index in enumerate(batch):
            ids[slot, : lengths[index]] = torch.tensor(rows[index])
        # An empty cache, as the engine passes: without one transformers reads a device value back in
        # every forward (its packed-sequence check), which would stall the queue of forwards.
        cache = transformers.DynamicCache(config=model.config)
        out = base(input_ids=ids.to(device, non_blocking=True), output_hidden_states=True, cache=cache)
        del out

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for batch in (batches[-1], batches[len(batches) // 2]):  # warm-up: the largest and a middle shape
        run(batch)
    sync()
    util: list[float] = []
    with SAMPLER.sampling(util):
        started = time.perf_counter()
        for batch in batches:
            run(batch)
        sync()
        seconds = time.perf_counter() - started
    tokens = sum(lengths)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches)
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "batches": len(batches),
        "padded_tokens": padded,
        "padding_fraction": 1 - tokens / padded,
        "gpu_util_mean": mean(util),
        "batching": "all rows sorted by length, consecutive rows up to the token budget (padded)",
    }


# -- (b), (c): serve + extract ---------------------------------------------------------------------
def scrape(url: str) -> dict[str, float]:
    """The server's /metrics as {name{labels}: value} for our counters and stage sums."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("hsextract_server_") and not sample.name.endswith("_bucket"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def server_stages(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    diff = {k: after[k] - before.get(k, 0.0) for k in after}
    stages = {
        key.split("stage=")[1].rstrip("}"): value
        for key, value in diff.items()
        if key.startswith("hsextract_server_stage_seconds_sum")
    }
    counts = {
        key.split("stage=")[1].rstrip("}"): value
        for key, value in diff.items()
        if key.startswith("hsextract_server_stage_seconds_count")
    }
    tokens, padded = diff.get("hsextract_server_tokens_total", 0.0), diff.get("hsextract_server_padded_tokens_total", 0.0)
    return {
        "stage_seconds_sum": stages,
        "stage_counts": counts,
        "batches": diff.get("hsextract_server_batches_total"),
        "tokens": tokens,
        "padded_tokens": padded,
        "padding_fraction": 1 - tokens / padded if padded else None,
        "dumps": diff.get("hsextract_server_dumps_total"),
        "dump_bytes": diff.get("hsextract_server_dump_bytes_total"),
    }


def process_usage(pid: int) -> dict[str, float]:
    """A process's user and system CPU seconds and context switches, all its threads. This process's own come from
    getrusage (its threads that ended count too); another's from /proc (its live threads' switches: the server's
    threads live as long as it does)."""
    if pid == os.getpid():
        return _getrusage(resource.RUSAGE_SELF)
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    usage = {"user_s": int(fields[11]) / tick, "system_s": int(fields[12]) / tick, "voluntary_switches": 0.0,
             "involuntary_switches": 0.0}  # fmt: skip
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with suppress(OSError):  # a thread that ended meanwhile
            for line in status.read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                    usage["voluntary_switches" if key[0] == "v" else "involuntary_switches"] += int(value)
    return usage


def ended_children_usage() -> dict[str, float]:
    """CPU seconds and switches of this process's children that have ended and been waited for. Across one extraction
    these are its pack processes, which the run closes before it returns (the server outlives the phase)."""
    return _getrusage(resource.RUSAGE_CHILDREN)


def pack_process_start_usage() -> dict[str, float]:
    """What one pack process spends before its first row, up and ended alone, as the run starts each (a fork since
    session 31; before, a program importing torch and the fork that stood in for it). Subtracted from the pack
    processes' CPU so that their ``per_row`` is what a row costs them: four programs' starts were 61-78 % of it over
    the wide model's phases of 6-9 s on one H100's host (issue 37)."""
    global _START_USAGE
    if _START_USAGE is None:
        before = ended_children_usage()
        with tempfile.TemporaryDirectory() as out:
            PackProcesses(1, open_format("specforge", Path(out)), Path(out)).close()
        after = ended_children_usage()
        _START_USAGE = {key: after[key] - value for key, value in before.items()}
    return _START_USAGE


_START_USAGE: dict[str, float] | None = None


def pack_process_rows_usage(used: dict[str, float], processes: int, start: dict[str, float]) -> dict[str, float]:
    """The pack processes' use over a phase less ``processes`` starts: what their rows cost them."""
    return {key: max(0.0, value - processes * start[key]) for key, value in used.items()}


def _getrusage(who: int) -> dict[str, float]:
    """:func:`process_usage`'s fields from ``getrusage(who)``."""
    used = resource.getrusage(who)
    return {"user_s": used.ru_utime, "system_s": used.ru_stime, "voluntary_switches": used.ru_nvcsw,
            "involuntary_switches": used.ru_nivcsw}  # fmt: skip


def per_row(used: dict[str, float], rows: int) -> dict[str, float]:
    """One process's CPU milliseconds and context switches per row written, from what it used over a phase."""
    return {
        "user_ms": used["user_s"] / rows * 1e3,
        "system_ms": used["system_s"] / rows * 1e3,
        "voluntary_switches": used["voluntary_switches"] / rows,
        "involuntary_switches": used["involuntary_switches"] / rows,
    }


def pack_processes_sample(metrics: ExtractMetrics) -> tuple[float, float, float]:
    """(now, tokens written, pack processes up), from the run's own metrics."""
    value = metrics.registry.get_sample_value
    return time.perf_counter(), value("hsextract_tokens_total") or 0.0, value("hsextract_pack_processes_up") or 0.0


def phase_timeline(
    samples: list[tuple[float, float, float]], processes: int, started: float, ended: float, tokens: int
) -> dict[str, float | None]:
    """When every pack process was up and when the last row was written (seconds into the phase), what the run did
    after its last row (``finish_s``: the pack processes stopped, the format's index, data_config), and the tokens a
    second from every process up to the last row: the pace of a run past its start and before its finish, fixed costs
    that are most of a phase of seconds."""
    last = next((at for at, written, _ in samples if written >= tokens), None)
    timeline = {
        "last_row_after_s": None if last is None else last - started,
        "finish_s": None if last is None else ended - last,
        # the start counted, the finish not: the processes' start is not made up by the rows that waited meanwhile
        "tokens_per_s_to_last_row": None if last is None or last <= started else tokens / (last - started),
    }
    up = next(((at, written) for at, written, count in samples if count >= processes), None)
    until = last if last is not None else ended
    if not processes or up is None or until - up[0] <= 0:
        return {"pack_processes_up_after_s": None, "tokens_per_s_once_processes_up": None, **timeline}
    return {
        "pack_processes_up_after_s": up[0] - started,
        "tokens_per_s_once_processes_up": (tokens - up[1]) / (until - up[0]),
        **timeline,
    }


TIMELINE_BIN_S = 0.5


def server_progress(url: str) -> tuple[float, float]:
    """(now, the server's tokens forwarded), from its /metrics: one line of the text, no parser, so that sampling it
    every quarter second costs the extractor's process next to nothing."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "hsextract_server_tokens_total":
            return time.perf_counter(), float(value)
    return time.perf_counter(), 0.0


def binned(samples: list[tuple[float, float]], started: float, ended: float, *, rate: bool) -> list[float]:
    """``(time, value)`` samples in bins of :data:`TIMELINE_BIN_S` from ``started``: a bin's mean value, or with
    ``rate`` its growth in thousands a second (a counter's pace); an empty bin repeats the last."""
    bins = max(1, math.ceil((ended - started) / TIMELINE_BIN_S))
    out: list[float] = []
    last = samples[0][1] if samples else 0.0
    for i in range(bins):
        lo, hi = started + i * TIMELINE_BIN_S, started + (i + 1) * TIMELINE_BIN_S
        inside = [value for at, value in samples if lo <= at < hi]
        if rate:
            end = inside[-1] if inside else last
            out.append(round((end - last) / TIMELINE_BIN_S / 1e3, 1))
            last = end
        else:
            out.append(round(mean(inside), 1) if inside else (out[-1] if out else 0.0))
    return out


def phase_progress(
    util: list[tuple[float, float]],
    server: list[tuple[float, float]],
    written: list[tuple[float, float, float]],
    started: float,
    ended: float,
    forwarded_before: float,
) -> dict[str, Any]:
    """Where a phase's seconds went, bin by bin: the GPU's use, the tokens the server forwarded and the tokens the
    extractor wrote (k/s); when the server forwarded its first and last token (``forwarded_before``: its count at the
    phase's start), and when the first row was written."""
    forwarded = [(started, forwarded_before), *server]
    first_forward = next((at for at, tokens in forwarded if tokens > forwarded_before), None)
    total = forwarded[-1][1]
    last_forward = next((at for at, tokens in forwarded if tokens >= total), None) if total > forwarded_before else None
    first_row = next((at for at, tokens, _ in written if tokens > 0), None)
    return {
        "first_forward_after_s": None if first_forward is None else first_forward - started,
        "last_forward_after_s": None if last_forward is None else last_forward - started,
        "first_row_after_s": None if first_row is None else first_row - started,
        "timeline": {
            "bin_s": TIMELINE_BIN_S,
            "gpu_util": binned(util, started, ended, rate=False),
            "forwarded_k_tokens_per_s": binned(forwarded, started, ended, rate=True),
            "written_k_tokens_per_s": binned([(at, tokens) for at, tokens, _ in written], started, ended, rate=True),
        },
    }


def log_rate(name: str, phase: dict[str, Any]) -> None:
    """An extraction phase's tokens a second, and from when every pack process was up when they were."""
    steady = phase.get("tokens_per_s_once_processes_up")
    since = f" ({steady:.0f} once every pack process was up, {phase['pack_processes_up_after_s']:.1f} s in)" if steady else ""
    finish = phase.get("finish_s")
    tail = f"; last row {phase['last_row_after_s']:.1f} s in, then {finish:.1f} s to finish" if finish is not None else ""
    log.info("%s: %.0f tokens/s%s%s", name, phase["tokens_per_s"], since, tail)
    if phase.get("first_forward_after_s") is not None and phase.get("last_forward_after_s") is not None:
        log.info(
            "%s: the server forwarded from %.2f s to %.2f s in; first row written %.2f s in",
            name,
            phase["first_forward_after_s"],
            phase["last_forward_after_s"],
            phase.get("first_row_after_s") or float("nan"),
        )


def extract(
    url: str, data: Path, output: Path, args: argparse.Namespace, expected_tokens: int, phase: str = ""
) -> dict[str, Any]:
    """One ``Extraction.run()`` against ``url``; with ``--py-spy``, ``phase`` names its profiles."""
    metrics = ExtractMetrics()
    config = ExtractConfig.model_validate(
        {
            "server": url,
            "dataset": data,
            "output": output,
            "max_seq_len": args.max_seq_len,
            "concurrency": args.concurrency,
            "pack_processes": args.pack_processes,
            "output_io": args.output_io,
            "format": args.format,
            "storage": args.storage,
            **({"rows_per_request": args.rows_per_request} if args.rows_per_request is not None else {}),
            "log_interval_s": 15.0,
        }
    )
    before = scrape(url)
    timed_util: list[tuple[float, float]] = []
    profiling = PROFILER.profiling(phase if phase in args.profile_phases.split(",") else "")
    with SAMPLER.sampling_timed(timed_util), profiling as profile:
        usage_before = {side: process_usage(pid) for side, pid in PROFILER.pids.items()}
        usage_before["pack_processes"] = ended_children_usage()
        watched: list[tuple[float, float, float]] = []
        served: list[tuple[float, float]] = []
        with (
            sampled_every(0.05, functools.partial(pack_processes_sample, metrics), watched),
            sampled_every(0.25, functools.partial(server_progress, url), served),
        ):
            started = time.perf_counter()
            summary = Extraction(config, metrics=metrics).run()
            ended = time.perf_counter()
        seconds = ended - started
        usage_after = {side: process_usage(pid) for side, pid in PROFILER.pids.items()}
        usage_after["pack_processes"] = ended_children_usage()
    used = {side: {key: usage_after[side][key] - value for key, value in usage.items()} for side, usage in usage_before.items()}
    cpu = {side: (u["user_s"] + u["system_s"]) / seconds for side, u in used.items()}
    processes = config.pack_processes_for(summary.total_samples)
    in_processes = int(metrics.registry.get_sample_value("hsextract_packed_in_process_total") or 0)
    # a side's cost per row it handled: the pack processes' over the rows they packed, less their starts; none packed
    # in a process (a short run: they were still starting) gives no figure
    rows = {side: summary.total_samples for side in used}
    start = pack_process_start_usage() if processes else None
    if start is not None:
        used["pack_processes"] = pack_process_rows_usage(used["pack_processes"], processes, start)
        rows["pack_processes"] = in_processes
    after = scrape(url)
    if summary.status != "complete" or summary.total_tokens != expected_tokens:
        raise RuntimeError(f"extraction ended {summary.status} with {summary.total_tokens}/{expected_tokens} tokens written")
    written = sum(json.loads(line)["bytes"] for line in (output / "samples.jsonl").read_text().splitlines())
    sync_started = time.perf_counter()
    os.sync()
    return {
        "seconds": seconds,
        "tokens": summary.total_tokens,
        "samples": summary.total_samples,
        "tokens_per_s": summary.total_tokens / seconds,
        "output_bytes": written,
        "output_gb_per_s": written / seconds / GB,
        "sync_after_s": time.perf_counter() - sync_started,
        "gpu_util_mean": mean([value for _, value in timed_util]),
        "gpu_util_samples": len(timed_util),
        "extractor_stage_seconds_sum": metrics.stage_totals(),
        "extractor_concurrency": args.concurrency,
        "pack_processes": processes,
        "packed_in_process": in_processes,
        **({"pack_process_start_cpu_s": start["user_s"] + start["system_s"]} if start is not None else {}),
        **phase_timeline(watched, processes, started, ended, summary.total_tokens),
        **phase_progress(timed_util, served, watched, started, ended, before.get("hsextract_server_tokens_total", 0.0)),
        "rows_per_request": config.rows_per_request,
        "posts": metrics.registry.get_sample_value("hsextract_rows_per_request_count"),
        # rows written from their dump whose answer had not come answer_grace_s later: a POST's rows are answered
        # together, so a spread of its rows' dumps past the grace would show here
        "late_answers": summary.late_answers,
        # each process's CPU seconds over the phase's: near 1.0 with mostly Python work is one GIL, saturated
        "cpu_seconds_per_second": cpu,
        # the same per row it handled (the pack processes': per row they packed, their starts taken out): a side's
        # fixed cost, which caps short rows at about 1000 / (its GIL-held ms) rows/s
        "per_row": {side: per_row(u, rows[side]) if rows[side] else None for side, u in used.items()},
        "server": server_stages(before, after),
        **({"py_spy": profile} if profile else {}),
    }


def alternating(pairs: int, first: str, second: str) -> Iterator[str]:
    """The arms of ``pairs`` pairs of runs, the first of each pair alternating (AB, BA, ...): on one machine each later
    run can be slower whatever it runs (bench/results-gpu-e2e-graphs.json, call 4), which a fixed order would credit
    to one arm."""
    for pair in range(pairs):
        yield from (first, second) if pair % 2 == 0 else (second, first)


def sync_cost(url: str, data: Path, disk: Path, args: argparse.Namespace, expected_tokens: int) -> dict[str, Any]:
    """(s): --sync-pairs pairs of (b) with its power-loss fsyncs and with every fsync a no-op, interleaved."""
    runs: dict[str, list[dict[str, Any]]] = {"synced": [], "unsynced": []}
    for arm in alternating(args.sync_pairs, "synced", "unsynced"):
        with syncs_off() if arm == "unsynced" else nullcontext():
            runs[arm].append(extract(url, data, disk / "sync-out", args, expected_tokens))
        shutil.rmtree(disk / "sync-out")
    ratios = [s["tokens_per_s"] / u["tokens_per_s"] for s, u in zip(runs["synced"], runs["unsynced"], strict=True)]
    stages = [run["extractor_stage_seconds_sum"] for run in runs["synced"]]
    return {
        "synced_vs_unsynced_rate_ratio": statistics.median(ratios),
        "pair_ratios": ratios,
        "synced_tokens_per_s": [run["tokens_per_s"] for run in runs["synced"]],
        "unsynced_tokens_per_s": [run["tokens_per_s"] for run in runs["unsynced"]],
        # the workers' wait for their samples' fsyncs over all their stages' seconds: unmoved by the drift
        "row_path_sync_share": statistics.median(st["sync"] / sum(st.values()) for st in stages),
        "target": SYNC_COST_TARGET,
    }


def pack_pairs(url: str, data: Path, tmpfs: Path, args: argparse.Namespace, expected_tokens: int) -> dict[str, Any]:
    """(p): --pack-pairs pairs of (c) on the row threads only (--pack-processes 0) and with pack processes (the
    --pack-processes given, else the CLI's default), in alternating order (:func:`alternating`)."""
    arms = {"threads": 0, "processes": args.pack_processes}
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    order = list(alternating(args.pack_pairs, "threads", "processes"))
    for arm in order:
        arm_args = argparse.Namespace(**{**vars(args), "pack_processes": arms[arm]})
        runs[arm].append(extract(url, data, tmpfs / "pack-out", arm_args, expected_tokens))
        shutil.rmtree(tmpfs / "pack-out")
    ratios = [p["tokens_per_s"] / t["tokens_per_s"] for p, t in zip(runs["processes"], runs["threads"], strict=True)]
    return {
        "processes_vs_threads_rate_ratio": statistics.median(ratios),
        "pair_ratios": ratios,
        "order": order,
        "pack_processes": runs["processes"][0]["pack_processes"],
        **{f"{arm}_tokens_per_s": [run["tokens_per_s"] for run in arm_runs] for arm, arm_runs in runs.items()},
        **{f"{arm}_packed_in_process": [run["packed_in_process"] for run in arm_runs] for arm, arm_runs in runs.items()},
    }


def start_server(
    model_dir: Path, dump_dir: Path, args: argparse.Namespace, log_path: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "hsextract",
        "serve",
        "--model",
        str(model_dir),
        "--dump-dir",
        str(dump_dir),
        "--port",
        str(port),
        "--device",
        args.device,
        "--max-batch-tokens",
        str(args.max_batch_tokens),
    ]
    if args.chunked_prefill_size is not None:
        command += ["--chunked-prefill-size", str(args.chunked_prefill_size)]
    if args.layer_ids:  # a model too shallow for the default three (--layers 4)
        command += ["--layer-ids", args.layer_ids]
    if getattr(args, "cuda_graphs", None) is not None:  # other benchmarks' arguments may not have it
        command += ["--cuda-graphs", args.cuda_graphs]
    if getattr(args, "dump_writers", None) is not None:
        command += ["--dump-writers", str(args.dump_writers)]
    if getattr(args, "dump_queue_size", None) is not None:
        command += ["--dump-queue-size", str(args.dump_queue_size)]
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}"


def serve_args(
    device: str, max_batch_tokens: int, chunked_prefill_size: int | None = None, layer_ids: str = ""
) -> argparse.Namespace:
    """What :func:`start_server` reads, for a benchmark whose own flags are not :func:`add_workload_args`'
    (None / empty: serve's own default)."""
    return argparse.Namespace(device=device, max_batch_tokens=max_batch_tokens,
                              chunked_prefill_size=chunked_prefill_size, layer_ids=layer_ids)  # fmt: skip


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server flushes its dumps), SIGKILL after 60 s."""
    server.terminate()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def wait_healthy(url: str, server: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 900.0) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s and server.poll() is None:
        try:
            if httpx.get(f"{url}/health_generate", timeout=60.0).status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    tail = log_path.read_text(errors="replace")[-4000:]
    raise RuntimeError(f"hsextract serve did not become healthy (exit code {server.poll()}); its log ends:\n{tail}")


# -- (d): the disk's limit ------------------------------------------------------------------------------
#: threads of the plain write: enough fsyncs in flight to keep a fast NVMe queue busy (the extractor has
#: --concurrency rows, each syncing its own file); bench_gpu_fleet uses this many per GPU
DISK_LIMIT_THREADS = 32
#: seconds (t) waits first: a guest kernel that reports free memory to its host hands back what (c) freed within
#: seconds, and writes into such memory went 0.11-0.19 x the pace of writes into memory just freed on the CI machine
#: (bench/results-fresh-memory.json); (c)'s output grows into memory left free since the run began
TMPFS_REST_S = 10.0
#: how the extractor writes sample files unless told (the CLI's --output-io), and the disk's limit with it
OUTPUT_IO = ExtractConfig.model_fields["output_io"].default
DISK_LIMIT_HOW = (
    "the disk's limit: the output's file sizes written from memory as the extractor writes its samples ({io}), "
    "{threads} threads, each file fsynced after its write and the folder at the end (durable as the extractor's row "
    "path makes each sample), in tokens/s"
)


def plain_write(
    directory: Path, sizes: list[int], tokens: int, threads: int = DISK_LIMIT_THREADS, output_io: str = OUTPUT_IO
) -> dict[str, Any]:
    """The disk's limit, one definition for every GPU benchmark (:data:`DISK_LIMIT_HOW`)."""
    directory.mkdir(parents=True)
    direct, why = choose_direct(output_io, directory)  # type: ignore[arg-type]  # "auto", "direct" or "buffered"
    block = os.urandom(1 << 20) * (max(sizes) // (1 << 20) + 1)
    view = memoryview(block)

    def write(item: tuple[int, int]) -> None:
        index, size = item
        path = directory / f"{index}.bin"
        with SampleFile(path, direct) as out:
            out.write(view[:size])
            out.finish()
        sync_file(path)  # the row's sync, once the file is written

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(write, enumerate(sizes)))
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    seconds = time.perf_counter() - started
    total = sum(sizes)
    shutil.rmtree(directory)
    return {
        "seconds": seconds,
        "bytes": total,
        "gb_per_s": total / seconds / GB,
        "tokens_per_s": tokens / seconds,  # the output of `tokens` tokens is `total` bytes
        "threads": threads,
        "how": DISK_LIMIT_HOW.format(threads=threads, io=("direct I/O, " if direct else "buffered, ") + why),
        "direct_io": direct,
    }


# -- reference checks -----------------------------------------------------------------------------------
#: the reference's largest error at a layer's own index, max |diff| / max |ref|: bf16 batch noise; FP8 adds its rounding,
#: up to 2**-4 of a token's largest value (e4m3's 3 mantissa bits)
REFERENCE_TOLERANCE = {"auto": 0.05, FP8_STORAGE: 0.1}


def stored_states(stored: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A stored sample's aux states ``[T, k, H]`` and final state ``[T, H]`` as float32 on ``device`` (FP8 dequantized)."""
    aux, final = stored.aux_hidden_states.to(device), stored.final_hidden_state.to(device)
    if stored.hidden_states_scales is None:
        return aux.float(), final.float()
    whole = dequantize(torch.cat([aux, final.unsqueeze(1)], dim=1), stored.hidden_states_scales.to(device), torch.float32)
    return whole[:, :-1], whole[:, -1]


@torch.inference_mode()
def reference_bf16(
    model: Any, output: Path, rows: int, aux_ids: list[int], device: torch.device, fmt_name: str = "specforge",
    storage: str = "auto",
) -> dict[str, Any]:  # fmt: skip
    """The first rows of an output against a batch-1 plain forward of each row on the same model. The final state is
    the final norm's output (specforge) or its input, the last layer's output (speculators: its trainer norms it)."""
    fmt = open_format(fmt_name, output)
    tolerance = REFERENCE_TOLERANCE[storage]
    prenorm: list[torch.Tensor] = []
    hook = model.base_model.norm.register_forward_hook(lambda _module, inputs, _output: prenorm.append(inputs[0][0]))
    worst_own, best_neighbour_margin, worst_final = 0.0, math.inf, 0.0
    try:
        for row in range(rows):
            stored = fmt.read_sample(row)
            ids = stored.input_ids.unsqueeze(0).to(device)
            out = model.base_model(input_ids=ids, output_hidden_states=True, use_cache=False)
            states = [h[0].float() for h in out.hidden_states]
            final_ref = prenorm[-1].float() if fmt_name == "speculators" else states[-1]
            prenorm.clear()
            aux, final = stored_states(stored, device)
            for k, layer_id in enumerate(aux_ids):
                got = aux[:, k]
                scale = states[layer_id + 1].abs().max().item()
                own = (got - states[layer_id + 1]).abs().max().item() / scale
                neighbours = [
                    (got - states[i]).abs().max().item() / scale for i in (layer_id, layer_id + 2) if 0 <= i < len(states) - 1
                ]
                worst_own = max(worst_own, own)
                best_neighbour_margin = min(best_neighbour_margin, min(neighbours) / max(own, 1e-9))
            worst_final = max(worst_final, (final - final_ref).abs().max().item() / final_ref.abs().max().item())
    finally:
        hook.remove()
    passed = worst_own < tolerance and worst_final < tolerance and best_neighbour_margin > 5
    return {
        "what": f"first rows of (c)'s output ({fmt_name}, storage {storage}) vs a batch-1 plain forward of each row, same "
        "bf16 model on the GPU; max |diff| / max |ref| at the layer's own hidden_states index, and how much farther the "
        "neighbouring indices are",
        "rows": rows,
        "tolerance": tolerance,
        "worst_relative_error_own_index": worst_own,
        "worst_relative_error_final": worst_final,
        "smallest_neighbour_over_own": best_neighbour_margin,
        "passed": passed,
    }


@torch.inference_mode()
def reference_fp32(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """A float32 Llama-shaped small model through the embedded engine (batched, padded) vs batch-1 forwards."""
    from hsextract.dev.tiny_model import make_tiny_model

    model_dir = make_tiny_model(work / "fp32-model", "llama", layers=8, hidden=256, vocab_size=4096, dtype="float32")
    dump_dir = work / "fp32-dumps"
    serve = ServeConfig(model=model_dir, dump_dir=dump_dir, device=args.device, max_batch_tokens=2048, chunked_prefill_size=256)
    engine = Engine(serve)
    rng = random.Random(7)
    prompts = [[rng.randrange(4096) for _ in range(rng.randint(20, 600))] for _ in range(12)]
    syncs: list[str] = []
    try:
        with sync_warnings(syncs, args.device == "cuda"):
            futures = [engine.submit(make_rid(i, len(p)), p) for i, p in enumerate(prompts)]
            # spot checks among the batches: their forwards run on the same thread and must not drain the queue
            checks = [engine.spot_check(f"check-{i}", p[:64]) for i, p in enumerate(prompts[::3])]
            for future in futures + checks:
                future.result(timeout=300)
    finally:
        engine.shutdown()
    on_forward_thread = [m for m in syncs if m.startswith("hsextract-scheduler:")]
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir).to(args.device).eval()
    worst = 0.0

    def relative(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got.to(want.device) - want).abs().max().item() / want.abs().max().item())

    for i, prompt in enumerate(prompts):
        dump = read_dump(dump_dir / make_rid(i, len(prompt)))
        ids = torch.tensor([prompt], device=args.device)
        states = reference.base_model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
        for k, layer_id in enumerate(engine.aux_layer_ids):
            worst = max(worst, relative(dump.aux_hidden_states[:, k], states[layer_id + 1][0]))
        worst = max(worst, relative(dump.final_hidden_state, states[-1][0]))
    return {
        "what": "float32 Llama (hidden 256, 8 layers) through the embedded engine on the device, 12 prompts of 20-600 "
        "tokens batched with padding and chunked at 256 (and 4 spot checks among them), vs batch-1 float32 forwards; "
        "max |diff| / max |ref|",
        "worst_relative_error": worst,
        "tolerance": 1e-4,
        "passed": worst < 1e-4,
        "device_syncs_on_forward_thread": len(on_forward_thread),
        "device_syncs_elsewhere": len(syncs) - len(on_forward_thread),
        "device_sync_examples": syncs[:5],
        "device_syncs_how": "torch.cuda.set_sync_debug_mode('warn') while the engine served the prompts; "
        "waits on one forward's own event are not device-wide and are not counted",
    }


@contextmanager
def sync_warnings(into: list[str], enabled: bool) -> Iterator[None]:
    """Record (thread: message) for every synchronizing CUDA call PyTorch warns about, any thread."""
    if not enabled:
        yield
        return

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        into.append(f"{threading.current_thread().name}: {str(message).splitlines()[0][:200]}")

    with warnings.catch_warnings():  # the filters and showwarning are process-wide: every thread
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)


# -- main -------------------------------------------------------------------------------------------------
def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The model's shape, the dataset and the extractor's concurrency: the flags every GPU benchmark shares."""
    add = parser.add_argument
    add("--rows", type=int, default=2000)
    add("--median", type=int, default=735, help="median prompt length")
    add("--sigma", type=float, default=0.6, help="log-normal sigma of the lengths")
    add("--longest", type=int, default=4096, help="the longest row's length")
    add("--max-seq-len", type=int, default=2048, help="the extractor truncates to this")
    add("--chunked-prefill-size", type=int, default=2048)
    add(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="extractor requests in flight (default: the CLI's, %(default)s)",
    )
    add("--cuda-graphs", choices=["auto", "on", "off"], default=None, help="the server's --cuda-graphs (default: its own)")
    add("--pack-processes", type=int, default=None, help="the extractor's pack processes (default: the CLI's)")
    add("--output-io", choices=["auto", "direct", "buffered"], default=OUTPUT_IO, help="how the extractor writes sample "
        "files, and the disk's limit (d) with them (default: %(default)s, the CLI's)")  # fmt: skip
    add("--dump-writers", type=int, default=None, help="the server's dump-writer threads (default: serve's)")
    add("--dump-queue-size", type=int, default=None, help="the server's batches queued for its dump writers, and half as "
        "many pinned buffers (default: serve's)")  # fmt: skip
    add("--rows-per-request", type=int, default=None, help="the extractor's rows in one /generate at most (default: the CLI's)")
    add("--hidden", type=int, default=4096)
    add("--intermediate", type=int, default=14336)
    add("--layers", type=int, default=32)
    add("--layer-ids", default="", help="the server's aux layers, comma-separated (default: serve's, which needs 5+ layers)")
    add("--heads", type=int, default=32)
    add("--kv-heads", type=int, default=8)
    add("--vocab", type=int, default=128256)
    add("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    add("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the same run on the CPU at the sizes given, for "
        "what the extraction path costs a row when the forward is cheap (default: %(default)s)")


def finish_args(args: argparse.Namespace) -> argparse.Namespace:
    """After a script's own --cpu-smoke workload sizes: the toy model, the device and the torch dtype."""
    if args.cpu_smoke:
        args.hidden, args.intermediate, args.layers, args.heads, args.kv_heads, args.vocab = 64, 128, 8, 4, 2, 1024
        args.device = "cpu"
    args.torch_dtype = getattr(torch, args.dtype)
    return args


def setup_logging(*noisy: str) -> None:
    """INFO to stderr, the named loggers (HTTP clients, per-row logs) held at WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in noisy:
        logging.getLogger(name).setLevel(logging.WARNING)


def output_bytes_per_token(args: argparse.Namespace) -> int:
    """A token's bytes in the output: three aux layers and the final state, as stored."""
    if args.storage == FP8_STORAGE:
        return bytes_per_token(3 + 1, args.hidden)
    return (3 + 1) * args.hidden * 2


def config_json(args: argparse.Namespace) -> dict[str, Any]:
    """The run's arguments as the result JSON records them."""
    return {k: (str(v) if isinstance(v, Path | torch.dtype) else v) for k, v in vars(args).items()}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--out", type=Path, default=Path("bench/results-gpu-e2e.json"), help="result JSON (default: %(default)s)")
    add(
        "--disk-dir", type=Path, default=Path(__file__).resolve().parent / "work", help="local disk scratch (default: bench/work)"
    )
    add(
        "--tmpfs-dir",
        type=Path,
        default=Path("/dev/shm"),
        help="tmpfs scratch: model, dumps, (c)'s output; its huge= option is recorded, so a tmpfs mounted "
        "huge=within_size measures the dumps in huge pages (default: %(default)s)",
    )
    add_workload_args(parser)
    add("--max-batch-tokens", type=int, default=16384, help="token budget of one forward, (a) and the server")
    add("--reference-rows", type=int, default=8, help="rows of (c)'s output compared with a plain forward")
    add("--skip", default="", help="comma-separated phases to skip: a,b,c,d,t,ref")
    add("--format", choices=["specforge", "speculators"], default="specforge", help="the extractor's --format in (b) and "
        "(c) (default: %(default)s)")  # fmt: skip
    add("--storage", choices=["auto", FP8_STORAGE], default="auto", help="the extractor's --storage: float8_e4m3fn "
        "(speculators only) stores half the bytes, so (d) writes FP8-sized files (default: %(default)s)")  # fmt: skip
    add("--pack-pairs", type=int, default=0, help="(p): pairs of (c) without and with pack processes (--pack-processes, "
        "else the CLI's default), in alternating order (default: 0, none)")
    add("--sync-pairs", type=int, default=0, help="(s): pairs of (b) with and without the power-loss fsyncs "
        "(hsextract.api.syncs_off), interleaved; the rate ratio's target >= 0.97 (default: 0, not run)")  # fmt: skip
    add("--py-spy", default="", help="a py-spy binary: profile the server, the extractor and its pack processes during "
        "(b) and (c), summarised in each phase's py_spy (the pack processes as extractor_children), raw samples beside --out")
    add("--profile-phases", default="b,c", help="the phases --py-spy profiles (default: %(default)s)")
    add("--profile-delay-s", type=float, default=3.0, help="seconds into a phase before its profile starts")
    add("--profile-seconds", type=float, default=15.0, help="longest profile of one phase")
    add("--profile-idle", action="store_true", help="sample waiting threads too (py-spy --idle): where rows wait")
    add("--profile-native", action="store_true", help="sample C and C++ frames too (py-spy --native): where a pack "
        "process's copy, check and checksum spend their time; py-spy pauses each process at each sample then")
    add("--profile-gil", action="store_true", help="sample only the thread holding the GIL (py-spy --gil): what a "
        "GIL-bound process spends its interpreter on")
    add("--switch-interval", type=float, default=None, help="sys.setswitchinterval for this process (the extractor "
        "side) during the phases: how long a thread wanting the GIL waits for a running one (default: Python's 0.005)")
    add("--cpu-smoke", action="store_true", help="toy sizes on the CPU: checks the script end to end, measures nothing")
    args = parser.parse_args()
    if args.storage == FP8_STORAGE and args.format != "speculators":
        parser.error("--storage float8_e4m3fn needs --format speculators (the one format that stores FP8)")
    if args.cpu_smoke:
        args.rows, args.median, args.longest, args.max_seq_len = 24, 60, 300, 200
        args.max_batch_tokens, args.chunked_prefill_size, args.concurrency = 512, 128, 8
        args.reference_rows, args.dtype = 4, "bfloat16"
    return finish_args(args)


SAMPLER: GpuSampler
PROFILER: Profiler


def main() -> int:
    global SAMPLER, PROFILER
    setup_logging("httpx", "httpcore", "transformers", "hsextract.extract.planning.dataset")
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-smoke to check the script on the CPU, or --device cpu")
    skip = {s for s in args.skip.split(",") if s}
    device = torch.device(args.device)
    args.disk_dir.mkdir(parents=True, exist_ok=True)
    SAMPLER = GpuSampler()
    py_spy = find_py_spy(args.py_spy) if args.py_spy else None
    PROFILER = Profiler(
        py_spy,
        args.out.with_suffix(""),
        args.profile_delay_s,
        args.profile_seconds,
        idle=args.profile_idle,
        gil=args.profile_gil,
        children=frozenset({"extractor"}),  # its pack processes: extractor_children
        native=args.profile_native,
    )
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    results = Results(args.out)
    disk = Path(tempfile.mkdtemp(prefix="hsx-e2e-", dir=args.disk_dir))
    tmpfs = Path(tempfile.mkdtemp(prefix="hsx-e2e-", dir=args.tmpfs_dir))
    server: subprocess.Popen[bytes] | None = None
    config = config_json(args)
    results.update(hardware=hardware(args), config=config, targets=TARGETS, gpu_util_source=SAMPLER.source)
    try:
        make_model(tmpfs / "model", args, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        data = tmpfs / "data.jsonl"
        dataset = make_dataset(data, args)
        rows = read_rows(data, args.max_seq_len)
        tokens = sum(len(r) for r in rows)
        need = tokens * output_bytes_per_token(args) * 1.05
        free = shutil.disk_usage(disk).free
        if "b" not in skip and need > free:
            raise SystemExit(
                f"{disk} has {free / GB:.1f} GB free, (b) writes about {need / GB:.1f} GB: pass --disk-dir elsewhere"
            )
        free = shutil.disk_usage(tmpfs).free
        if "c" not in skip and need > free:
            raise SystemExit(
                f"{tmpfs} has {free / GB:.1f} GB free, (c) writes about {need / GB:.1f} GB: pass --tmpfs-dir elsewhere"
            )
        results.update(dataset={k: v for k, v in dataset.items() if k != "lengths_truncated"})
        log.info("dataset: %d rows, %d tokens after truncation to %d", args.rows, tokens, args.max_seq_len)
        server_log = disk / "server.log"
        server, url = start_server(tmpfs / "model", tmpfs / "dumps", args, server_log)
        PROFILER.pids = {"server": server.pid, "extractor": os.getpid()}
        if "ref" not in skip:
            results.update(reference_fp32=reference_fp32(tmpfs, args))
            log.info("fp32 reference: %s", results.data["reference_fp32"])
        model = load_model(tmpfs / "model", device)
        healthy_s = wait_healthy(url, server, server_log)
        log.info("server healthy after %.1f s", healthy_s)
        phases: dict[str, Any] = {}
        if "a" not in skip:
            phases["a_forward"] = plain_forward(model, rows, args, device)
            log.info("(a) forward: %.0f tokens/s", phases["a_forward"]["tokens_per_s"])
            results.update(phases=phases)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if "b" not in skip:
            phases["b_e2e_disk"] = extract(url, data, disk / "out", args, tokens, phase="b")
            log_rate("(b) e2e disk", phases["b_e2e_disk"])
            results.update(phases=phases)
            sizes = [json.loads(line)["bytes"] for line in (disk / "out" / "samples.jsonl").read_text().splitlines()]
            shutil.rmtree(disk / "out")
        else:
            sizes = [len(r) * output_bytes_per_token(args) + 2000 for r in rows]
        if args.sync_pairs:
            phases["s_sync_cost"] = sync_cost(url, data, disk, args, tokens)
            log.info("(s) synced vs unsynced: %.3f", phases["s_sync_cost"]["synced_vs_unsynced_rate_ratio"])
            results.update(phases=phases)
        if "c" not in skip:
            phases["c_e2e_tmpfs"] = extract(url, data, tmpfs / "out", args, tokens, phase="c")
            log_rate("(c) e2e tmpfs", phases["c_e2e_tmpfs"])
            results.update(phases=phases)
            if "ref" not in skip:
                aux_ids = json.loads((tmpfs / "out" / "data_config.json").read_text())["aux_layer_ids"]
                reference = reference_bf16(model, tmpfs / "out", args.reference_rows, aux_ids, device, args.format, args.storage)
                results.update(reference_bf16=reference)
                log.info("bf16 reference: %s", results.data["reference_bf16"])
            shutil.rmtree(tmpfs / "out")
        if args.pack_pairs:
            phases["p_pack_pairs"] = pack_pairs(url, data, tmpfs, args, tokens)
            log.info("(p) pack processes vs threads: %.3f", phases["p_pack_pairs"]["processes_vs_threads_rate_ratio"])
            results.update(phases=phases)
        if "d" not in skip:
            phases["d_disk_write"] = plain_write(disk / "plain", sizes, tokens, output_io=args.output_io)
            log.info("(d) plain write: %.2f GB/s", phases["d_disk_write"]["gb_per_s"])
            results.update(phases=phases)
        if "t" not in skip:
            time.sleep(0.0 if args.cpu_smoke else TMPFS_REST_S)  # TMPFS_REST_S says why
            phases["t_tmpfs_write"] = plain_write(tmpfs / "plain", sizes, tokens, output_io="buffered")
            log.info("(t) plain write to tmpfs: %.2f GB/s", phases["t_tmpfs_write"]["gb_per_s"])
            results.update(phases=phases)
        summary = headline(phases)
        results.update(**summary)
        print(json.dumps(summary, indent=1))
    finally:
        if server is not None:
            stop_server(server)
            log_copy = args.out.with_name(args.out.stem + "-server.log")
            shutil.copyfile(disk / "server.log", log_copy)
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    return 0


def headline(phases: dict[str, Any]) -> dict[str, Any]:
    rate = {name: phase.get("tokens_per_s") for name, phase in phases.items()}
    a, b, c, d, t = (rate.get(k) for k in ("a_forward", "b_e2e_disk", "c_e2e_tmpfs", "d_disk_write", "t_tmpfs_write"))
    out: dict[str, Any] = {"tokens_per_s": rate}
    # the same past the run's start (its plan, the pack processes' forks; before them, seconds of imports)
    steady = {name: phase.get("tokens_per_s_once_processes_up") for name, phase in phases.items()}
    if a and c:
        out["e2e_vs_forward_ratio"] = c / a
        if steady.get("c_e2e_tmpfs"):
            out["e2e_vs_forward_ratio_once_processes_up"] = steady["c_e2e_tmpfs"] / a
        if phases["c_e2e_tmpfs"].get("tokens_per_s_to_last_row"):
            out["e2e_vs_forward_ratio_to_last_row"] = phases["c_e2e_tmpfs"]["tokens_per_s_to_last_row"] / a
    if a and c and t:
        out["e2e_tmpfs_vs_limit_ratio"] = c / min(a, t)
        out["tmpfs_limit"] = "forward" if a <= t else "tmpfs"
    if a and b and d:
        out["e2e_vs_limit_ratio"] = b / min(a, d)
        out["limit"] = "forward" if a <= d else "disk"
        if steady.get("b_e2e_disk"):
            out["e2e_vs_limit_ratio_once_processes_up"] = steady["b_e2e_disk"] / min(a, d)
    if b is not None:
        out["e2e_disk_tokens_per_s"] = b
        out["gpu_util_mean_during_b"] = phases["b_e2e_disk"]["gpu_util_mean"]
    out["met"] = {name: name in out and out[name] >= target for name, target in TARGETS.items()}
    return out


if __name__ == "__main__":
    sys.exit(main())
