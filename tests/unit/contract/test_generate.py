"""The /generate messages: what the client sends parses on the server side, and back."""

from __future__ import annotations

import pytest

from hsextract.contract.files.fp8 import FP8_STORAGE
from hsextract.contract.generate import GenerateAnswer, GenerateRequest, error_body
from hsextract.contract.server_info import FINAL_PRENORM_KEY, STORAGE_KEY
from hsextract.errors import BadRequestError


def test_request_round_trips_through_json() -> None:
    sent = GenerateRequest("hsx-000000001-n3", [1, 2, 3], final_prenorm=True)
    body = sent.to_json()
    assert body["sampling_params"] == {"max_new_tokens": 0}
    assert body[FINAL_PRENORM_KEY] is True
    assert GenerateRequest.parse(body, vocab_size=10) == sent
    assert FINAL_PRENORM_KEY not in GenerateRequest("r", [1]).to_json()


def test_fp8_storage_round_trips_and_is_absent_by_default() -> None:
    sent = GenerateRequest("hsx-000000001-n3", [1, 2, 3], final_prenorm=True, storage=FP8_STORAGE)
    body = sent.to_json()
    assert body[STORAGE_KEY] == "float8_e4m3fn"
    assert GenerateRequest.parse(body, vocab_size=10) == sent
    assert STORAGE_KEY not in GenerateRequest("r", [1]).to_json()
    assert GenerateRequest.parse({"input_ids": [1], STORAGE_KEY: None}, vocab_size=10).storage is None


def test_a_batch_round_trips_and_shares_its_hsextract_keys() -> None:
    sent = [GenerateRequest("a", [1, 2], storage=FP8_STORAGE), GenerateRequest("b", [3], storage=FP8_STORAGE)]
    body = GenerateRequest.batch_json(sent)
    assert body["input_ids"] == [[1, 2], [3]] and body["rid"] == ["a", "b"] and body[STORAGE_KEY] == FP8_STORAGE
    assert GenerateRequest.parse_batch(body, vocab_size=10) == (sent, True)
    assert GenerateRequest.parse_batch(sent[0].to_json(), vocab_size=10) == ([sent[0]], False)
    with pytest.raises(ValueError, match="must agree"):
        GenerateRequest.batch_json([GenerateRequest("a", [1]), GenerateRequest("b", [1], final_prenorm=True)])
    with pytest.raises(BadRequestError) as caught:
        GenerateRequest.parse(body, vocab_size=10)  # where one prompt is expected (the spot check)
    assert caught.value.reason == "non_integer_ids"
    wrong_bodies = [
        ({**body, "rid": ["a"]}, "bad_rid"),
        ({**body, "rid": ["a", "a"]}, "bad_rid"),
        ({**body, "input_ids": [[1], [10]]}, "out_of_vocab"),
        ({**body, "input_ids": [[1], []]}, "no_input_ids"),
    ]
    for wrong, reason in wrong_bodies:
        with pytest.raises(BadRequestError) as caught:
            GenerateRequest.parse_batch(wrong, vocab_size=10)
        assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([1, 2], "not_an_object"),
        ({"input_ids": []}, "no_input_ids"),
        ({"input_ids": "hello"}, "no_input_ids"),
        ({"input_ids": [1, 2.0]}, "non_integer_ids"),
        ({"input_ids": [1, True]}, "non_integer_ids"),
        ({"input_ids": [1, 10]}, "out_of_vocab"),
        ({"input_ids": [-1]}, "out_of_vocab"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 4}}, "decode_requested"),
        ({"input_ids": [1], "rid": 7}, "bad_rid"),
        ({"input_ids": [1], FINAL_PRENORM_KEY: "yes"}, "bad_final_prenorm"),
        ({"input_ids": [1], STORAGE_KEY: "bfloat16"}, "bad_storage"),
        ({"input_ids": [1], STORAGE_KEY: ["float8_e4m3fn"]}, "bad_storage"),
    ],
)
def test_request_refusals_name_the_reason(body: object, reason: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        GenerateRequest.parse(body, vocab_size=10)
    assert caught.value.reason == reason


def test_a_request_without_rid_gets_one() -> None:
    assert GenerateRequest.parse({"input_ids": [1]}, vocab_size=10).rid


def test_answer_round_trips_and_reads_sglang_lists() -> None:
    answer = GenerateAnswer("r1", 5, 0.25)
    body = answer.to_json()
    assert body["meta_info"]["completion_tokens"] == 0
    assert GenerateAnswer.parse(body) == answer
    assert GenerateAnswer.parse([body]) == answer
    assert GenerateAnswer.parse({"meta_info": {}}) == GenerateAnswer(None, None, None)
    assert GenerateAnswer.parse("<html>") is None


def test_error_body_is_sglangs() -> None:
    assert error_body(400, "bad") == {"error": {"message": "bad", "code": 400}}
