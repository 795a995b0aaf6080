"""GPU benchmark of the SGLang dump hook (``hsextract.capture.sglang.hook``) on a Kimi-shaped extend batch.

No SGLang: ``HiddenStateDumper`` is built directly and ``on_logits`` gets a stand-in ForwardBatch (default
2 requests x 8192 tokens, 3 aux layers + final, hidden 7168, bf16, on the GPU), the aux states packed
``[n, 3H]`` (DeepSeek) and as a list of 3 ``[n, H]``. For each form, after one batch read back and compared:
1. hold: host time of ``on_logits`` (no sync), a simulated forward (bf16 matmuls, ~--forward-ms, default
   stream) between batches so the side-stream copy and the writer overlap compute; that forward's GPU
   time (CUDA events) with the hook over without; medians of ``pool.acquire``,
   ``HostCopier._copy_on_side_stream``, ``sink.submit``.
2. sustained: --batches batches back to back, then ``sink.flush()``: hidden.safetensors bytes over the
   wall time; the writer's time in ``write_dump``. A cleaner thread deletes finished dumps as they appear.
3. naive: ``hidden.cpu()`` + ``aux.cpu()`` + ``input_ids.cpu()`` (pageable, synchronous).
Context: raw ``save_file`` rate of one dump's tensors on the dump root. JSON to --out, a summary on stdout;
--cpu-smoke: tiny shapes on the CPU to check the script end to end (its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import save_file

from hsextract.api import HiddenStateDumper, HookConfig, dump_sink
from hsextract.contract.files.dumps import HIDDEN_FILE, read_dump
from hsextract.contract.rids import make_rid

TARGETS = {"hold_p90_ms_max": 10.0, "sustained_gb_per_s_min": 2.0}
GB = 1e9


class Cleaner:
    """Deletes finished dumps under ``root`` (polling, as the extractor would), counting their bytes."""

    def __init__(self, root: Path) -> None:
        self.root, self.bytes, self.dumps, self.errors = root, 0, 0, list[str]()
        self._stop, self._thread = threading.Event(), threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for directory in list(self.root.iterdir()):
                if (directory / "done").exists():
                    self.bytes += (directory / HIDDEN_FILE).stat().st_size
                    self.dumps += 1
                elif (directory / "error").exists():
                    self.errors.append(f"{directory.name}: {(directory / 'error').read_text()}")
                else:
                    continue
                shutil.rmtree(directory)

    def wait_for(self, dumps: int, stop: bool = False, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.dumps + len(self.errors) < dumps and time.monotonic() < deadline:
            time.sleep(0.01)
        if stop:
            self._stop.set()
            self._thread.join()


class SimForward:
    """Matmuls ping-ponging two [n, H] activations on the default stream (bf16 on CUDA), ~target_s each."""

    def __init__(self, device: torch.device, tokens: int, hidden: int, target_s: float) -> None:
        self.cuda = device.type == "cuda"
        dtype = torch.bfloat16 if self.cuda else torch.float32
        self.x, self.y = (torch.randn(tokens, hidden, device=device, dtype=dtype) for _ in range(2))
        self.w, self.steps = torch.randn(hidden, hidden, device=device, dtype=dtype) / hidden**0.5, 10
        self.launch()()  # warm-up
        self.steps = max(1, round(target_s / (self.launch()() / self.steps)))

    def launch(self) -> Callable[[], float]:
        """Queue one forward; the returned function waits for it and gives its seconds (GPU time on CUDA)."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
        began = time.perf_counter()
        for step in range(self.steps):
            a, b = (self.x, self.y) if step % 2 == 0 else (self.y, self.x)
            torch.matmul(a, self.w, out=b)
        if not self.cuda:
            host = time.perf_counter() - began
            return lambda: host
        end.record()

        def wait() -> float:
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3

        return wait


