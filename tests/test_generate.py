"""Generation through the real embedded HTTP server (a float32 tiny Llama) against transformers' generate."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import transformers

from hsextract.capture.embedded import decode
from hsextract.contract.generate import GenerationAnswer, GenerationRequest, SamplingParams, duplicate_rid_message, error_body
from hsextract.contract.rids import make_rid
from hsextract.errors import BadSampleError
from hsextract.extract.requests.generation_client import generate

PROMPT_LENGTHS = (5, 17, 9, 30, 3, 12, 21, 8)
NEW_TOKENS = (8, 4, 10, 6, 9, 5, 7, 8)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 1000, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@cache
def _reference(model: Path, prompt: tuple[int, ...], new_tokens: int) -> list[int]:
    hf = _hf(model)
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return list(out[0, len(prompt) :].tolist())


@cache
def _hf(model: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model).eval()


def _generate(url: str, request: GenerationRequest) -> GenerationAnswer:
    response = httpx.post(url + "/generate", json=request.to_json(), timeout=120)
    assert response.status_code == 200, response.text
    (answer,) = GenerationAnswer.parse_list(response.json()) or []
    assert answer.rid == request.rid
    return answer


def _all(url: str, requests: list[GenerationRequest]) -> list[GenerationAnswer]:
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: _generate(url, r), requests))


GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


@pytest.mark.parametrize("decode_kv", ["dynamic", "static"])
def test_greedy_equals_transformers_alone_and_batched(model_dir, start_server, decode_kv: str) -> None:
    model = model_dir("llama")
    server = start_server(model, decode_kv=decode_kv)
    prompts = _prompts()
    expected = [_reference(model, tuple(p), n) for p, n in zip(prompts, NEW_TOKENS, strict=True)]
    alone = _generate(server.url, GenerationRequest("regen-0", prompts[0], SamplingParams(NEW_TOKENS[0], 0.0)))
    assert alone.output_ids == expected[0] and alone.finish_reason.type == "length" and alone.prompt_tokens == 5
    # a stop id taken from the middle of two references: those finish early, on it, with it last
    stop = expected[2][4]
    requests = [
        GenerationRequest(f"regen-{i}", p, SamplingParams(n, 0.0, stop_token_ids=(stop,)))
        for i, (p, n) in enumerate(zip(prompts, NEW_TOKENS, strict=True))
    ]
    answers = _all(server.url, requests)
    early = 0
    for answer, want in zip(answers, expected, strict=True):
        if stop in want:
            want = want[: want.index(stop) + 1]
            early += 1
            assert answer.finish_reason.type == "stop" and answer.finish_reason.matched == stop
        assert answer.output_ids == want, answer.rid
    assert early >= 1
    # SGLang's batched body (the client's one POST): a list of answers in order
    listed = generate(server.url, [dataclasses.replace(r, rid=f"again-{r.rid}") for r in requests[:3]])
    assert [a.output_ids for a in listed] == [a.output_ids for a in answers[:3]]
    assert not list(server.dump_dir.iterdir())  # generation is never dumped


@pytest.mark.parametrize("decode_kv", ["dynamic", "static"])
def test_seeded_sampling_is_reproducible_alone_and_batched_and_top_k_1_is_greedy(model_dir, start_server, decode_kv: str) -> None:
    model = model_dir("llama")
    server = start_server(model, decode_kv=decode_kv)
    prompts = _prompts()
    seeded = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=7, ignore_eos=True)
    first = _generate(server.url, GenerationRequest("s-alone", prompts[1], seeded)).output_ids
    others = [
        GenerationRequest(f"s-{i}", p, SamplingParams(max_new_tokens=10, temperature=0.9)) for i, p in enumerate(prompts[2:8])
    ]
    batched = _all(server.url, [GenerationRequest("s-batched", prompts[1], seeded), *others])
    assert batched[0].output_ids == first and len(first) == 10
    other_seed = _generate(
        server.url, GenerationRequest("s-other", prompts[1], SamplingParams(10, 1.0, 0.95, seed=8, ignore_eos=True))
    )
    assert other_seed.output_ids != first
    top1 = _generate(server.url, GenerationRequest("k1", prompts[3], SamplingParams(9, temperature=0.8, top_k=1)))
    assert top1.output_ids == _reference(model, tuple(prompts[3]), 9)


@pytest.mark.parametrize("decode_kv", ["dynamic", "static"])
def test_a_small_token_budget_queues_requests_and_all_finish(model_dir, start_server, decode_kv: str) -> None:
    model = model_dir("llama")
    server = start_server(model, max_total_tokens=64, max_running_requests=3, decode_kv=decode_kv)
    prompts = _prompts()[:8]
    requests = [GenerationRequest(f"b-{i}", p, SamplingParams(6, 0.0)) for i, p in enumerate(prompts)]
    answers = _all(server.url, requests)
    for answer, prompt in zip(answers, prompts, strict=True):
        want = _reference(model, tuple(prompt), 6)
        assert answer.output_ids == want
    decoder = server.engine.decoder
    if decoder.static:  # the buffers are kept a while for the next requests, then freed
        deadline = time.monotonic() + decode.IDLE_RELEASE_S + 5
        while decoder.kv_gauge._value.get() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert decoder.kv_gauge._value.get() == 0  # the batch emptied
    assert server.engine.decoder.static == (decode_kv == "static")
    # past the budget alone: max_new_tokens is capped to it (SGLang caps it too)
    capped = _generate(server.url, GenerationRequest("b-cap", prompts[3], SamplingParams(60, 0.0, ignore_eos=True)))
    assert capped.truncated and len(capped.output_ids) == 64 - len(prompts[3])


def test_a_prompt_past_the_context_is_refused_with_its_rid(model_dir, start_server) -> None:
    server = start_server(model_dir("llama"), max_total_tokens=40000)
    context = server.engine.decoder.context_length
    for ids, new in (([5] * context, 4), ([5] * (context - 2), 4)):
        rid = f"row-{len(ids)}"
        response = httpx.post(
            server.url + "/generate", json=GenerationRequest(rid, ids, SamplingParams(new, 0.0)).to_json(), timeout=60
        )
        assert response.status_code == 400 and rid in response.json()["error"]["message"]
    bad = httpx.post(server.url + "/generate", json={"input_ids": [1], "sampling_params": {"max_new_tokens": 3, "min_p": 0.5}})
    assert bad.status_code == 400 and "min_p" in bad.json()["error"]["message"]
    with pytest.raises(BadSampleError, match="row-long"):
        generate(server.url, [GenerationRequest("row-long", [5] * context, GREEDY)])
    assert _generate(server.url, GenerationRequest("after", [1, 2, 3], GREEDY)).output_ids


@pytest.mark.parametrize("decode_kv", ["dynamic", "static"])
@pytest.mark.parametrize("arch", ["deepseek_v3"])
def test_extraction_still_dumps_beside_generation(model_dir, start_server, arch: str, decode_kv: str) -> None:
    model = model_dir(arch)
    server = start_server(model, decode_kv=decode_kv)
    prompts = _prompts()
    rid = make_rid(3, len(prompts[0]))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        decoding = [pool.submit(_generate, server.url, GenerationRequest(f"g-{i}", p, GREEDY)) for i, p in enumerate(prompts[:3])]
        prefill = httpx.post(
            server.url + "/generate",
            json={"input_ids": prompts[0], "rid": rid, "sampling_params": {"max_new_tokens": 0}},
            timeout=60,
        )
        answers = [f.result() for f in decoding]
    assert prefill.status_code == 200 and prefill.json()["meta_info"]["completion_tokens"] == 0
    server.engine.sink.flush()
    assert (server.dump_dir / rid / "done").exists() and sorted(p.name for p in server.dump_dir.iterdir()) == [rid]
    assert [a.output_ids for a in answers] == [_reference(model, tuple(p), 8) for p in prompts[:3]]


def test_the_engine_turns_cudnn_attention_off_unless_asked(model_dir, start_server) -> None:  # type: ignore[no-untyped-def]
    """A decode step is one column longer than the last: cuDNN attention would build a plan for every step (an H200
    measured 88-90 ms a step with it on a fresh thread, 22-26 ms without). The switch is process-wide."""
    model = model_dir("llama")
    start_server(model)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    start_server(model, cudnn_attention=True)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)  # PyTorch's default, for the tests after this one


def test_a_rid_still_decoding_refuses_a_body_that_repeats_it_on_either_route_and_holds_none_of_its_rids(
    model_dir, start_server
) -> None:  # type: ignore[no-untyped-def]
    """Two requests of one rid at once would answer one request twice or write one dump twice: while a decode
    runs, a body repeating its rid is refused whole, naming it, on both /generate routes, and the body's
    other rids stay free (a body's rids are taken whole or not at all)."""
    server = start_server(model_dir("llama"))
    decoder = server.engine.decoder
    prompt = _prompts()[0]
    long = SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)  # seconds of decode: the refusals take ms
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(_generate, server.url, GenerationRequest("busy", prompt, long))
        deadline = time.monotonic() + 60
        while not decoder.running_gauge._value.get():
            assert time.monotonic() < deadline and not running.done(), "the long decode never ran"
            time.sleep(0.01)
        decoding = GenerationRequest.batch_json(
            [GenerationRequest("free", prompt, GREEDY), GenerationRequest("busy", prompt, GREEDY)]
        )
        dumping = {
            "input_ids": [prompt, prompt],
            "rid": [make_rid(1, len(prompt)), "busy"],
            "sampling_params": {"max_new_tokens": 0},
        }
        refusals = [httpx.post(server.url + "/generate", json=body, timeout=60) for body in (decoding, dumping)]
        assert not running.done(), "the decode ended before both bodies were refused: make it longer"
        assert len(running.result().output_ids) == long.max_new_tokens
    for refused in refusals:
        assert refused.status_code == 400 and refused.json() == error_body(400, duplicate_rid_message("busy"))
    assert _generate(server.url, GenerationRequest("free", prompt, GREEDY)).output_ids
    assert not list(server.dump_dir.iterdir())
