"""From nothing to measured drafters (issues 28 and 38): does the target accept what its trainers
made from our output, and how does that grow with the data?

On one GPU, over one or more device calls (``make bench-gpu-drafter``; every figure and setting in
``bench/results-gpu-drafter.json``):

1. **A target that has learned something** (``drafter_target.py``): a Llama-shaped model of about 20 M
   parameters trained for a few minutes on the Python standard library's own source, with a BPE
   tokenizer trained on the same text and the llama3 chat template; its held-out loss is reported.
2. **Conversations of two kinds**, split into train and held-out by source file: ``code`` (a chunk of a
   file, then the chunk that follows) and ``prose`` (the same over the file's docstrings and comments,
   where copying from the context helps far less). The train pool is both kinds, shuffled once; each
   training-set size is a prefix of it, so a larger set holds every smaller one.
3. **Our pipeline, as a user runs it**, every step a ``hsextract`` command at the CLI's defaults (the
   spot check included): ``regenerate`` through the embedded server (greedy) of the pool and of each
   held-out kind; then for each size ``prepare`` in both conventions, ``extract`` as specforge (bf16)
   and as speculators (bf16; unless ``--no-wrong-data`` also FP8 and one layer later), ``verify``. A
   server takes one extractor at a time, so the outputs are spread over ``--extract-servers`` servers.
4. **The trainers' own training loops**, as subprocesses of their released CLIs, all at once on the GPU:
   speculators 0.9.0 (``drafter_speculators.py``) and SpecForge 0.2.0's offline EAGLE-3 trainer
   (``drafter_specforge.py``) at every size (unless ``--no-specforge``); unless ``--no-wrong-data``, at
   the call's largest size, speculators on FP8 and on two deliberately wrong datasets: ``layer_off``
   (extracted one layer later but configured, so served, on the default layers) and ``shifted`` (every
   state one token late).
5. **The measure** (``hsextract.evaluate``), per held-out kind: the target's greedy next tokens and aux
   states from its own transformers forward at the layers each drafter's config names; each drafter's
   guesses at draft positions 1..k drafting on its own earlier guesses, chain acceptance against the
   target's greedy tokens, the expected acceptance length; prompt lookup (n-gram) beside them.
   ``hsextract draft-config`` / ``check-draft`` on each trained drafter's config.

A device call is 10 minutes at most, so a curve is split across calls: ``--bundle-out`` saves the
target and the regenerated conversations (in parts a call can bring back), ``--bundle-in`` starts a
later call from them (growing the pool to ``--pool`` with the same target when asked), and ``--append``
adds its sizes to the results file, refusing another target.
The curve and the verdict (``drafter_curve.py``) are recomputed from every size measured; a trainer
the call's deadline stopped is measured from its last checkpoint and named there with the epochs it did.

``--quick``: the same chain at a fraction of the sizes (a first run on a new machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_gpu_e2e as e2e
import drafter_bundle
import drafter_curve
import drafter_speculators
import drafter_target as target_lib
import torch

from hsextract.evaluate import AcceptanceCounts, chain_acceptance, prompt_lookup_drafts

log = logging.getLogger("bench_gpu_drafter")
KINDS = ("code", "prose")
#: what a bundle carries from one call to the next (paths under --work)
BUNDLE_MEMBERS = ["target", "target.json", "regen-train.jsonl", *(f"regen-heldout-{kind}.jsonl" for kind in KINDS)]
#: seconds kept for measuring the drafters when training is cut to fit --wall-budget-s: loading the
#: target and the held-out states, then each drafter on each kind and its check-draft commands (issue 28's
#: run: 1.3-13 s a drafter and kind, 0.4 s a check)
EVAL_RESERVE_S = 45.0
EVAL_RESERVE_PER_DRAFTER_S = 12.0
#: seconds the trainers stopped at the deadline have, together, to save and exit before they are killed
STOP_GRACE_S = 30.0


class Results:
    """The results file, rewritten after every stage so a run cut short still reports what it did.
    With ``append`` the sizes of earlier calls stay (for the same target only: :meth:`target`)."""

    def __init__(self, path: Path, settings: dict[str, Any], append: bool) -> None:
        self.path = path
        fresh: dict[str, Any] = {"benchmark": "bench_gpu_drafter", "calls": [], "sizes": {}, "heldout": {}}
        self.data = json.loads(path.read_text()) if append and path.is_file() else fresh
        if "calls" not in self.data:
            raise ValueError(f"{path} is not a curve results file (no 'calls'): drop --append, or --out another file")
        self.call: dict[str, Any] = {"settings": settings, "stages": {}, "elapsed_s": {}}
        self.started = time.perf_counter()
        self.data["calls"].append(self.call)

    def target(self, report: dict[str, Any]) -> None:
        """This call's target; an appended call must use the target the earlier calls measured."""
        known = self.data.get("target")
        if known and known.get("sha256") != report.get("sha256"):
            raise ValueError(
                f"{self.path} holds sizes measured on target {known.get('sha256')}, this call's is "
                f"{report.get('sha256')}: start from that call's bundle (--bundle-in), or drop --append"
            )
        self.data["target"] = report
        self.save()

    def stage(self, name: str, value: Any) -> None:
        """A stage's report, and the call's seconds when it ended (``elapsed_s``: where a call's time went)."""
        self.call["stages"][name] = value
        self.call["elapsed_s"][name] = round(time.perf_counter() - self.started, 1)
        self.save()

    def size(self, size: int, part: str, value: Any) -> None:
        self.data["sizes"].setdefault(str(size), {})[part] = value
        self.save()

    def conclude(self) -> None:
        """The curve and the verdict, from every size measured so far."""
        curves = drafter_curve.curve(self.data["sizes"])
        lookup = {kind: drafter_curve.tau(held.get("prompt_lookup")) for kind, held in self.data["heldout"].items()}
        self.data["curve"] = {kind: {name: {str(s): v for s, v in points.items()} for name, points in drafters.items()}
                              for kind, drafters in curves.items()}  # fmt: skip
        lookup = {k: v for k, v in lookup.items() if v is not None}
        sizes = self.data["sizes"]
        self.data["verdict"] = drafter_curve.verdict(curves, lookup, drafter_curve.cut_short(sizes), drafter_curve.epochs(sizes))
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)


