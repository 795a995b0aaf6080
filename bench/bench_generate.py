"""Decode throughput of the embedded server against transformers' ``generate``; writes one JSON of ratios.

For each concurrency C (default 1, 16, 64): C prompts of --prompt-len random tokens, each decoding
exactly --new-tokens greedy tokens (``ignore_eos``), sent at once over HTTP to an in-process
``hsextract serve`` (``Engine`` + ``HttpFront``: continuous batching, capture/embedded/decode.py),
against one ``model.generate(do_sample=False)`` call on the same C prompts as one batch. Decode tokens/s
is ``C * new_tokens / wall`` (prefill included in both), after one warm-up run of each. For the server
the fastest run's wall time is split (``where``) into its prefill forwards (requests are admitted as they
arrive, so C requests may take several), its decode steps (``hsextract_server_decode_seconds``) and the
rest (HTTP, admission, answering), to compare with ``generate``'s seconds per new token. The server's
requests come from C threads in another process over kept-alive connections, as regeneration's do (the
client's threads would otherwise take the server's interpreter lock). Each case runs in its own
subprocess, so its peak memory is its own: the process's peak RSS on the CPU, and
``torch.cuda.max_memory_allocated`` on a GPU.

With ``--profile DIR`` each case runs once more under ``torch.profiler`` (every thread: the server decodes on its
own): ``DIR/<server|hf>-<C>.txt`` holds the operators by self CPU time (and by device time on a GPU), and the
case's ``profile`` counts per decode step (per new token for ``generate``) the operators, kernel launches,
host-device copies and synchronizations, and the self CPU seconds: where a step's time goes when the GPU
waits on the host.

``--decode dynamic,static,graphs`` runs the server once per variant of its generation KV cache (transformers'
growing cache, ``--decode-kv dynamic``; the fixed buffers with the step run eagerly, ``--no-decode-graphs``; and
the server's defaults, the step replayed as a CUDA graph on a GPU), each against
the same ``generate``: ``by_decode`` holds each variant's figures and ratio; ``server`` is the first. Each
variant's greedy tokens are compared with ``generate``'s and the first variant's for the same prompts
(``greedy_vs_*``: sequences equal throughout, and the share of tokens before the first difference).

CPU (``make bench-generate``): a tiny random Llama. GPU: ``--device cuda --shape 8b`` builds a
Llama-3-8B-shaped random bf16 model (32 layers, hidden 4096, 8 KV heads, vocab 128256) once in
--work-dir.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=512,
                 vocab_size=4096),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
               vocab_size=128256),
}  # fmt: skip


def make_model(directory: Path, shape: str, dtype: str, device: str) -> Path:
    import transformers

    if (directory / "config.json").exists():
        return directory
    config = transformers.LlamaConfig(**SHAPES[shape], max_position_embeddings=8192, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))  # type: ignore[no-untyped-call]
    model.config.dtype = dtype
    model.save_pretrained(str(directory))
    return directory


def _prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(count)
    return torch.randint(3, vocab, (count, length), generator=generator).tolist()


def _peak(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


#: runtime calls counted per step by --profile (CUDA runtime and driver names, as the profiler records them)
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPIES = ("cudaMemcpyAsync", "cudaMemcpy")


@contextmanager
def profiled(args: argparse.Namespace, name: str, steps: Callable[[], int], into: dict[str, Any]) -> Iterator[None]:
    """With ``--profile``, profile the block (every thread) and put per-step counts in ``into["profile"]``;
    ``steps`` says, once the block has run, how many decode steps (or new tokens) it took."""
    if args.profile is None:
        yield
        return
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities, experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        yield
    events = prof.key_averages()
    count = max(steps(), 1)

    def calls(names: tuple[str, ...]) -> float:
        return sum(e.count for e in events if e.key in names) / count

    into["profile"] = {
        "steps": count,
        "aten_ops_per_step": sum(e.count for e in events if e.key.startswith("aten::")) / count,
        "launches_per_step": calls(LAUNCHES),
        "syncs_per_step": calls(SYNCS),
        "copies_per_step": calls(COPIES),
        "self_cpu_s_per_step": sum(e.self_cpu_time_total for e in events) / 1e6 / count,
    }
    args.profile.mkdir(parents=True, exist_ok=True)
    tables = [events.table(sort_by="self_cpu_time_total", row_limit=40)]
    if args.device == "cuda":
        tables.append(events.table(sort_by="self_cuda_time_total", row_limit=40))
    (args.profile / f"{name}.txt").write_text("\n\n".join(tables) + "\n")


#: --decode variants: the server's generation KV layout and whether its step replays as a CUDA graph
DECODE_VARIANTS = {
    "dynamic": {"decode_kv": "dynamic", "decode_graphs": False},
    "static": {"decode_kv": "static", "decode_graphs": False},
    "graphs": {"decode_kv": "static", "decode_graphs": True},  # the server's defaults (graphs on a GPU only)
}


_CLIENTS: dict[int, Any] = {}  # in the client process: one keep-alive connection pool per concurrency


def post_all(url: str, requests: list[dict[str, Any]]) -> tuple[float, list[list[int]]]:
    """Send every request at once, one thread each (in the client process) over kept-alive connections, as
    regeneration's client threads do (an ``httpx.Client`` takes about 20 ms of CPU to make: one a request
    would spread the burst's arrival over a second); the wall time until the last answer and each
    request's generated tokens, in order."""
    import httpx

    from hsextract.contract.generate import GenerationAnswer

    count = len(requests)
    if count not in _CLIENTS:
        _CLIENTS[count] = httpx.Client(timeout=3600, limits=httpx.Limits(max_connections=count, max_keepalive_connections=count))
    client = _CLIENTS[count]

    def one(request: dict[str, Any]) -> list[int]:
        answers = GenerationAnswer.parse_list(client.post(url, json=request).json())
        assert answers is not None, "not a generation answer"
        return list(answers[0].output_ids)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(requests)) as pool:
        outputs = list(pool.map(one, requests))
    return time.perf_counter() - started, outputs


