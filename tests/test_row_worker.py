"""RowWorker alone, against a real HTTP peer that writes real dump files the way a server does.

The peer writes each request's dump (``contract.dumps.write_dump``) and then answers, answers late,
never answers, fails with HTTP 500, or refuses a rid it still holds as SGLang does (400 "Duplicate
request ID"): the worker must settle each row from its dump whatever the answer does, retry a row
whose answer came without a dump, and send a held rid again once it is let go.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from hsextract.contract.files.dumps import DumpSource, write_dump
from hsextract.contract.generate import GenerateAnswer, GenerateRequest, duplicate_rid_message, error_body
from hsextract.contract.server_info import ServerInfo
from hsextract.contract.states import ErrorReason
from hsextract.extract import packing, row_worker
from hsextract.extract.checks.dump_checks import DumpExpectation, Expectations
from hsextract.extract.config import ExtractConfig
from hsextract.extract.ledger import Ledger
from hsextract.extract.metrics import ExtractMetrics
from hsextract.extract.pack_processes import PackProcesses
from hsextract.extract.requests.client import ServerClient
from hsextract.extract.requests.open_requests import OpenRequests
from hsextract.extract.requests.server_gate import ServerGate
from hsextract.extract.row_worker import RowWorker
from hsextract.extract.setup import RunSetup
from hsextract.output.formats import open_format
from hsextract.output.manifest import Manifest
from hsextract.output.sample import Sample
from hsextract.output.serving_hints import sglang_serving

AUX, HIDDEN = [1, 3, 4], 8
SOURCE = DumpSource("test-peer", "0", "/models/peer", AUX, [a + 1 for a in AUX], final_layer_id=7)

# what the peer does for a request: (write its dump?, seconds before answering or None: never, HTTP status)
Behaviour = tuple[bool, float | None, int]


class _Peer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, dump_dir: Path, behave: Callable[[str, int], Behaviour], port: int = 0, calls: dict[str, int] | None = None
    ) -> None:
        self.dump_dir = dump_dir
        self.behave = behave
        self.calls: dict[str, int] = {} if calls is None else calls
        self.release = threading.Event()
        self.answered = threading.Event()
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Peer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # /health, /health_generate
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def do_POST(self) -> None:
        request = GenerateRequest.parse(json.loads(self.rfile.read(int(self.headers["Content-Length"]))), 1000)
        calls = self.server.calls[request.rid] = self.server.calls.get(request.rid, 0) + 1
        dump, delay, status = self.server.behave(request.rid, calls)
        if dump:
            n = len(request.input_ids)
            torch.manual_seed(n)
            ids = torch.tensor(request.input_ids)
            write_dump(self.server.dump_dir, request.rid, ids, torch.randn(n, len(AUX), HIDDEN), torch.randn(n, HIDDEN), SOURCE)
        if delay is None:
            self.server.release.wait()
            return
        self.server.release.wait(delay)
        answer = GenerateAnswer(request.rid, len(request.input_ids)).to_json()
        body = json.dumps(error_body(400, duplicate_rid_message(request.rid)) if status == 400 else answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")  # a peer that goes away leaves no connection behind
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True
        self.server.answered.set()


@pytest.fixture
def run_row(tmp_path: Path) -> Iterator[Callable[..., tuple[Ledger, _Peer, float]]]:
    peers: list[_Peer] = []
    clients: list[ServerClient] = []

    def run(
        behave: Callable[[str, int], Behaviour],
        restart_after_answer: bool = False,
        packer: PackProcesses | None = None,
        rows: int = 1,
        **settings: object,
    ) -> tuple[Ledger, _Peer, float]:
        """``restart_after_answer``: the peer goes away once it has answered, and another one (the same
        behaviour and call count) takes its port 0.5 s later, as a server killed and restarted. ``packer``: the
        run's pack processes. ``rows``: rows 3, 4, ... each on a thread of its own, at once."""
        dump_dir = tmp_path / "dumps"
        dump_dir.mkdir(mode=0o700, exist_ok=True)
        peer = _Peer(dump_dir, behave)
        peers.append(peer)
        threading.Thread(target=peer.serve_forever, daemon=True).start()
        port = peer.server_address[1]
        url = f"http://127.0.0.1:{port}"

        def restart() -> None:
            peer.answered.wait()
            peer.shutdown()
            peer.server_close()
            time.sleep(0.5)
            again = _Peer(dump_dir, behave, port=port, calls=peer.calls)
            peers.append(again)
            threading.Thread(target=again.serve_forever, daemon=True).start()

        if restart_after_answer:
            threading.Thread(target=restart, daemon=True).start()
        cfg = ExtractConfig(server=url, dataset=tmp_path / "d.jsonl", output=tmp_path / "out", **settings)  # type: ignore[arg-type]
        client = ServerClient(url, request_timeout_s=600)
        clients.append(client)
        metrics = ExtractMetrics()
        ledger = Ledger(
            Manifest(tmp_path), metrics, tmp_path, threading.Event(), max_attempts=cfg.max_attempts,
            max_consecutive_failures=9, server_url=url,
        )  # fmt: skip
        expect = DumpExpectation(AUX, [a + 1 for a in AUX], HIDDEN, "float32", False)
        info = ServerInfo(
            "/models/peer", 8, HIDDEN, 1000, "float32", AUX, str(dump_dir), "test-peer", provides_final_prenorm=False
        )
        fmt = open_format("specforge", tmp_path / "out")
        setup = RunSetup(cfg, info, AUX, dump_dir, fmt, sglang_serving(None, AUX, 8))
        gate = ServerGate(client, ledger, metrics, timeout_s=5)
        worker = RowWorker(setup, client, ledger, metrics, Expectations(expect), OpenRequests(), gate, packer=packer)
        started = time.monotonic()
        ids = list(range(1, 11))
        samples = [Sample(row=row, input_ids=ids, loss_mask=[1] * 10, original_length=10) for row in range(3, 3 + rows)]
        with ThreadPoolExecutor(rows) as threads:
            for done in [threads.submit(worker.process, sample, "hash") for sample in samples]:
                done.result()
        took = time.monotonic() - started
        worker.abandon_answers()
        return ledger, peer, took

    yield run
    for peer in peers:
        peer.release.set()
        peer.shutdown()
    for client in clients:
        client.close()