class Probe:
    """Times the hook's stages (wrapped on one dumper) and the writer's write_dump: the last call, and totals."""

    def __init__(self, dumper: HiddenStateDumper) -> None:
        self.last, self.total, self._originals = dict[str, float](), dict[str, float](), list[tuple[Any, str, Any]]()
        for name, owner, attr in (
            ("acquire", dumper.copier.pool, "acquire"),
            ("copy_launch", dumper.copier, "_copy_on_side_stream"),
            ("submit", dumper.sink, "submit"),
            ("write", dump_sink, "write_dump"),
        ):
            self._originals.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, self._wrap(name, getattr(owner, attr)))

    def close(self) -> None:
        for owner, attr, original in self._originals:
            setattr(owner, attr, original)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:  # "write" runs on the writer thread
                self.last[name] = elapsed = time.perf_counter() - began
                self.total[name] = self.total.get(name, 0.0) + elapsed

        return timed


def ms(values: list[float]) -> dict[str, float]:
    ordered, n = sorted(values), len(values)
    return {"median": 1e3 * statistics.median(ordered), "p90": 1e3 * ordered[min(n - 1, int(0.9 * n))], "max": 1e3 * ordered[-1]}


class Bench:
    def __init__(self, args: argparse.Namespace, device: torch.device, root: Path) -> None:
        self.args, self.root, self.row = args, root, 0
        n, h, k, bf16 = args.requests * args.tokens, args.hidden, len(args.layer_ids), torch.bfloat16
        self.input_ids = torch.randint(0, 160_000, (n,), device=device)
        self.hidden = torch.randn(n, h, device=device, dtype=bf16)
        self.aux_packed = torch.randn(n, k * h, device=device, dtype=bf16)
        self.aux_list = [torch.randn(n, h, device=device, dtype=bf16) for _ in range(k)]
        self.forward = SimForward(device, n, h, args.forward_ms / 1e3)

    def call(self, dumper: HiddenStateDumper, form: str) -> float:
        """One extend batch of fresh rids through the hook; the host seconds of the call."""
        t, rids = self.args.tokens, [make_rid(self.row + r, self.args.tokens) for r in range(self.args.requests)]
        self.row += self.args.requests
        batch = SimpleNamespace(  # what the hook reads of SGLang's ForwardBatch
            forward_mode=SimpleNamespace(is_extend_without_speculative=lambda: True),
            rids=rids,
            extend_seq_lens_cpu=[t] * len(rids),
            extend_prefix_lens_cpu=[0] * len(rids),
        )
        aux = self.aux_packed if form == "packed" else self.aux_list
        began = time.perf_counter()
        dumper.on_logits((self.input_ids, self.hidden, None, batch, aux))
        return time.perf_counter() - began

    def verify(self, dumper: HiddenStateDumper, form: str, root: Path) -> bool:
        first, t = self.row, self.args.tokens
        self.call(dumper, form)
        dumper.sink.flush()
        aux = self.aux_packed.view(len(self.hidden), -1, self.args.hidden) if form == "packed" else torch.stack(self.aux_list, 1)
        ok = True
        for r in range(self.args.requests):
            rows = slice(r * t, (r + 1) * t)
            dump = read_dump(root / make_rid(first + r, t))
            ok &= torch.equal(dump.input_ids, self.input_ids[rows].cpu())
            ok &= torch.equal(dump.final_hidden_state, self.hidden[rows].cpu())
            ok &= torch.equal(dump.aux_hidden_states, aux[rows].cpu())
            shutil.rmtree(root / dump.rid)
        return bool(ok)

    def measure_form(self, form: str) -> dict[str, Any]:
        args, root = self.args, self.root / form
        dumper = HiddenStateDumper(HookConfig.parse({"dump_dir": str(root), "layer_ids": list(args.layer_ids)}))
        verified = self.verify(dumper, form, root)
        warmup = dumper.config.queue_size + 2  # back to back: every pinned slot of the pool gets allocated
        for _ in range(warmup):
            self.call(dumper, form)
        dumper.sink.flush()
        cleaner, probe = Cleaner(root), Probe(dumper)
        # 1. hold, paced by a simulated forward; the forward without the hook: half before, half after.
        half = max(1, args.batches // 2)
        plain_fwd = [self.forward.launch()() for _ in range(half)]
        holds, fwd, stages = [], [], []
        for _ in range(args.batches):
            wait = self.forward.launch()
            holds.append(self.call(dumper, form))
            stages.append(dict(probe.last))
            fwd.append(wait())  # the next forward overlaps this batch's copy and write, as in a server
        dumper.sink.flush()
        plain_fwd += [self.forward.launch()() for _ in range(half)]
        # 2. sustained: back to back.
        done = (warmup + args.batches) * args.requests
        cleaner.wait_for(done)
        before_bytes, before_write = cleaner.bytes, probe.total.get("write", 0.0)
        began = time.perf_counter()
        burst_holds = [self.call(dumper, form) for _ in range(args.batches)]
        dumper.sink.flush()
        elapsed, write_s = time.perf_counter() - began, probe.total["write"] - before_write
        cleaner.wait_for(done + args.batches * args.requests, stop=True)
        written, removed = cleaner.bytes - before_bytes, cleaner.dumps - done
        probe.close()
        dumper.sink.close()
        # 3. naive: pageable, synchronous (nothing is queued on the GPU: the flush waited for every copy).
        naive = []
        for _ in range(args.naive_reps):
            began = time.perf_counter()
            self.hidden.cpu()
            _ = [a.cpu() for a in self.aux_list] if form == "list" else self.aux_packed.cpu()
            self.input_ids.cpu()
            naive.append(time.perf_counter() - began)
        hold = ms(holds)
        breakdown: dict[str, Any] = {k: ms([s.get(k, 0.0) for s in stages]) for k in ("acquire", "copy_launch", "submit")}
        breakdown["other_median"] = hold["median"] - sum(v["median"] for v in breakdown.values())
        plain, hooked = statistics.median(plain_fwd), statistics.median(fwd)
        return {
            "verified_readback": verified,
            "hold_ms": hold,
            "hold_breakdown_ms": breakdown,
            "forward_s": {"without_hook_median": plain, "with_hook_median": hooked, "ratio": hooked / plain},
            "sustained": {
                "batches": args.batches,
                "bytes": written,
                "seconds": elapsed,
                "gb_per_s": written / elapsed / GB,
                "dumps_removed": removed,
                "hold_ms": ms(burst_holds),
                "writer_write_dump_s": write_s,
                "write_dump_gb_per_s": written / write_s / GB if write_s else None,
            },
            "naive_ms": ms(naive),
            "naive_over_hook_hold": statistics.median(naive) / statistics.median(holds),
            "dumps_failed": dumper.sink.dumps_failed,
            "errors": cleaner.errors[:5],
        }

    def raw_save_rate(self) -> dict[str, float]:
        t, h, k = self.args.tokens, self.args.hidden, len(self.args.layer_ids)
        tensors = {
            "input_ids": torch.zeros(t, dtype=torch.int64),
            "aux_hidden_states": torch.randn(t, k, h).bfloat16(),
            "final_hidden_state": torch.randn(t, h).bfloat16(),
        }
        path, rates, size = self.root / "raw.safetensors", [], 0
        for _ in range(self.args.raw_reps):
            began = time.perf_counter()
            save_file(tensors, str(path))
            rates.append((size := path.stat().st_size) / (time.perf_counter() - began) / GB)
            path.unlink()
        return {"bytes_per_file": size, "gb_per_s_median": statistics.median(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU: checks the script, measures nothing")
    parser.add_argument("--dump-root", type=Path, default=Path("/dev/shm"), help="where dumps go; needs 6 batches free")
    parser.add_argument("--requests", type=int, default=2, help="requests per extend batch")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per request")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument(
        "--layer-ids", type=lambda s: [int(x) for x in s.split(",")], default=[2, 30, 58], help="aux layers, comma-separated"
    )
    parser.add_argument("--batches", type=int, default=20, help="timed batches per phase and aux form")
    parser.add_argument("--forward-ms", type=float, default=460.0, help="simulated forward time per batch")
    args = parser.parse_args()
    args.naive_reps, args.raw_reps = 5, 6
    if args.cpu_smoke:
        args.tokens, args.hidden, args.batches, args.forward_ms, args.naive_reps, args.raw_reps = 64, 256, 4, 20.0, 2, 2
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device: use --cpu-smoke to check the script on the CPU")
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    shm = shutil.disk_usage("/dev/shm") if Path("/dev/shm").is_dir() else None
    batch_bytes = args.requests * args.tokens * (args.hidden * (len(args.layer_ids) + 1) * 2 + 8)
    if shutil.disk_usage(args.dump_root).free < 6 * batch_bytes:
        raise SystemExit(f"{args.dump_root} has less than {6 * batch_bytes / GB:.1f} GB free: pass another --dump-root")
    root = Path(tempfile.mkdtemp(prefix="hsx-bench-", dir=args.dump_root))
    try:
        bench = Bench(args, device, root)
        result: dict[str, Any] = {
            "env": {
                "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "none (cpu smoke)",
                "torch": torch.__version__,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "dev_shm_total_gb": shm.total / GB if shm else None,
                "dump_root": str(root),
                "cpu_smoke": args.cpu_smoke,
            },
            "shapes": {
                "requests": args.requests,
                "tokens_per_request": args.tokens,
                "tokens": args.requests * args.tokens,
                "hidden": args.hidden,
                "layer_ids": args.layer_ids,
                "dtype": "bfloat16",
                "batch_bytes": batch_bytes,
            },
            "simulated_forward": {"steps": bench.forward.steps, "target_ms": args.forward_ms},
            "raw_save_file": bench.raw_save_rate(),
            "aux_forms": {form: bench.measure_form(form) for form in ("packed", "list")},
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    forms = result["aux_forms"].values()
    worst_p90, worst_rate = max(f["hold_ms"]["p90"] for f in forms), min(f["sustained"]["gb_per_s"] for f in forms)
    result["targets"] = {
        **TARGETS,
        "hold_p90_ms_worst": worst_p90,
        "hold_met": worst_p90 <= TARGETS["hold_p90_ms_max"],
        "sustained_gb_per_s_worst": worst_rate,
        "sustained_met": worst_rate >= TARGETS["sustained_gb_per_s_min"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    env, t = result["env"], result["targets"]
    print(
        f"{env['gpu']}, torch {env['torch']}, {env['cpus']} CPUs, /dev/shm {env['dev_shm_total_gb'] or 0:.1f} GB, "
        f"batch {batch_bytes / GB:.2f} GB; raw save_file {result['raw_save_file']['gb_per_s_median']:.2f} GB/s"
    )
    for form, r in result["aux_forms"].items():
        h, b, s = r["hold_ms"], r["hold_breakdown_ms"], r["sustained"]
        print(
            f"{form}: hold median {h['median']:.2f} p90 {h['p90']:.2f} ms (acquire {b['acquire']['median']:.2f}, copy "
            f"{b['copy_launch']['median']:.2f}, submit {b['submit']['median']:.2f}); naive {r['naive_ms']['median']:.0f} ms "
            f"(x{r['naive_over_hook_hold']:.0f}); fwd ratio {r['forward_s']['ratio']:.3f}; sustained {s['gb_per_s']:.2f} "
            f"GB/s (write_dump {s['write_dump_gb_per_s'] or 0:.2f}, burst hold {s['hold_ms']['median']:.0f} ms); "
            f"verified {r['verified_readback']}, failed {r['dumps_failed']}"
        )
    print(f"targets: hold p90 <= 10 ms {t['hold_met']} ({worst_p90:.2f}); >= 2 GB/s {t['sustained_met']} ({worst_rate:.2f})")


if __name__ == "__main__":
    main()