def run_logged(
    argv: list[str], log_path: Path, env: dict[str, str] | None = None, refusal_is_a_finding: bool = False
) -> dict[str, Any]:
    """Run a command to completion, its output in ``log_path``; rc, seconds and the log's tail.
    ``refusal_is_a_finding``: a non-zero exit is what is measured (check-draft on a config as trained), not an error."""
    started = time.perf_counter()
    with open(log_path, "wb") as handle:
        done = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)
    result = {"rc": done.returncode, "seconds": round(time.perf_counter() - started, 1)}
    if done.returncode != 0:
        result["log_tail"] = e2e_tail(log_path)
        level = logging.INFO if refusal_is_a_finding else logging.ERROR
        log.log(level, "%s exited %d; %s ends:\n%s", " ".join(argv[:4]), done.returncode, log_path, result["log_tail"])
    return result


def e2e_tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def parallel(commands: dict[str, list[str]], logs: Path) -> dict[str, Any]:
    """``hsextract`` commands run at once (each is a process of its own), each waited for and checked."""
    started = time.perf_counter()
    running = {}
    for name, argv in commands.items():
        handle = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed once it ends
        process = subprocess.Popen([sys.executable, "-m", "hsextract", *argv], stdout=handle, stderr=subprocess.STDOUT)
        running[name] = (process, handle)
    results: dict[str, Any] = {}
    while len(results) < len(running):  # polled, so that each command's seconds are its own
        for name, (process, handle) in running.items():
            if name in results or process.poll() is None:
                continue
            handle.close()
            results[name] = {"rc": process.returncode, "seconds": round(time.perf_counter() - started, 1)}
        time.sleep(0.2)
    for name, result in results.items():
        rc = result["rc"]
        if rc != 0:
            raise RuntimeError(
                f"hsextract {commands[name][0]} ({name}) failed (exit {rc}); its log ends:\n{e2e_tail(logs / f'{name}.log')}"
            )
    return results


class Server:
    """``hsextract serve`` on the GPU, for regeneration and extraction (one per aux layer set, and more
    of the default set to extract several outputs at once: ``--extract-servers``). Started without
    waiting; :meth:`wait_ready` waits for its health check, so several start together."""

    def __init__(
        self, model: Path, work: Path, name: str, device: str, layer_ids: list[int] | None = None, extra: str = ""
    ) -> None:
        self.log_path = work / f"server-{name}.log"
        self.dump_dir = Path("/dev/shm") / f"hsx-drafter-{name}-{os.getpid()}"
        port = e2e.free_port()
        argv = serve_argv(model, self.dump_dir, port, device, layer_ids, extra)
        with open(self.log_path, "wb") as handle:
            self.process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.ready_s: float | None = None

    def wait_ready(self) -> float:
        """Seconds until its health check passed (raises with its log's tail if it exited first)."""
        return e2e.wait_healthy(self.url, self.process, self.log_path)

    def stop(self) -> None:
        e2e.stop_server(self.process)
        shutil.rmtree(self.dump_dir, ignore_errors=True)


def serve_argv(model: Path, dump_dir: Path, port: int, device: str, layer_ids: list[int] | None, extra: str) -> list[str]:
    """``hsextract serve``'s command line; ``extra`` (``--serve-args``) goes last, so it overrides."""
    argv = [sys.executable, "-m", "hsextract", "serve", "--model", str(model), "--dump-dir", str(dump_dir)]
    argv += ["--port", str(port), "--device", device, "--max-running-requests", "256"]
    if layer_ids is not None:
        argv += ["--layer-ids", ",".join(map(str, layer_ids))]
    return argv + shlex.split(extra)


