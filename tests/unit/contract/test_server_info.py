"""/server_info: the embedded server's answer, and SGLang's completed by the model's config.json."""

from __future__ import annotations

import json

import pytest

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.launcher import hook_specs
from hsextract.contract.server_info import ServerInfo
from hsextract.errors import ServerError

KIMI = {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840, "torch_dtype": "bfloat16"}


def test_embedded_answer_round_trips() -> None:
    info = ServerInfo("/m", 8, 64, 1024, "float32", [1, 3, 4], "/dev/shm/x", "hsextract-embedded", True, "0.1.0", "hsx")
    assert ServerInfo.parse(info.to_json(), {}) == info
    fp8 = ServerInfo("/m", 8, 64, 1024, "bfloat16", [1, 3, 4], "/x", "hsextract-embedded", True, fp8_per_request=True)
    assert fp8.to_json()["fp8_per_request"] is True and ServerInfo.parse(fp8.to_json(), {}) == fp8


def test_sglang_answer_is_completed_from_the_model_config() -> None:
    sglang_info = {"model_path": "/models/kimi", "tp_size": 8}
    config = {"num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 163840, "torch_dtype": "bfloat16"}
    info = ServerInfo.parse(sglang_info, config)
    assert (info.num_layers, info.hidden_size, info.vocab_size, info.dtype) == (61, 7168, 163840, "bfloat16")
    assert info.engine == "sglang" and info.layer_ids is None and info.provides_final_prenorm is None
    assert info.fp8_per_request is None


def test_vocab_override_and_auto_dtype() -> None:
    info = ServerInfo.parse(
        {"model_path": "/m", "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 10, "dtype": "auto"}, {}, 99
    )
    assert info.vocab_size == 99 and info.dtype is None


def test_unknown_shape_names_the_fix() -> None:
    with pytest.raises(ServerError, match="mount the model at the same path"):
        ServerInfo.parse({"model_path": "/elsewhere"}, {})


def _sglang_info(**launch: object) -> dict[str, object]:
    """SGLang's /server_info lists its arguments: ``forward_hooks`` as the launcher rendered them."""
    config = SGLangLaunchConfig(model_path="/models/kimi", dump_dir="/dev/shm/hsx", num_hidden_layers=61, **launch)  # type: ignore[arg-type]
    return {"model_path": "/models/kimi", "tp_size": 8, "forward_hooks": hook_specs(config, [1, 29, 57])}


def test_sglang_answer_says_the_dump_hook_settings_the_launcher_rendered() -> None:
    plain = ServerInfo.parse(_sglang_info(), KIMI)
    assert plain.dump_dir == "/dev/shm/hsx" and plain.provides_final_prenorm is False and plain.hook_storage == "auto"
    fp8 = ServerInfo.parse(_sglang_info(final_prenorm=True, storage="float8_e4m3fn"), KIMI)
    assert fp8.provides_final_prenorm is True and fp8.hook_storage == "float8_e4m3fn"
    as_text = _sglang_info(final_prenorm=True)
    as_text["forward_hooks"] = json.dumps(as_text["forward_hooks"])  # a server that lists it as its JSON string
    assert ServerInfo.parse(as_text, KIMI).provides_final_prenorm is True


def test_a_server_without_the_dump_hook_says_nothing_of_it() -> None:
    other = {"model_path": "/m", "forward_hooks": [{"hook_factory": "someone.else:make", "config": {"dump_dir": "/x"}}]}
    info = ServerInfo.parse(other, KIMI)
    assert info.dump_dir is None and info.provides_final_prenorm is None and info.hook_storage is None


def test_context_length_is_the_servers_else_the_model_configs() -> None:
    """issue 39, item 3: the embedded server (and SGLang with --context-length) says it; else config.json's
    max_position_embeddings; neither: unknown."""
    shape = {"model_path": "/m", "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 1024}
    assert ServerInfo.parse({**shape, "context_length": 4096}, {"max_position_embeddings": 32768}).context_length == 4096
    assert ServerInfo.parse({**shape, "context_length": None}, {"max_position_embeddings": 32768}).context_length == 32768
    assert ServerInfo.parse({**shape, "context_length": 0}, {}).context_length is None  # the embedded server's "unknown"
    info = ServerInfo("/m", 8, 64, 1024, "float32", [1, 3, 4], "/x", "hsextract-embedded", True, context_length=2048)
    assert ServerInfo.parse(info.to_json(), {}) == info
