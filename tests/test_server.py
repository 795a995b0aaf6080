"""The embedded server speaks SGLang's request and response shapes and stays healthy."""

from __future__ import annotations

from pathlib import Path

import httpx

from hsextract.contract.rids import make_rid


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
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8}},
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