def start_servers(args: argparse.Namespace, work: Path) -> dict[str, Server]:
    """The servers this call extracts through, started together and waited for: ``default`` (which
    also regenerates), ``default-2`` .. ``default-<--extract-servers>``, and ``layer-off`` (the
    layers one later) when the wrong data is made."""
    target = work / "target"
    started = time.perf_counter()
    extra = args.serve_args
    servers = {"default": Server(target, work, "default", args.device, extra=extra)}
    for index in range(2, args.extract_servers + 1):
        servers[f"default-{index}"] = Server(target, work, f"default-{index}", args.device, extra=extra)
    if args.wrong_data:
        servers["layer-off"] = Server(target, work, "layer-off", args.device, layer_ids=layer_off_ids(target), extra=extra)
    try:
        for server in servers.values():  # each one's seconds from the common start
            server.wait_ready()
            server.ready_s = round(time.perf_counter() - started, 1)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, Server]) -> None:
    for server in servers.values():
        server.stop()


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- 1. the target and the conversations ----------------------------------------------------------------------------
class Corpus:
    """The standard library's files split by file into train and held-out, and each kind's conversations
    of both (deterministic: the same Python gives the same corpus, so a later call can rebuild the pool)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.sources = target_lib.stdlib_sources(args.corpus_bytes)
        self.train_sources = [s for s in self.sources if not target_lib.is_heldout(s, args.heldout_percent)]
        self.heldout_sources = [s for s in self.sources if target_lib.is_heldout(s, args.heldout_percent)]
        makers = {"code": target_lib.code_conversations, "prose": target_lib.prose_conversations}
        self.train = {kind: make(self.train_sources, args.user_lines, args.assistant_lines) for kind, make in makers.items()}
        self.heldout = {kind: make(self.heldout_sources, args.user_lines, args.assistant_lines) for kind, make in makers.items()}
        self.all_train = [row for kind in KINDS for row in self.train[kind]]
        self.all_heldout = [row for kind in KINDS for row in self.heldout[kind]]

    def conversations(self, heldout_per_kind: int) -> dict[str, list[Any]]:
        """``train``: the pool, both kinds shuffled once; ``heldout-<kind>``: a sample of each kind."""
        out = {"train": sample(self.all_train, len(self.all_train), 1)}
        out.update({f"heldout-{kind}": sample(self.heldout[kind], heldout_per_kind, 2) for kind in KINDS})
        return out


def make_target(args: argparse.Namespace, work: Path, device: torch.device) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The target, trained on both kinds' train conversations; returns its report and the conversations
    (:meth:`Corpus.conversations`)."""
    corpus = Corpus(args)
    shape = target_lib.TargetShape(layers=args.target_layers, hidden=args.target_hidden, heads=args.target_hidden // 64,
                                   intermediate=args.target_hidden * 8 // 3 // 64 * 64, vocab_size=args.vocab_size)  # fmt: skip
    training = target_lib.TargetTraining(steps=args.target_steps, batch=args.target_batch, seq_len=args.target_seq_len,
                                         max_seconds=args.target_max_s)  # fmt: skip
    report = target_lib.build_target(
        work / "target", corpus.all_train, corpus.all_heldout, corpus.train_sources, shape, training, device
    )
    report.update(
        sha256=file_sha256(work / "target" / "model.safetensors"),
        corpus_files=len(corpus.sources),
        train_files=len(corpus.train_sources),
        heldout_files=len(corpus.heldout_sources),
        train_conversations={kind: len(rows) for kind, rows in corpus.train.items()},
        heldout_conversations={kind: len(rows) for kind, rows in corpus.heldout.items()},
    )
    return report, corpus.conversations(args.heldout_conversations)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sample(rows: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    picked = list(rows)
    random.Random(seed).shuffle(picked)
    return picked[:count]


# -- 2. our pipeline -------------------------------------------------------------------------------------------------
def regenerate(args: argparse.Namespace, work: Path, server: Server, conversations: dict[str, list[Any]]) -> dict[str, Any]:
    """The pool (its first ``--pool`` rows) and each held-out kind, regenerated by the target at once."""
    conversations = dict(conversations, train=conversations["train"][: args.pool])
    for name, rows in conversations.items():
        write_jsonl(work / f"conv-{name}.jsonl", rows)
    steps: dict[str, Any] = parallel(
        {f"regenerate_{name}": regenerate_argv(args, work, server, name) for name in conversations}, work / "logs"
    )
    steps["rows"] = {name: len(read_jsonl(work / f"regen-{name}.jsonl")) for name in conversations}
    return steps


def regenerate_argv(args: argparse.Namespace, work: Path, server: Server, name: str) -> list[str]:
    """``conv-<name>.jsonl`` regenerated greedily into ``regen-<name>.jsonl``."""
    return ["regenerate", "--server", server.url, "--dataset", str(work / f"conv-{name}.jsonl"),
            "--output", str(work / f"regen-{name}.jsonl"), "--model", str(work / "target"),
            "--max-new-tokens", str(args.max_new_tokens), "--temperature", "0", "--concurrency", "128"]  # fmt: skip


def extend_pool(args: argparse.Namespace, work: Path, server: Server) -> dict[str, Any]:
    """A bundle's pool grown to ``--pool``: the pool rebuilt (the same corpus, the same shuffle), checked
    against the bundle's rows, and the rows after them regenerated by the same target and appended, so
    every size stays a prefix of one pool."""
    regenerated = read_jsonl(work / "regen-train.jsonl")
    if args.pool <= len(regenerated):
        return {"rows": len(regenerated), "added": 0}
    pool = Corpus(args).conversations(0)["train"][: args.pool]
    for index, (have, rebuilt) in enumerate(zip(regenerated, pool, strict=False)):
        if (have.get("source"), first_turn(have)) != (rebuilt.get("source"), first_turn(rebuilt)):
            raise ValueError(
                f"the bundle's pool row {index} ({have.get('source')}) is not the rebuilt pool's ({rebuilt.get('source')}): "
                "this Python's standard library or the conversation settings differ from the bundle's call; "
                "measure within the bundle's pool (--pool, --sizes) or make a new bundle"
            )
    if len(pool) <= len(regenerated):  # the bundle holds the whole corpus already (--pool past it, or "all")
        return {"rows": len(regenerated), "added": 0, "from_bundle": len(regenerated)}
    write_jsonl(work / "conv-train-more.jsonl", pool[len(regenerated) :])
    steps = parallel({"regenerate_train_more": regenerate_argv(args, work, server, "train-more")}, work / "logs")
    more = read_jsonl(work / "regen-train-more.jsonl")
    grown = work / "regen-train.jsonl.grown"
    write_jsonl(grown, regenerated + more)
    os.replace(grown, work / "regen-train.jsonl")
    return {**steps, "rows": len(regenerated) + len(more), "added": len(more), "from_bundle": len(regenerated)}


def first_turn(row: dict[str, Any]) -> str:
    turns = row.get("conversations") or []
    return str(turns[0].get("value")) if turns else ""


def prepare_all(work: Path, sizes: list[int], likes: tuple[str, ...]) -> dict[str, Any]:
    """Each size's train rows (a prefix of the regenerated pool) in each convention of ``likes``, and each held-out
    kind as speculators prepares it (what the measure reads), at once."""
    pool = read_jsonl(work / "regen-train.jsonl")
    if max(sizes) > len(pool):
        raise ValueError(f"size {max(sizes)} is over the {len(pool)} regenerated train conversations (--pool, or the bundle's)")
    commands: dict[str, list[str]] = {}
    for size in sizes:
        write_jsonl(work / f"regen-train-{size}.jsonl", pool[:size])
        for like in likes:
            commands[f"prepare_{like}_{size}"] = prepare_argv(work, like, f"regen-train-{size}.jsonl", f"prep-{like}-{size}")
    for kind in KINDS:
        dataset = f"regen-heldout-{kind}.jsonl"
        commands[f"prepare_heldout_{kind}"] = prepare_argv(work, "speculators", dataset, f"prep-heldout-{kind}")
    return parallel(commands, work / "logs")


def prepare_argv(work: Path, like: str, dataset: str, output: str) -> list[str]:
    return ["prepare", "--model", str(work / "target"), "--dataset", str(work / dataset),
            "--output", str(work / output), "--like", like, "--no-progress"]  # fmt: skip


def extract_all(args: argparse.Namespace, work: Path, servers: dict[str, Server], sizes: list[int]) -> dict[str, dict[str, Any]]:
    """Every output of every size, each then verified (unless ``--no-verify``). The correct data and FP8
    go to the default servers, the largest first to the least loaded; ``layer_off`` (largest size only,
    unless ``--no-wrong-data``) to the server on the layers one later. Each server extracts its outputs
    one after another (an extractor holds its shard of the server's dump folder: one request id a row),
    the servers at once."""
    jobs: dict[str, tuple[str, str, list[str]]] = {}
    for size in sizes:
        if args.specforge:
            jobs[f"specforge_bf16-{size}"] = ("specforge", f"prep-specforge-{size}", [])
        jobs[f"speculators_bf16-{size}"] = ("speculators", f"prep-speculators-{size}", [])
    largest = max(sizes)
    if args.wrong_data:
        jobs[f"speculators_fp8-{largest}"] = ("speculators", f"prep-speculators-{largest}", ["--storage", "float8_e4m3fn"])
        off_ids = ",".join(map(str, layer_off_ids(work / "target")))
        jobs[f"speculators_layer_off-{largest}"] = ("speculators", f"prep-speculators-{largest}", ["--layer-ids", off_ids])
    queues = server_queues(list(jobs), list(servers))
    server_of = {name: server for server, names in queues.items() for name in names}
    ran = run_queues(
        queue_commands(queues, {server: s.url for server, s in servers.items()}, work, jobs, args.verify), work / "logs"
    )
    out: dict[str, dict[str, Any]] = {}
    for name in jobs:
        summary = output_summary(work / f"out-{name}", ran[f"extract_{name}"]["seconds"])
        out[name] = {
            **ran[f"extract_{name}"],
            "server": server_of[name],
            "verify": ran.get(f"verify_{name}", "not run"),
            **summary,
        }
    if args.wrong_data:
        out[f"speculators_shifted-{largest}"] = shifted_copy(
            work / f"out-speculators_bf16-{largest}", work / f"out-speculators_shifted-{largest}"
        )
    return out


def queue_commands(
    queues: dict[str, list[str]], urls: dict[str, str], work: Path, jobs: dict[str, tuple[str, str, list[str]]], verify: bool
) -> dict[str, dict[str, list[str]]]:
    """Each server's ``hsextract`` commands in order: an output's extraction, then (with ``verify``) its
    verify, before the server's next output. The verifies of outputs on different servers overlap, as
    the extractions do: one after another, three 11918-row verifies cost 66 s of a 10-minute call."""
    commands: dict[str, dict[str, list[str]]] = {}
    for server, names in queues.items():
        commands[server] = {}
        for name in names:
            commands[server][f"extract_{name}"] = extract_argv(urls[server], work, name, *jobs[name])
            if verify:
                commands[server][f"verify_{name}"] = ["verify", str(work / f"out-{name}")]
    return commands


def server_queues(names: list[str], servers: list[str]) -> dict[str, list[str]]:
    """Which server extracts which output (``<drafter>-<size>``), in order: ``layer_off`` on
    ``layer-off``; the rest on the other servers, the largest first to the one with the fewest rows queued."""
    queues: dict[str, list[str]] = {server: [] for server in servers}
    defaults = [server for server in servers if server != "layer-off"]
    load = dict.fromkeys(defaults, 0)
    for name in sorted(names, key=lambda n: -int(n.rsplit("-", 1)[1])):  # stable: equal sizes keep their order
        if name.startswith("speculators_layer_off-"):
            queues["layer-off"].append(name)
            continue
        server = min(defaults, key=lambda s: (load[s], defaults.index(s)))
        queues[server].append(name)
        load[server] += int(name.rsplit("-", 1)[1])
    return queues


def run_queues(queues: dict[str, dict[str, list[str]]], logs: Path) -> dict[str, Any]:
    """Each queue's ``hsextract`` commands one after another, the queues at once (a thread each);
    each command's seconds are its own. The first failure is raised once every queue has stopped."""
    from concurrent.futures import ThreadPoolExecutor

    def drain(commands: dict[str, list[str]]) -> dict[str, Any]:
        done: dict[str, Any] = {}
        for name, argv in commands.items():
            done.update(parallel({name: argv}, logs))
        return done

    ran: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(queues))) as pool:
        futures = [pool.submit(drain, commands) for commands in queues.values() if commands]
    for future in futures:
        ran.update(future.result())
    return ran


