"""The embedded server speaks SGLang's request and response shapes and stays healthy."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from hsextract.capture.front.asgi import MAX_BODY_BYTES
from hsextract.contract.files.dumps import read_dump
from hsextract.contract.generate import GenerateRequest, error_body
from hsextract.contract.rids import make_rid

from .helpers import free_port


def test_health_info_and_generate_shapes(model_dir, start_server) -> None:
    server = start_server(model_dir("llama"), chunked_prefill_size=32)
    assert httpx.get(server.url + "/health_generate").status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200
    info = httpx.get(server.url + "/server_info").json()
    assert info["num_hidden_layers"] == 8 and info["hidden_size"] == 64 and info["vocab_size"] == 1024
    assert info["layer_ids"] == [1, 3, 4] and info["capture_indices"] == [2, 4, 5]  # the default [1, N//2-1, N-4]
    assert info["architecture"] == "LlamaForCausalLM" and info["dtype"] == "float32"
    rid = make_rid(12, 70)
    body = httpx.post(
        server.url + "/generate", json={"input_ids": list(range(70)), "rid": rid, "sampling_params": {"max_new_tokens": 0}}
    ).json()
    assert body["meta_info"]["id"] == rid and body["meta_info"]["prompt_tokens"] == 70
    assert body["meta_info"]["completion_tokens"] == 0 and body["output_ids"] == []
    server.engine.sink.flush()
    assert (server.dump_dir / rid / "done").exists()


def test_bad_requests_get_400_and_the_server_stays_healthy(model_dir, start_server) -> None:
    server = start_server(model_dir("deepseek_v3"))
    for payload in (
        {"input_ids": [], "sampling_params": {"max_new_tokens": 0}},
        {"input_ids": [1, 5000], "sampling_params": {"max_new_tokens": 0}},
        {"input_ids": [1, -1], "sampling_params": {"max_new_tokens": 0}},
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}},
        {"text": "hello"},
        [1, 2],
    ):
        response = httpx.post(server.url + "/generate", json=payload)
        assert response.status_code == 400, payload
        assert response.json()["error"]["message"]
    assert httpx.get(server.url + "/health_generate").status_code == 200


def test_only_extractor_rids_are_dumped_and_never_outside_the_dump_dir(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"), dump_dir=tmp_path / "dumps")
    for rid in ("plain", "hsx-../../escape-n3", "hsx-000000001-n3/..", make_rid(1, 3)):
        httpx.post(server.url + "/generate", json={"input_ids": [1, 2, 3], "rid": rid, "sampling_params": {"max_new_tokens": 0}})
    server.engine.sink.flush()
    assert [p.name for p in (tmp_path / "dumps").iterdir()] == [make_rid(1, 3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dumps"]


def generate(url: str, rid: str, ids: list[int], **extra: object) -> httpx.Response:
    return httpx.post(url + "/generate", json={"input_ids": ids, "rid": rid, "sampling_params": {"max_new_tokens": 0}, **extra})


def test_a_request_is_answered_once_its_dump_is_written(model_dir, start_server) -> None:
    server = start_server(model_dir("llama"), chunked_prefill_size=32)
    for row, n in ((1, 20), (2, 75)):  # one whole prompt, one prefilled in three chunks
        rid = make_rid(row, n)
        assert generate(server.url, rid, list(range(n))).status_code == 200
        assert (server.dump_dir / rid / "done").exists()  # no flush: the answer waited for the dump


def test_the_pre_norm_state_is_dumped_only_for_requests_that_ask(model_dir, start_server) -> None:
    server = start_server(model_dir("llama"), chunked_prefill_size=32)
    assert httpx.get(server.url + "/server_info").json()["final_prenorm_per_request"] is True
    plain, asked, chunked = make_rid(1, 10), make_rid(2, 10), make_rid(3, 40)
    assert generate(server.url, plain, list(range(10))).status_code == 200
    assert generate(server.url, asked, list(range(10)), hsextract_final_prenorm=True).status_code == 200
    assert generate(server.url, chunked, list(range(40)), hsextract_final_prenorm=True).status_code == 200
    plain_dump = read_dump(server.dump_dir / plain)
    assert plain_dump.final_prenorm_hidden_state is None and not plain_dump.is_stacked
    # asked: stacked [aux..., pre-norm final] as speculators' sample holds it, without the post-norm state
    with_prenorm = read_dump(server.dump_dir / asked)
    assert with_prenorm.is_stacked and with_prenorm.meta.final_slot == "prenorm" and with_prenorm.final_hidden_state is None
    assert with_prenorm.hidden_states is not None and tuple(with_prenorm.hidden_states.shape) == (10, 4, 64)
    assert with_prenorm.final_prenorm_hidden_state is not None and with_prenorm.final_prenorm_hidden_state.shape == (10, 64)
    assert torch.equal(with_prenorm.aux_hidden_states, plain_dump.aux_hidden_states)  # type: ignore[arg-type]
    assert not torch.equal(with_prenorm.final_prenorm_hidden_state, plain_dump.plain_states("this test")[1])
    chunked_dump = read_dump(server.dump_dir / chunked)
    assert chunked_dump.meta.extend_passes == 2 and chunked_dump.final_prenorm_hidden_state is not None
    assert chunked_dump.is_stacked
    bad = generate(server.url, make_rid(4, 3), [1, 2, 3], hsextract_final_prenorm="yes")
    assert bad.status_code == 400 and "hsextract_final_prenorm" in bad.json()["error"]["message"]


def test_metrics_show_where_the_server_spends_its_time(model_dir, start_server) -> None:
    server = start_server(model_dir("llama"))
    for row in range(3):
        generate(server.url, make_rid(row, 30), list(range(30)))
    text = httpx.get(server.url + "/metrics").text
    values = {(s.name, s.labels.get("stage")): s.value for family in text_string_to_metric_families(text) for s in family.samples}
    for stage in ("queue", "idle", "launch", "forward", "wait_sink", "dump_write"):
        assert values[("hsextract_server_stage_seconds_count", stage)] >= 1, stage
        assert values[("hsextract_server_stage_seconds_sum", stage)] > 0, stage
    assert values[("hsextract_server_dumps_total", None)] == 3
    assert values[("hsextract_server_tokens_total", None)] >= 90  # the health checks forward a token each
    assert values[("hsextract_server_padded_tokens_total", None)] >= values[("hsextract_server_tokens_total", None)]
    assert values[("hsextract_server_dump_bytes_total", None)] == 3 * 30 * (8 + 4 * 64 * 4)  # ids + (K+1) fp32 states


def test_keep_alive_and_error_bodies_on_the_real_engine(model_dir, start_server) -> None:
    server = start_server(model_dir("llama"))
    port = int(server.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ends = set()
    for row in range(4):
        rid = make_rid(row, 12)
        conn.request("POST", "/generate", body=json.dumps(GenerateRequest(rid, list(range(12))).to_json()))
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["meta_info"]["id"] == rid
        assert (server.dump_dir / rid / "done").exists()
        assert conn.sock is not None
        ends.add(conn.sock.getsockname())
    conn.request("GET", "/nope")
    missing = conn.getresponse()
    assert missing.status == 404 and json.loads(missing.read()) == error_body(404, "no route /nope")
    conn.request("GET", "/generate")
    wrong = conn.getresponse()
    assert wrong.status == 405 and json.loads(wrong.read())["error"]["code"] == 405
    assert len(ends) == 1  # one connection for every request
    conn.putrequest("POST", "/generate")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()
    too_large = conn.getresponse()
    assert too_large.status == 413 and json.loads(too_large.read())["error"]["code"] == 413
    conn.close()
    assert generate(server.url, make_rid(9, 5), list(range(5))).status_code == 200  # still serving


def test_serve_stops_on_sigterm_with_every_request_answered_and_the_dumps_flushed(model_dir, tmp_path: Path) -> None:
    port, dump_dir, log = free_port(), tmp_path / "dumps", tmp_path / "serve.log"
    args = [sys.executable, "-m", "hsextract", "serve", "--model", str(model_dir("llama")), "--dump-dir", str(dump_dir)]
    with log.open("wb") as handle:
        process = subprocess.Popen([*args, "--port", str(port)], stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the server never became healthy"
            try:
                if httpx.get(url + "/health_generate", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        # Every request sent, on its own connection, before the signal: open requests, not new connections.
        rids = [make_rid(row, 1500) for row in range(16)]
        conns = []
        for rid in rids:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/generate", body=json.dumps(GenerateRequest(rid, [i % 1000 for i in range(1500)]).to_json()))
            conns.append(conn)
        time.sleep(0.5)  # the server has accepted them all; some are answered, some still open
        process.send_signal(signal.SIGTERM)
        answers: dict[str, int] = {}
        for rid, conn in zip(rids, conns, strict=True):
            response = conn.getresponse()  # a cut connection raises
            body = json.loads(response.read())
            assert response.status == 200 or body["error"]["message"].startswith("server shutting down"), body
            answers[rid] = response.status
            conn.close()
        assert process.wait(timeout=40) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "SIGTERM: no new connections" in text and "stopping: finishing the dumps in the queue" in text, text[-3000:]
    assert set(answers.values()) <= {200, 503}, answers
    for rid, status in answers.items():
        if status == 200:
            assert (dump_dir / rid / "done").exists(), rid
    assert not list(dump_dir.rglob("*.tmp*")), "a dump was left half written"