def test_a_dump_without_its_answer_settles_the_row_and_counts_the_answer_late(run_row) -> None:
    ledger, peer, took = run_row(lambda rid, call: (True, None, 200), answer_grace_s=0.2)
    assert set(ledger.manifest.written) == {3} and took < 5
    time.sleep(0.5)  # the grace runs out on the timer thread
    assert ledger.late_answers == 1 and peer.calls == {"hsx-000000003-n10": 1}


def test_an_answer_soon_after_the_dump_is_not_late(run_row) -> None:
    ledger, _, _ = run_row(lambda rid, call: (True, 0.05, 200), answer_grace_s=2.0)
    assert set(ledger.manifest.written) == {3} and ledger.late_answers == 0


def test_a_failed_request_whose_dump_is_complete_still_settles_the_row(run_row) -> None:
    ledger, peer, _ = run_row(lambda rid, call: (True, 0.0, 500))
    assert set(ledger.manifest.written) == {3} and peer.calls == {"hsx-000000003-n10": 1}


def test_an_answer_without_a_dump_waits_dump_timeout_then_retries(run_row) -> None:
    ledger, peer, _ = run_row(lambda rid, call: (call > 1, 0.0, 200), dump_timeout_s=0.3, max_attempts=2)
    assert set(ledger.manifest.written) == {3} and peer.calls == {"hsx-000000003-n10": 2}
    assert ledger.metrics.registry.get_sample_value("hsextract_errors_total", {"reason": ErrorReason.DUMP_TIMEOUT.value}) == 1


def test_a_rid_the_server_still_holds_is_sent_again_once_let_go_without_spending_a_try(run_row) -> None:
    """SGLang answers 400 "Duplicate request ID detected" while it holds an earlier request of the rid
    (cancelled a moment ago: it notices a closed connection only every 4 s). That is no bad sample:
    before, the row was recorded as bad input and left out of the output for good (CI, stop 19)."""
    ledger, peer, took = run_row(lambda rid, call: (call == 3, 0.0, 400 if call < 3 else 200), max_attempts=1)
    assert set(ledger.manifest.written) == {3} and not ledger.manifest.errors
    assert peer.calls == {"hsx-000000003-n10": 3} and took >= 0.25 + 0.5  # waited between sends
    assert ledger.metrics.registry.get_sample_value("hsextract_retries_total") == 0