def default_layer_ids(model: Path) -> list[int]:
    from hsextract.contract.layers import default_aux_layer_ids

    return default_aux_layer_ids(json.loads((model / "config.json").read_text())["num_hidden_layers"])


def layer_off_ids(model: Path) -> list[int]:
    """The default aux layers, each one later: what the ``layer_off`` data is extracted on."""
    return [i + 1 for i in default_layer_ids(model)]


def extract_argv(url: str, work: Path, name: str, fmt: str, data: str, extra: list[str]) -> list[str]:
    return ["extract", "--server", url, "--dataset", str(work / data), "--output", str(work / f"out-{name}"),
            "--format", fmt, *extra, "--concurrency", "64", "--health-timeout-s", "120"]  # fmt: skip


def output_summary(out: Path, seconds: float) -> dict[str, Any]:
    """What the output's ``data_config.json`` says: rows, tokens, layers, status, the default spot check's counts."""
    config = json.loads((out / "data_config.json").read_text())
    result = {key: config.get(key) for key in ("total_samples", "total_tokens", "layer_ids", "storage_dtype", "status")}
    result["tokens_per_s"] = round((config.get("total_tokens") or 0) / max(seconds, 1e-9))
    spot = config.get("spot_checks") or {}
    counts = ("every", "checked_rows", "matched_rows", "mismatched_rows", "failed_requests")
    result["spot_checks"] = {k: spot.get(k) for k in counts}
    return result


