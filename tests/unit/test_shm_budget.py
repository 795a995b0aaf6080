"""The /dev/shm sizing formula of the deployment (roles/hsx_container_env/filter_plugins/shm_budget.py), on known numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "roles" / "hsx_container_env" / "filter_plugins" / "shm_budget.py"
GIB = 1024**3


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hsx_shm_budget", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


budget = _load()


def test_kimi_k2_5_bf16_three_aux_layers_4096_tokens_concurrency_256() -> None:
    # (3 aux + 1 final) x 7168 x 2 bytes = 57344 bytes per token
    assert budget.hsx_shm_bytes_per_token(7168, 3, "specforge", "bfloat16") == 57_344
    # 256 requests x 4096 tokens x 57344 bytes = 56 GiB of dumps at most
    assert budget.hsx_shm_budget_bytes(256, 4096, 7168, 3, "specforge", "bfloat16") == 60_129_542_144 == 56 * GIB
    # x headroom 2.0 = 112 GiB
    assert budget.hsx_shm_size_mb(256, 4096, 7168, 3, "specforge", "bfloat16", 2.0, 1024) == 114_688


def test_speculators_dumps_the_pre_norm_final_state_too() -> None:
    assert budget.hsx_shm_bytes_per_token(7168, 3, "speculators", "bfloat16") == 5 * 7168 * 2
    assert budget.hsx_shm_size_mb(256, 4096, 7168, 3, "speculators", "bfloat16", 2.0, 1024) == 143_360


@pytest.mark.parametrize(("dtype", "element_bytes"), [("bfloat16", 2), ("float16", 2), ("float32", 4)])
def test_bytes_per_element_of_the_dtype(dtype: str, element_bytes: int) -> None:
    assert budget.hsx_shm_bytes_per_token(64, 3, "specforge", dtype) == 4 * 64 * element_bytes


def test_rounded_up_to_a_mib_and_never_below_the_floor() -> None:
    # the deployment tests' settings: 4 x 1024 x 4 x 128 x 2 x 2.0 = 8 MiB, under the 256 MiB floor
    assert budget.hsx_shm_size_mb(4, 1024, 128, 3, "specforge", "bfloat16", 2.0, 256) == 256
    assert budget.hsx_shm_size_mb(4, 1024, 128, 3, "specforge", "bfloat16", 2.0, 1) == 8
    # one byte over a MiB is two MiB; Ansible hands strings in, they are read as numbers
    assert budget.hsx_shm_size_mb("1", "1", "1", "1", "specforge", "float32", "1.0", "0") == 1
    assert budget.hsx_shm_size_mb(1, 131_073, 1, 1, "specforge", "float32", 1.0, 0) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "int8"}, "dtype 'int8' is not one of"),
        ({"output_format": "eagle"}, "format 'eagle' is not one of"),
        ({"concurrency": 0}, "concurrency must be a positive integer"),
        ({"hidden_size": -1}, "hidden_size must be a positive integer"),
        ({"headroom": 0.5}, "headroom must be at least 1.0"),
    ],
)
def test_bad_inputs_say_which_and_what(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"concurrency": 256, "max_seq_len": 4096, "hidden_size": 7168, "aux_layers": 3}
    with pytest.raises(ValueError, match=message):
        budget.hsx_shm_size_mb(**{**args, **kwargs})


def test_the_filters_ansible_sees() -> None:
    filters = budget.FilterModule().filters()
    assert filters["hsx_shm_size_mb"] is budget.hsx_shm_size_mb
    assert {"hsx_shm_bytes_per_token", "hsx_shm_budget_bytes"} <= set(filters)


def test_fp8_dumps_take_their_real_bytes() -> None:
    # K + 1 slots of one byte (the pre-norm final state in the last) and a float32 scale per token
    assert budget.hsx_shm_bytes_per_token(7168, 3, "speculators", "float8_e4m3fn") == 4 * 7168 + 4
    bf16 = budget.hsx_shm_bytes_per_token(7168, 3, "speculators", "bfloat16")
    assert budget.hsx_shm_bytes_per_token(7168, 3, "speculators", "float8_e4m3fn") / bf16 < 0.41
    assert budget.hsx_shm_size_mb(256, 4096, 7168, 3, "speculators", "float8_e4m3fn", 2.0, 1024) == 57_352
    with pytest.raises(ValueError, match="has no FP8 reader"):
        budget.hsx_shm_bytes_per_token(7168, 3, "specforge", "float8_e4m3fn")