def run_server(args: argparse.Namespace, concurrency: int, variant: str = "graphs") -> dict[str, Any]:
    from hsextract.api import DECODE_PHASES, Engine, HttpFront, ServeConfig
    from hsextract.contract.generate import GenerationRequest, SamplingParams

    client = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    with tempfile.TemporaryDirectory() as dumps, client:
        settings = {"max_total_tokens": args.max_total_tokens, "max_running_requests": max(concurrency, 1),
                    **DECODE_VARIANTS[variant]}  # fmt: skip
        config = ServeConfig(model=args.model, dump_dir=Path(dumps), device=args.device, dtype=args.dtype, **settings)
        engine = Engine(config)
        server = HttpFront(engine, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.port}/generate"
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)

        outputs: list[list[int]] = []  # each prompt's greedy tokens, from the last batch

        def phases() -> dict[str, float]:
            read = engine.clock.registry.get_sample_value
            return {f"{phase}_{kind}": read(f"hsextract_server_decode_seconds_{kind}", {"phase": phase}) or 0.0
                    for phase in DECODE_PHASES for kind in ("count", "sum")}  # fmt: skip

        def batch(tag: int) -> tuple[float, dict[str, float]]:
            prompts = _prompts(concurrency, args.prompt_len, engine.vocab_size)
            requests = [GenerationRequest(f"bench-{tag}-{i}", p, params).to_json() for i, p in enumerate(prompts)]
            before = phases()
            wall, outputs[:] = client.submit(post_all, url, requests).result()
            assert sum(map(len, outputs)) == concurrency * args.new_tokens
            return wall, {k: v - before[k] for k, v in phases().items()}

        client.submit(time.sleep, 0).result()  # the client process started (and imported) before any timing
        batch(0)  # warm-up
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        wall, spent = min((batch(r + 1) for r in range(args.repeats)), key=lambda run: run[0])
        peak = _peak(args.device)
        profile: dict[str, Any] = {}
        profiled_run: list[dict[str, float]] = []
        with profiled(args, f"server-{variant}-{concurrency}", lambda: int(profiled_run[0]["step_count"]), profile):
            profiled_run.append(batch(args.repeats + 1)[1])
        graphs = engine.decoder.graphs
        if graphs is not None:  # whether the step was replayed, or the capture failed and it ran eagerly
            profile["decode_graphs"] = {"enabled": graphs.enabled, "captured": graphs.captured}
        server.shutdown()
    # where the fastest run's wall time went: prefill forwards (requests admitted as they arrived), decode
    # steps, and the rest (HTTP, admission, answering)
    where = {
        "prefills": int(spent["prefill_count"]),
        "prefill_s": spent["prefill_sum"],
        "steps": int(spent["step_count"]),
        "step_s": spent["step_sum"],
        "seconds_per_step": spent["step_sum"] / max(spent["step_count"], 1),
        "other_s": wall - spent["prefill_sum"] - spent["step_sum"],
    }
    return {"tokens_per_s": concurrency * args.new_tokens / wall, "wall_s": wall, "peak_bytes": peak, "where": where,
            "output_ids": outputs, **profile}  # fmt: skip


def run_hf(args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    import transformers

    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()

    outputs: list[list[int]] = []  # each prompt's greedy tokens, from the last batch

    def batch() -> float:
        ids = torch.tensor(_prompts(concurrency, args.prompt_len, int(model.config.vocab_size)), device=args.device)
        started = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
        )
        if args.device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == args.prompt_len + args.new_tokens
        outputs[:] = out[:, args.prompt_len :].tolist()
        return time.perf_counter() - started

    batch()
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    wall = min(batch() for _ in range(args.repeats))
    peak = _peak(args.device)
    profile: dict[str, Any] = {}
    with profiled(args, f"hf-{concurrency}", lambda: args.new_tokens, profile):
        batch()
    return {"tokens_per_s": concurrency * args.new_tokens / wall, "wall_s": wall, "peak_bytes": peak,
            "output_ids": outputs, **profile}  # fmt: skip


