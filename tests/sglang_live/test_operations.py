"""The real SGLang server under operations: the launcher's flags and refusals, a few hundred rows at
high concurrency, a full dump tmpfs, the hook's settings read back, a rid the server still holds, a
SIGKILL mid-run with a restart and a resume.

These run on the family the value tests started last (qwen2), so no further server start is needed;
the SIGKILL test restarts it through the same launcher config. The last test checks that the stand-in
sgl_kernel was loaded and never called.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from hsextract.contract.files.dumps import dump_state
from hsextract.contract.generate import GenerateRequest
from hsextract.contract.model_config import read_model_config
from hsextract.contract.rids import make_rid
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.states import DumpState
from hsextract.errors import BadSampleError, RidInUseError
from hsextract.extract.requests.client import ServerClient

from .helpers import (
    CHUNK,
    CPU_ARGS,
    DEFAULT_AUX,
    HSEXTRACT,
    VOCAB,
    LiveServer,
    data_config,
    errors,
    extract,
    write_dataset,
)

FAMILY = "qwen2"


@pytest.fixture(scope="module")
def server(live) -> LiveServer:  # type: ignore[no-untyped-def]
    started: LiveServer = live(FAMILY)
    return started


def _launch(config: dict[str, object], path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([HSEXTRACT, "launch-sglang", "--config", str(path), *args], capture_output=True, text=True, timeout=120)


def test_the_flags_the_launcher_renders_are_in_force_on_the_live_server(server: LiveServer, tmp_path: Path) -> None:
    dry = _launch(server.config, tmp_path / "same.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    argv = shlex.split(dry.stdout.strip().splitlines()[-1])
    hooks = json.loads(argv[argv.index("--forward-hooks") + 1])
    info = server.server_info()
    expected = {
        "model_path": server.config["model_path"],
        "disable_radix_cache": True,
        "chunked_prefill_size": CHUNK,
        "disable_prefill_cuda_graph": True,
        "enable_return_aux_hidden_states": True,
        "enable_return_hidden_states": True,  # the extractor's spot check
        "aux_hidden_state_capture": "eagle3",
        "return_aux_hidden_state_layer_ids": DEFAULT_AUX,
        "forward_hooks": hooks,
        "enable_metrics": True,
        "trust_remote_code": True,
        "disable_custom_all_reduce": False,
        # the CPU flags, passed through extra_args
        "device": "cpu",
        "attention_backend": "torch_native",
        "skip_tokenizer_init": True,
        "max_total_tokens": 16384,
        "dtype": "float32",
    }
    assert {key: info.get(key) for key in expected} == expected
    assert [h["name"] for h in hooks] == ["hsextract_dump", "hsextract_prenorm"] and hooks[0]["config"]["final_prenorm"]
    assert all(arg in argv for arg in CPU_ARGS)
    metrics = httpx.get(f"{server.url}/metrics", timeout=30)
    assert metrics.status_code == 200 and "sglang:" in metrics.text


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"disable_radix_cache": False}, "disable_radix_cache is false"),
        ({"extra_args": ["--speculative-draft-model-path", "/models/draft"]}, "a draft model changes"),
        ({"extra_args": ["--chunked-prefill-size", "128"]}, "use the config key chunked_prefill_size"),
        ({"extra_args": ["--enable-hierarchical-cache"]}, "prefix cache"),
        ({"extra_args": ["--pp-size", "2"]}, "pipeline parallel size 1"),
        ({"python": "python3"}, "not an absolute path"),
        ({"chunked_prefill_size": 0}, "must be -1 (off) or positive"),
        ({}, "is in use"),  # the live server's own port: a second start is refused before anything runs
    ],
)
def test_the_launcher_refuses_before_anything_starts(
    server: LiveServer, tmp_path: Path, change: dict[str, object], message: str
) -> None:
    result = _launch({**server.config, **change}, tmp_path / "refused.yaml")
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert httpx.get(f"{server.url}/health_generate", timeout=60).status_code == 200  # the live one is untouched


def test_a_server_whose_port_was_taken_before_it_bound_it_starts_on_another(server: LiveServer) -> None:
    """Between choosing a free port and SGLang binding it, another process may take it (an outgoing
    connection's ephemeral port). Taken after the launcher's check, SGLang logged the bind error and hung in
    its shutdown, and the start waited out its 420 s (a random make test failure); taken before, the launcher
    refuses (as here). Both are read from the log and the server starts again on a free port."""
    server.stop()
    taken = server.config["port"]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        started = time.monotonic()
        server.start()
        took = time.monotonic() - started
    assert server.config["port"] != taken
    assert yaml.safe_load(server.config_path.read_text())["port"] == server.config["port"]  # what later starts read
    assert httpx.get(f"{server.url}/health_generate", timeout=60).status_code == 200
    print(f"\nport {taken} taken: started on {server.config['port']} in {took:.0f} s")


def test_hundreds_of_rows_at_high_concurrency_without_a_stall(server: LiveServer, tmp_path: Path) -> None:
    lengths = [4 + (i * 37) % 90 for i in range(300)]
    dataset = write_dataset(tmp_path / "many.jsonl", lengths, seed=21)
    started = time.monotonic()
    result = extract(server, dataset, tmp_path / "out", "--concurrency", "128", "--stall-timeout-s", "60", timeout=400)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    config = data_config(tmp_path / "out")
    assert config["status"] == "complete" and config["total_samples"] == 300 and config["total_tokens"] == sum(lengths)
    assert errors(tmp_path / "out") == []
    print(f"\n300 rows ({sum(lengths)} tokens) at concurrency 128 in {took:.1f} s")


def _dumps_left(dump_dir: Path) -> list[str]:
    return sorted(p.name for p in dump_dir.iterdir() if p.name.startswith("hsx-")) if dump_dir.exists() else []


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
def test_a_full_dump_tmpfs_holds_the_extractor_back_and_loses_nothing(server: LiveServer, tmp_path: Path) -> None:
    """A 1 MiB tmpfs over the live server's dump root holds about 4 of these dumps. The high-water mark (5 %,
    a fifth of one dump) holds submissions back while dumps wait to be packed; the requests in flight must fit
    (3 x about 270 KB): their dumps are written whatever the gate says. With 8 in flight (as this test had) the
    server's writes overflowed whenever the extractor packed more slowly than it forwarded (a loaded CI
    machine), and the run stopped, as it should, with a DiskFullError naming --concurrency."""
    assert _dumps_left(server.dump_dir) == [], "dumps left by an earlier test"
    lengths = [150 + (i * 13) % 60 for i in range(24)]  # each dump ~1.3 KB/token: about 250 KB
    dataset = write_dataset(tmp_path / "data.jsonl", lengths, seed=31)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(server.dump_dir)], check=True)
    try:
        flags = ["--format", "speculators", "--concurrency", "3", "--shm-high-water", "0.05"]
        result = extract(server, dataset, tmp_path / "out", *flags, timeout=400)
        left = _dumps_left(server.dump_dir)
    finally:
        subprocess.run(["umount", str(server.dump_dir)], check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    config = data_config(tmp_path / "out")
    assert config["status"] == "complete" and config["total_samples"] == len(lengths), config
    assert config["total_tokens"] == sum(lengths) and errors(tmp_path / "out") == []
    assert left == [], f"dumps left on the tmpfs after the run: {left}"
    print(f"\nheld back while the dump tmpfs drained: {'waiting for it to drain' in result.stderr}")


def test_the_dump_hook_settings_are_read_from_the_live_server_and_another_storage_is_refused_before_any_work(
    server: LiveServer, tmp_path: Path
) -> None:
    """SGLang's /server_info lists its --forward-hooks: the extractor reads the dump root, the pre-norm
    dump and the storage from it, so an FP8 run against a model-dtype hook stops before any request."""
    info = ServerInfo.parse(server.server_info(), read_model_config(str(server.model)))
    assert info.engine == "sglang" and info.dump_dir == str(server.dump_dir)
    assert info.provides_final_prenorm is True and info.hook_storage == "auto"
    dataset = write_dataset(tmp_path / "data.jsonl", [20, 30], seed=5)
    refused = extract(server, dataset, tmp_path / "out", "--format", "speculators", "--storage", "float8_e4m3fn")
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "asks for FP8, but the server's dump hook stores the model's dtype" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()


def test_a_rid_the_live_server_still_holds_is_refused_and_read_as_rid_in_use(server: LiveServer) -> None:
    """contract.generate.DUPLICATE_RID_PREFIX against SGLang itself: a second request of a rid it still
    holds gets its HTTP 400, which the client takes for "send it again once let go" (RidInUseError),
    never for a bad sample; once the first is answered, the rid is free again."""
    ids = [(i * 7919) % VOCAB for i in range(3000)]  # long enough to be in flight when the second arrives
    client = ServerClient(server.url)
    try:
        first = client.send_prefill(GenerateRequest("live-duplicate-check", ids))
        time.sleep(0.05)
        second = client.send_prefill(GenerateRequest("live-duplicate-check", ids[:5]))
        assert second.wait(60)
        with pytest.raises(RidInUseError, match="still holds an earlier request of live-duplicate-check"):
            second.result()
        assert first.wait(120) and first.result().prompt_tokens == len(ids)
        third = client.send_prefill(GenerateRequest("live-duplicate-check", ids[:5]))
        assert third.wait(60) and third.result().prompt_tokens == 5
    finally:
        client.close()


def test_rows_in_one_post_are_answered_and_dumped_row_by_row_and_a_refused_prompt_fails_only_its_row(
    server: LiveServer,
) -> None:
    """prefill_batches against SGLang itself: rows that wait for the one slot go in one POST (SGLang's batched
    form: lists of input_ids and rids), each gets its own answer and its own dump. A prompt SGLang refuses (past
    the context) is answered with a 400 for the whole POST: its rows are sent again alone, and only it is refused."""
    client = ServerClient(server.url, rows_per_request=4, prefill_posts=1, tokens_per_request=65536)
    posts: list[int] = []
    client.observe_rows_per_post = posts.append
    # rids as the extractor makes them (the hook dumps only those): the first, one past the context, two short
    first, long, a, b = (make_rid(900_000 + i, n) for i, n in enumerate((300, 40000, 20, 35)))
    lengths = {first: 300, long: 40000, a: 20, b: 35}
    rids = list(lengths)
    try:
        prompts = {rid: [(i * 31) % VOCAB for i in range(n)] for rid, n in lengths.items()}
        pending = {rid: client.send_prefill(GenerateRequest(rid, ids)) for rid, ids in prompts.items()}
        for rid in rids:
            assert pending[rid].wait(300), rid
        with pytest.raises(BadSampleError, match=f"server refused {long} with HTTP 400.*context length"):
            pending[long].result()
        for rid in (first, a, b):
            answer = pending[rid].result()
            assert (answer.rid, answer.prompt_tokens) == (rid, lengths[rid])
            deadline = time.monotonic() + 30  # the hook writes after answering
            while dump_state(server.dump_dir / rid) is not DumpState.DONE:
                assert time.monotonic() < deadline, f"no complete dump of {rid}"
                time.sleep(0.05)
        # the first alone (its slot), the other three together (refused), then each of them alone
        assert sorted(posts) == [1, 1, 1, 1, 3], posts
    finally:
        client.close()
        for rid in rids:
            shutil.rmtree(server.dump_dir / rid, ignore_errors=True)


def test_sigkill_of_the_server_mid_run_then_restart_and_resume_gives_the_clean_output(server: LiveServer, tmp_path: Path) -> None:
    """The run waits for the restarted server (server_gate) and ends complete by itself; a rerun then
    has nothing to do. Before, the rows in flight spent their tries against the refused connection,
    and once a watchdog resend met SGLang's 400 for the rid it still held, a row was recorded as bad
    input and left out of the output for good (CI at stop 19: 11 samples of 12)."""
    lengths = [60 + (i * 29) % 140 for i in range(12)]
    dataset = write_dataset(tmp_path / "data.jsonl", lengths, seed=41)
    args = ("--format", "speculators", "--concurrency", "1")
    clean = extract(server, dataset, tmp_path / "clean", *args)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    out = tmp_path / "killed"
    argv = [HSEXTRACT, "extract", "--server", server.url, "--dataset", str(dataset), "--output", str(out),
            "--dump-dir", str(server.dump_dir), "--server-down-timeout-s", "600", *args]  # fmt: skip
    log = tmp_path / "interrupted.log"
    with open(log, "wb") as handle:
        interrupted = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(list((out / "hidden_states").glob("hs_*.safetensors"))) < 4:
            assert interrupted.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run wrote fewer than 4 samples in 120 s"
            time.sleep(0.05)
        server.kill(signal.SIGKILL)  # the server and its scheduler, mid-run
        written_at_kill = len(list((out / "hidden_states").glob("hs_*.safetensors")))
        server.start()  # through the launcher, same config
        try:
            interrupted.wait(timeout=300)  # it waits for the server and goes on
        except subprocess.TimeoutExpired:
            pytest.fail(f"the extractor neither finished nor stopped 300 s after the restart:\n{log.read_text()[-3000:]}")
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
            interrupted.wait()
    assert written_at_kill < len(lengths), "the run was over before the kill"
    outcome = log.read_text()
    assert interrupted.returncode == 0 and "waited through 1 server outage(s)" in outcome, outcome[-3000:]
    resumed = extract(server, dataset, out, *args)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    config, reference = data_config(out), data_config(tmp_path / "clean")
    for key in ("status", "total_samples", "total_tokens", "layer_ids", "failed_samples", "hidden_size"):
        assert config[key] == reference[key], key
    assert errors(out) == [] and "written now 0, already done 12" in resumed.stdout, resumed.stdout[-2000:]
    for row in range(len(lengths)):
        name = f"hidden_states/hs_{row}.safetensors"
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), f"row {row} differs from the clean run"
    print(f"\nSIGKILL after {written_at_kill} of {len(lengths)} rows; restart ready in {server.start_seconds[-1]:.0f} s")


def test_the_stand_in_sgl_kernel_was_loaded_and_never_called(server: LiveServer) -> None:
    events = server.stub_log.read_text().splitlines() if server.stub_log.exists() else []
    assert any(line.endswith(" import") for line in events), "the server did not load the stand-in sgl_kernel"
    calls = [line for line in events if " call " in line]
    assert calls == [], f"SGLang called the stand-in sgl_kernel: {calls}"