def test_a_server_killed_after_answering_is_noticed_while_the_row_waits_for_its_dump(run_row, monkeypatch) -> None:
    """SGLang's hook writes the dump after the answer; a server killed in between never writes it.
    Before, the row waited the whole dump_timeout_s for it (300 s by default: CI at stop 19). Now the
    wait checks the server still takes connections, waits for it to be back, and sends the row again
    without spending a try."""
    monkeypatch.setattr(row_worker, "LIVENESS_PROBE_S", 0.3)
    ledger, peer, took = run_row(
        lambda rid, call: (call > 1, 0.0, 200), restart_after_answer=True, dump_timeout_s=120, max_attempts=1
    )
    assert set(ledger.manifest.written) == {3} and not ledger.manifest.errors
    assert peer.calls == {"hsx-000000003-n10": 2} and took < 30
    assert ledger.metrics.registry.get_sample_value("hsextract_server_outages_total") == 1


def test_a_rows_dump_is_packed_in_an_idle_pack_process(run_row, tmp_path: Path) -> None:
    """A process reads, checks and writes the dump with its own interpreter lock; the row's thread syncs the file."""
    out = tmp_path / "out"
    packer = PackProcesses(1, open_format("specforge", out), out)
    try:
        deadline = time.monotonic() + 180  # it imports torch: seconds on a loaded machine
        while packer.idle < 1:
            assert time.monotonic() < deadline, "the pack process did not start"
            time.sleep(0.05)
        ledger, _, _ = run_row(lambda rid, call: (True, 0.0, 200), packer=packer)
    finally:
        packer.close()
    assert set(ledger.manifest.written) == {3}
    assert ledger.metrics.registry.get_sample_value("hsextract_packed_in_process_total") == 1


class _Overlap:
    """Wraps a function the worker calls (the real one runs) and records how many threads were in it at once."""

    def __init__(self, real: Callable[..., object], hold_s: float = 0.0) -> None:
        self.real, self.hold_s = real, hold_s
        self.inside = self.most = 0
        self._lock = threading.Lock()

    def __call__(self, *args: object, **kwargs: object) -> object:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(self.hold_s)  # long enough for every row's thread to get here
            return self.real(*args, **kwargs)
        finally:
            with self._lock:
                self.inside -= 1


@pytest.mark.parametrize("hidden", [HIDDEN, 1 << 16])
def test_rows_are_packed_a_few_at_a_time_however_wide(run_row, monkeypatch: pytest.MonkeyPatch, hidden: int) -> None:
    """With hundreds of rows in flight, every thread whose dump was in packed at once, each giving the interpreter lock
    to the next at every system call: the extractor spent more CPU a row on the switching than on the work. Every row
    takes a turn (ROWS_PACKED_ON_THREADS on threads, one per pack process). Rows of a wide model (here 10 MiB dumps)
    took none: on one H200, 46 of them sat in the finite check at once, each handing the lock over every 512 KiB."""
    monkeypatch.setattr(sys.modules[__name__], "HIDDEN", hidden)
    monkeypatch.setattr(row_worker, "ROWS_PACKED_ON_THREADS", 2)
    packs = _Overlap(packing.pack_row, hold_s=0.3)
    monkeypatch.setattr(row_worker, "pack_row", packs)
    ledger, _, _ = run_row(lambda rid, call: (True, 0.0, 200), rows=6)
    assert set(ledger.manifest.written) == set(range(3, 9))
    assert packs.most == 2
    # the wait for a turn is a stage of its own: where a row's time goes when the packers are the limit
    turns = ledger.metrics.registry.get_sample_value("hsextract_stage_seconds_count", {"stage": "turn"}) or 0
    waited = ledger.metrics.registry.get_sample_value("hsextract_stage_seconds_sum", {"stage": "turn"}) or 0
    assert turns == 6 and waited >= 0.3  # 6 rows, 2 turns of 0.3 s: 4 rows waited at least one


def test_a_rows_file_is_synced_after_its_turn(run_row, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn covers the CPU's work only: the rows' fsyncs, which a slow disk makes long, overlap."""
    monkeypatch.setattr(row_worker, "ROWS_PACKED_ON_THREADS", 1)
    syncs = _Overlap(packing.sync_sample_file, hold_s=0.5)
    monkeypatch.setattr(row_worker, "sync_sample_file", syncs)
    ledger, _, _ = run_row(lambda rid, call: (True, 0.0, 200), rows=4)
    assert set(ledger.manifest.written) == set(range(3, 7))
    assert syncs.most >= 2