def shifted_copy(source: Path, dest: Path) -> dict[str, Any]:
    """The bf16 output with every token's states moved one token later (state t-1 beside token t):
    the one-token misalignment between ``input_ids`` and the states, made on purpose."""
    from safetensors.torch import load_file, save_file

    started = time.perf_counter()
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("hidden_states", "extract.lock"))
    (dest / "hidden_states").mkdir()
    files = sorted((source / "hidden_states").glob("*.safetensors"))
    for file in files:
        tensors = load_file(str(file))
        states = tensors["hidden_states"]
        tensors["hidden_states"] = torch.cat([states[:1], states[:-1]], dim=0).contiguous()
        save_file(tensors, str(dest / "hidden_states" / file.name))
    return {"files": len(files), "seconds": round(time.perf_counter() - started, 1)}


# -- 3. the trainers -------------------------------------------------------------------------------------------------
def draft_vocab_size(output: Path, vocab_size: int) -> tuple[int, int]:
    """A quarter of the target vocabulary (the usual ratio), at most the distinct supervised tokens."""
    freq = torch.load(output / "data" / "token_freq.pt", weights_only=True)
    distinct = len(freq)
    return min(vocab_size // 4, distinct), distinct


def training_jobs(args: argparse.Namespace, work: Path, names: list[str]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Each output's trainer command (``names`` as ``<drafter>-<size>``), and what could not be set up."""
    target = work / "target"
    default_capture = [i + 1 for i in default_layer_ids(target)]
    jobs: dict[str, list[str]] = {}
    report: dict[str, Any] = {}
    for name in names:
        drafter, size = name.rsplit("-", 1)
        vocab, distinct = draft_vocab_size(work / f"out-speculators_bf16-{size}", args.vocab_size)
        report[name] = {"draft_vocab_size": vocab, "distinct_supervised_tokens": distinct}
        if drafter.startswith("speculators"):
            jobs[name] = drafter_speculators.train_argv(
                work / f"out-{name}", target, work / f"draft-{name}", draft_vocab_size=vocab, epochs=args.epochs,
                lr=args.lr, target_layer_ids=default_capture if drafter == "speculators_layer_off" else None,
            )  # fmt: skip
        else:
            specforge = specforge_job(args, work, name, vocab)
            if isinstance(specforge, list):
                jobs[name] = specforge
            else:
                report[name].update(specforge)
    return jobs, report


def train_all(args: argparse.Namespace, work: Path, names: list[str], deadline_s: float) -> dict[str, Any]:
    """Every drafter's trainer started at once on the one GPU (each is small), then waited for; one
    still running ``deadline_s`` after the start is stopped and measured from its last checkpoint."""
    jobs, setup = training_jobs(args, work, names)
    report: dict[str, Any] = {"deadline_s": round(deadline_s), "jobs": setup}
    started = time.perf_counter()
    running = {}
    for name, argv in jobs.items():
        log_path = work / "logs" / f"train-{name}.log"
        handle = open(log_path, "wb")  # noqa: SIM115 - closed once the job ends
        running[name] = (subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT), handle, log_path)
        report["jobs"][name]["argv"] = argv
    ended: dict[str, float] = {}
    while len(ended) < len(running):  # polled, so that each job's own seconds are its own
        for name, (process, _, _) in running.items():
            if name not in ended and process.poll() is not None:
                ended[name] = time.perf_counter() - started
        if time.perf_counter() - started > deadline_s:
            break
        time.sleep(0.5)
    for name, (process, _, _) in running.items():
        if name not in ended and process.poll() is not None:
            ended[name] = time.perf_counter() - started
    stopped = [name for name in running if name not in ended]
    if stopped:
        log.warning("training deadline (%d s): stopping %s; each is measured from its last checkpoint and named in "
                    "the verdict (cut_short_at_largest at the largest size)", deadline_s, ", ".join(stopped))  # fmt: skip
    for name in stopped:  # all at once: speculators saves on SIGTERM, and each may take its grace
        running[name][0].terminate()
    grace_ends = time.perf_counter() + STOP_GRACE_S
    for name in stopped:
        process = running[name][0]
        try:
            process.wait(max(0.1, grace_ends - time.perf_counter()))
        except subprocess.TimeoutExpired:  # its dataloader workers can hold the exit
            process.kill()
            process.wait()
    for name, (process, handle, log_path) in running.items():
        rc = process.returncode
        if name in stopped:  # measured from the checkpoints it saved so far
            report["jobs"][name]["stopped_at_deadline_s"] = round(deadline_s)
            rc = 0 if has_checkpoint(name, work) else rc
        handle.close()
        report["jobs"][name].update(rc=rc, seconds=round(ended.get(name, deadline_s), 1))
        report["jobs"][name].update(trainer_progress(log_path))
        if rc != 0:
            report["jobs"][name]["log_tail"] = e2e_tail(log_path)
            log.error("trainer %s exited %d; its log ends:\n%s", name, rc, e2e_tail(log_path, 2000))
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    return report


def trainer_progress(log_path: Path) -> dict[str, Any]:
    """The last optimizer step and epoch a trainer's log names (for its seconds a step), when it names them."""
    import re

    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    out: dict[str, Any] = {}
    for key, pattern in (("last_step", r"\bstep[\s=:]+(\d+)"), ("last_epoch", r"\bepoch[\s=:]+(\d+)")):
        found = re.findall(pattern, text, flags=re.IGNORECASE)
        if found:
            out[key] = int(found[-1])
    # speculators logs "epoch 2/3 completed" (from 1) and progress bars "Epoch 2  64%" (from 0): a trainer
    # stopped at the deadline has done the completed epochs and the last bar's share of the next
    completed = [int(n) for n in re.findall(r"\bepoch (\d+)/\d+ completed", text)]
    if completed:
        done = max(completed)
        bars = [int(pct) for n, pct in re.findall(r"\bEpoch (\d+)\s+(\d+)%", text) if int(n) == done]
        out["epochs_done"] = round(done + (bars[-1] / 100 if bars else 0), 2)
    return out


def has_checkpoint(name: str, work: Path) -> bool:
    """Whether a trainer stopped at the deadline left a checkpoint to measure."""
    save_dir = work / f"draft-{name}"
    if not name.startswith("speculators"):
        return any(save_dir.glob("*-step*/training_state.pt"))  # SpecForge's <run_id>-step<N>/
    try:
        return drafter_speculators.last_checkpoint(save_dir).is_dir()
    except FileNotFoundError:
        return False


def specforge_job(args: argparse.Namespace, work: Path, name: str, vocab: int) -> list[str] | dict[str, Any]:
    """SpecForge's training command, or why there is none."""
    try:
        import drafter_specforge
    except Exception as exc:
        return {"error": f"drafter_specforge did not import: {exc!r}"}
    try:
        out = work / f"out-{name}"
        config = json.loads((out / "data_config.json").read_text())
        path = drafter_specforge.write_train_config(
            work / f"specforge-train-{name}.yaml",
            target_model_dir=work / "target",
            hidden_states_dir=out,
            save_dir=work / f"draft-{name}",
            max_length=int(config["trainer"]["config"]["data"]["max_length"]),
            epochs=args.epochs,
            lr=args.lr,
            batch_size=args.specforge_batch,
            save_interval=max(1, int(config["total_samples"]) // args.specforge_batch),  # about once an epoch
            ttt_length=drafter_speculators.TTT_STEPS,
            draft_vocab_size=vocab,
        )
        return list(drafter_specforge.train_command(path))
    except Exception as exc:
        return {"error": f"SpecForge's config could not be written: {exc!r}"}


# -- 4. the measure --------------------------------------------------------------------------------------------------
class HeldOut:
    """The held-out rows with the target's greedy next tokens and every hidden state, from its own forward."""

    def __init__(self, work: Path, kind: str, device: torch.device, limit: int) -> None:
        import transformers
        from datasets import load_from_disk

        model = transformers.AutoModelForCausalLM.from_pretrained(str(work / "target"), dtype=torch.bfloat16).to(device).eval()
        rows = load_from_disk(str(work / f"prep-heldout-{kind}"))
        self.rows: list[dict[str, torch.Tensor]] = []
        greedy_agree, response_tokens = 0, 0
        for index in range(min(limit, len(rows))):
            ids = torch.tensor(rows[index]["input_ids"], dtype=torch.long)
            mask = torch.tensor(rows[index]["loss_mask"], dtype=torch.bool)
            with torch.no_grad():
                out = model(input_ids=ids.unsqueeze(0).to(device), output_hidden_states=True)
            greedy = out.logits[0].argmax(-1).cpu()
            states = torch.stack([h[0] for h in out.hidden_states]).cpu()  # [L+1, T, H]
            self.rows.append({"ids": ids, "mask": mask, "greedy": greedy, "states": states})
            follows = (greedy[:-1] == ids[1:]) & mask[1:]
            greedy_agree += int(follows.sum())
            response_tokens += int(mask[1:].sum())
        self.greedy_share = greedy_agree / max(response_tokens, 1)
        self.response_tokens = response_tokens
        del model
        torch.cuda.empty_cache() if device.type == "cuda" else None


def measure(held: HeldOut, k: int, drafts_of: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> dict[str, Any]:
    counts = AcceptanceCounts(k=k)
    started = time.perf_counter()
    for row in held.rows:
        counts.add(chain_acceptance(drafts_of(row), row["ids"], row["greedy"], row["mask"]))
    return {**counts.summary(), "seconds": round(time.perf_counter() - started, 1)}


#: the order drafters are measured in: the comparisons the verdict needs first
MEASURE_ORDER = ("speculators_bf16", "specforge_bf16", "speculators_layer_off", "speculators_shifted", "speculators_fp8")


def measure_order(name: str) -> tuple[int, int]:
    drafter, size = name.rsplit("-", 1)
    return -int(size), MEASURE_ORDER.index(drafter) if drafter in MEASURE_ORDER else len(MEASURE_ORDER)


def evaluate(args: argparse.Namespace, work: Path, device: torch.device, trained: dict[str, Any], results: Results) -> None:
    """Prompt lookup and every trained drafter on each held-out kind, saved into the results one by one."""
    k = drafter_speculators.TTT_STEPS
    num_layers = int(json.loads((work / "target" / "config.json").read_text())["num_hidden_layers"])
    held = {kind: HeldOut(work, kind, device, args.eval_rows) for kind in KINDS}
    for kind, rows in held.items():
        results.data["heldout"][kind] = {
            "rows": len(rows.rows),
            "response_tokens": rows.response_tokens,
            "text_follows_target_greedy": round(rows.greedy_share, 4),
            "k": k,
            "prompt_lookup": measure(rows, k, lambda row: prompt_lookup_drafts(row["ids"], k)),
        }
    results.save()
    for name in sorted(trained["jobs"], key=measure_order):
        drafter_name, size = name.rsplit("-", 1)
        job = trained["jobs"][name]
        measured: dict[str, Any] = {}
        if job.get("rc") != 0:
            measured = {kind: {"error": job.get("error") or f"trainer exited {job.get('rc')}"} for kind in KINDS}
        else:
            try:
                drafter = load_drafter(name, work, device)
                indices = served_indices(drafter.config_path, num_layers)
                for kind, rows in held.items():
                    measured[kind] = {
                        "fed_hidden_states": indices,
                        **measure(rows, k, lambda row, d=drafter, i=indices: d.draft_tokens(aux(row, i), row["ids"], k)),
                    }
                measured["check_draft"] = check_draft(name, work, drafter)
            except Exception as exc:
                log.exception("measuring %s failed", name)
                measured = {kind: {"error": repr(exc)} for kind in KINDS}
        evaluation = results.data["sizes"].setdefault(size, {}).setdefault("evaluation", {})
        for kind in KINDS:
            evaluation.setdefault(kind, {})[drafter_name] = measured[kind]
        if "check_draft" in measured:
            results.data["sizes"][size].setdefault("check_draft", {})[drafter_name] = measured["check_draft"]
        results.conclude()


def aux(row: dict[str, torch.Tensor], indices: list[int]) -> torch.Tensor:
    """``[T, K*H]``: transformers ``hidden_states[i]`` for each i, concatenated in order (what SGLang
    hands a drafter configured for those layers)."""
    return torch.cat([row["states"][i] for i in indices], dim=-1)


class SpecForgeDrafter:
    """SpecForge's trained drafter (``drafter_specforge``) behind the same two members as speculators'."""

    def __init__(self, save_dir: Path, device: torch.device) -> None:
        import drafter_specforge

        self._module = drafter_specforge
        self._drafter = drafter_specforge.load_drafter(save_dir, device)
        record = json.loads((save_dir / drafter_specforge.RUN_RECORD).read_text())
        self.config_path = Path(record["draft_config"])

    def draft_tokens(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor, k: int) -> torch.Tensor:
        return torch.as_tensor(self._module.draft_tokens(self._drafter, aux_hidden, input_ids, k))


def load_drafter(name: str, work: Path, device: torch.device) -> Any:
    if name.startswith("speculators"):
        checkpoint = drafter_speculators.last_checkpoint(work / f"draft-{name}")
        return drafter_speculators.Drafter(checkpoint, work / "target", device)
    return SpecForgeDrafter(work / f"draft-{name}", device)


def served_indices(config_path: Path, num_layers: int) -> list[int]:
    """The transformers ``hidden_states`` indices SGLang 0.5.23 hands a drafter of this config
    (hsextract's own reading of ``set_eagle3_layers_to_capture``; the target is Llama-shaped)."""
    from hsextract.contract.sglang_capture import ModelFamily, captured_states, layers_to_capture

    eagle = json.loads(config_path.read_text()).get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return captured_states(layers_to_capture(ModelFamily.LLAMA, ids, num_layers))


def check_draft(name: str, work: Path, drafter: Any) -> dict[str, Any]:
    """``hsextract check-draft`` on the trained config as the trainer wrote it, then on the config
    ``hsextract draft-config --write`` makes of it for SGLang."""
    out = work / f"out-{name}"
    config = drafter.config_path
    logs = work / "logs"
    as_trained = run_logged(
        [sys.executable, "-m", "hsextract", "check-draft", str(out), "--draft-config", str(config)],
        logs / f"check-{name}.log",
        refusal_is_a_finding=True,  # a trainer's config the serving side would misread: the check is doing its job
    )
    as_trained["says"] = e2e_tail(logs / f"check-{name}.log", 600)
    fixed = work / f"sglang-config-{name}.json"
    shutil.copy(config, fixed)
    written = run_logged(
        [sys.executable, "-m", "hsextract", "draft-config", str(out), "--write", str(fixed)], logs / f"draft-config-{name}.log"
    )
    after = run_logged(
        [sys.executable, "-m", "hsextract", "check-draft", str(out), "--draft-config", str(fixed)],
        logs / f"check-fixed-{name}.log",
    )
    after["says"] = e2e_tail(logs / f"check-fixed-{name}.log", 600)
    return {"check_draft_as_trained": as_trained, "draft_config_write_rc": written["rc"], "check_draft_after_draft_config": after}


#: ``--sizes all``: the whole regenerated pool
ALL = 10**9


def sizes_arg(text: str) -> list[int]:
    try:
        sizes = sorted({ALL if part == "all" else int(part) for part in text.replace(",", " ").split()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 20:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: give sizes of 20 conversations or more, or all: 1300,4000,all")
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results-gpu-drafter.json"))
    parser.add_argument("--append", action="store_true", help="add this call's sizes to --out (same target only)")
    parser.add_argument("--work", type=Path, default=Path("bench/work/drafter"), help="scratch folder (emptied first)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="a fraction of every size: a first run on a new machine")
    parser.add_argument("--sizes", type=sizes_arg, default=sizes_arg("1300,4000,all"),
                        help="train-set sizes (conversations; all: the whole pool) this call measures")  # fmt: skip
    parser.add_argument("--pool", type=int, default=None,
                        help="train conversations to regenerate (default: the largest size); more: for later calls. "
                             "With --bundle-in, rows past the bundle's are regenerated and appended")  # fmt: skip
    parser.add_argument("--no-wrong-data", dest="wrong_data", action="store_false",
                        help="leave out FP8 and the layer-off and shifted drafters (largest size)")  # fmt: skip
    parser.add_argument("--no-specforge", dest="specforge", action="store_false",
                        help="leave out SpecForge this call (the long pole at the largest sizes); speculators stays")  # fmt: skip
    parser.add_argument("--extract-servers", type=int, default=2,
                        help="servers on the default layers extracting at once (one extractor a server; each "
                             "is one more hsextract serve on the GPU)")  # fmt: skip
    parser.add_argument("--serve-args", default="",
                        help="more hsextract serve options for every server, e.g. --serve-args='--decode-kv static "
                             "--decode-graphs' (regeneration's decode step as a CUDA graph)")  # fmt: skip
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="skip hsextract verify after the extractions (it rereads every file)")  # fmt: skip
    parser.add_argument("--bundle-out", type=Path, default=None, help="save the target and regenerated conversations here")
    parser.add_argument("--bundle-in", type=Path, default=None, help="start from a bundle: no target training, no regeneration")
    parser.add_argument("--wall-budget-s", type=float, default=None,
                        help="cut training so the whole call ends within this (measuring keeps its reserve)")  # fmt: skip
    parser.add_argument("--corpus-bytes", type=int, default=None, help="standard library text to use (default: all of it)")
    parser.add_argument("--heldout-percent", type=int, default=10)
    parser.add_argument("--user-lines", type=int, default=16)
    parser.add_argument("--assistant-lines", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--target-layers", type=int, default=8)
    parser.add_argument("--target-hidden", type=int, default=384)
    parser.add_argument("--target-steps", type=int, default=850, help="about two passes over the train files' code and prose")
    parser.add_argument("--target-batch", type=int, default=64)
    parser.add_argument("--target-seq-len", type=int, default=512)
    parser.add_argument("--target-max-s", type=float, default=90.0)
    parser.add_argument("--heldout-conversations", type=int, default=200, help="per held-out kind")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--specforge-batch", type=int, default=16, help="SpecForge's training.batch_size (rows a step)")
    parser.add_argument("--train-max-s", type=float, default=1800.0,
                        help="trainers still running then (or at --wall-budget-s less the measuring time) are "
                             "stopped, measured from their last checkpoint, and named with the epochs they did "
                             "(speculators compiles for 2 min and more when several start at once)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-rows", type=int, default=150, help="per held-out kind")
    args = parser.parse_args(argv)
    if args.quick:
        args.corpus_bytes = 4_000_000
        args.target_steps, args.target_max_s, args.train_max_s = 300, 60.0, 150.0
        args.sizes, args.heldout_conversations, args.eval_rows = [min(args.sizes[0], 400)], 60, 60
        args.max_new_tokens, args.epochs = 64, 2
    args.pool = args.pool or max(args.sizes)
    if args.pool < max(args.sizes):
        parser.error(f"--pool {args.pool} is under the largest size {max(args.sizes)}")
    if args.extract_servers < 1:
        parser.error(f"--extract-servers {args.extract_servers}: give 1 or more")
    if args.bundle_in and args.bundle_out:
        parser.error("--bundle-in and --bundle-out: a call either makes the bundle or starts from one")
    return args


def main() -> int:
    args = parse_args()
    e2e.setup_logging("httpx", "httpcore", "hsextract")
    started = time.perf_counter()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    device = torch.device(args.device)
    results = Results(args.out, {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, args.append)
    results.call["versions"] = versions()
    if args.bundle_in:
        results.stage("bundle_in", drafter_bundle.load(args.bundle_in, work))
        target = json.loads((work / "target.json").read_text())
    else:
        target, conversations = make_target(args, work, device)
        (work / "target.json").write_text(json.dumps(target, indent=2) + "\n")
    results.target(target)
    results.stage("target", "from the bundle" if args.bundle_in else "trained")
    servers = start_servers(args, work)
    try:
        results.stage("server_ready_s", {name: server.ready_s for name, server in servers.items()})
        if args.bundle_in:
            results.stage("extend_pool", extend_pool(args, work, servers["default"]))
        else:
            results.stage("regenerate", regenerate(args, work, servers["default"], conversations))
            if args.bundle_out:
                results.stage("bundle_out", drafter_bundle.save(work, BUNDLE_MEMBERS, args.bundle_out))
        pool_size = len(read_jsonl(work / "regen-train.jsonl"))  # "all": the whole regenerated pool
        args.sizes = sorted({min(size, pool_size) for size in args.sizes})
        results.stage(
            "prepare", prepare_all(work, args.sizes, ("specforge", "speculators") if args.specforge else ("speculators",))
        )
        extracted = extract_all(args, work, servers, args.sizes)
        results.stage("extract", {"seconds": round(max(v.get("seconds", 0) for v in extracted.values()), 1)})
    finally:
        stop_servers(servers)
    for name, value in extracted.items():
        drafter, size = name.rsplit("-", 1)
        results.size(int(size), f"extract_{drafter}", value)
    names = list(extracted)
    deadline = args.train_max_s
    if args.wall_budget_s:
        reserve = STOP_GRACE_S + EVAL_RESERVE_S + EVAL_RESERVE_PER_DRAFTER_S * len(names)
        deadline = max(30.0, min(deadline, args.wall_budget_s - reserve - (time.perf_counter() - started)))
    trained = train_all(args, work, names, deadline)
    results.stage("training", trained)
    for name, job in trained["jobs"].items():
        drafter, size = name.rsplit("-", 1)
        results.size(int(size), f"train_{drafter}", {"epochs": args.epochs, **{k: v for k, v in job.items() if k != "argv"}})
    evaluate(args, work, device, trained, results)
    results.stage("evaluate", "done")
    results.call["wall_seconds"] = round(time.perf_counter() - started, 1)
    results.conclude()
    log.info("verdict: %s", json.dumps(results.data["verdict"], indent=2))
    for kind, drafters in results.data["curve"].items():
        for name, points in drafters.items():
            log.info("%-6s %-24s %s", kind, name, points)
    return 0


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "speculators", "specforge", "hs-connectors", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


if __name__ == "__main__":
    sys.exit(main())