def greedy_agreement(tokens: list[list[int]], reference: list[list[int]]) -> dict[str, float]:
    """How far two runs' greedy tokens for the same prompts agree: the sequences equal throughout, and the
    mean share of each sequence's tokens before its first difference (one flipped near-tie changes the rest)."""
    equal = sum(a == b for a, b in zip(tokens, reference, strict=True))
    before = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a)) / max(len(a), 1)
              for a, b in zip(tokens, reference, strict=True)]  # fmt: skip
    return {"sequences_equal": equal / len(tokens), "tokens_before_first_difference": sum(before) / len(before)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--shape", choices=tuple(SHAPES), default=None, help="random Llama shape (tiny on cpu, 8b on cuda)")
    parser.add_argument("--dtype", default=None, help="float32 (cpu default) or bfloat16 (cuda default)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case after a warm-up; the fastest counts")
    parser.add_argument("--max-total-tokens", type=int, default=65536)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "hsx-bench-generate")
    parser.add_argument("--out", type=Path, default=Path("bench/results-generate.json"))
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="one more run of each case under torch.profiler: operator tables in DIR, "
                             "per-step counts in the JSON")  # fmt: skip
    parser.add_argument("--decode", type=lambda text: text.split(","), default=["graphs"],
                        help="server variants, comma-separated, each against the same generate: dynamic (--decode-kv "
                             "dynamic), static (--no-decode-graphs), graphs (the server's defaults: the static layout, "
                             "its step as a CUDA graph on a GPU; the default here)")  # fmt: skip
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # "server:C" / "hf:C": one case, in a child
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = [v for v in args.decode if v not in DECODE_VARIANTS]
    if unknown:
        parser.error(f"--decode {','.join(unknown)}: choose among {', '.join(DECODE_VARIANTS)}")
    args.shape = args.shape or ("8b" if args.device == "cuda" else "tiny")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.case:
        kind, count, *variant = args.case.split(":")
        result = run_server(args, int(count), *variant) if kind == "server" else run_hf(args, int(count))
        print(json.dumps(result))
        return 0
    model = make_model(args.work_dir / f"llama-{args.shape}-{args.dtype}", args.shape, args.dtype, args.device)
    cases: dict[str, Any] = {}
    for concurrency in args.concurrency:
        row: dict[str, Any] = {}
        for case in [*(f"server:{concurrency}:{variant}" for variant in args.decode), f"hf:{concurrency}"]:
            command = [sys.executable, __file__, "--case", case, "--model", str(model), *_passed(args)]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"{case} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if case.startswith("hf"):
                row["hf"] = result
            else:
                row.setdefault("by_decode", {})[case.rsplit(":", 1)[1]] = result
        row["server"] = row["by_decode"][args.decode[0]]  # the first variant, as results before --decode
        first = row["by_decode"][args.decode[0]]["output_ids"]
        for result in row["by_decode"].values():
            result["tokens_per_s_ratio"] = result["tokens_per_s"] / row["hf"]["tokens_per_s"]
            result["greedy_vs_generate"] = greedy_agreement(result["output_ids"], row["hf"]["output_ids"])
            result["greedy_vs_" + args.decode[0]] = greedy_agreement(result["output_ids"], first)
        for result in [*row["by_decode"].values(), row["hf"]]:
            del result["output_ids"]
        row["tokens_per_s_ratio"] = row["server"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
        # generate's wall over its new tokens: its prefill spread over the steps, an upper bound of its step
        row["hf"]["seconds_per_token_step"] = row["hf"]["wall_s"] / args.new_tokens
        row["peak_memory_ratio"] = row["server"]["peak_bytes"] / row["hf"]["peak_bytes"]
        cases[str(concurrency)] = row
        server, hf = row["server"]["tokens_per_s"], row["hf"]["tokens_per_s"]
        print(f"C={concurrency}: server {server:.0f} tok/s, generate {hf:.0f} tok/s (x{row['tokens_per_s_ratio']:.2f}); "
              f"peak memory x{row['peak_memory_ratio']:.2f}", flush=True)  # fmt: skip
        for variant, result in row["by_decode"].items():
            same, first_same = (result[f"greedy_vs_{of}"]["sequences_equal"] for of in ("generate", args.decode[0]))
            print(f"  --decode {variant}: {result['tokens_per_s']:.0f} tok/s (x{result['tokens_per_s_ratio']:.2f}), "
                  f"{same:.0%} of sequences as generate's, {first_same:.0%} as {args.decode[0]}'s", flush=True)  # fmt: skip
    result = {
        "benchmark": "embedded server decode vs transformers generate",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "python": platform.python_version(), "torch": torch.__version__,
                 "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("case", "model", "out")},
        "by_concurrency": cases,
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def _passed(args: argparse.Namespace) -> list[str]:
    return ["--device", args.device, "--dtype", args.dtype, "--prompt-len", str(args.prompt_len),
            "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
            "--max-total-tokens", str(args.max_total_tokens),
            *(["--profile", str(args.profile)] if args.profile else [])]  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
