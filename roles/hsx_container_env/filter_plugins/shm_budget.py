"""The /dev/shm size a deployment needs: the one place its formula lives (docs/deploy.md, "/dev/shm size").

Every request in flight can hold one dump on the tmpfs (the dump contract, hsextract/contract/dumps.py):
per token the K aux hidden states, the final (post-norm) one and, for the speculators format, the final
pre-norm one, each ``hidden_size`` elements of the model's dtype. So::

    bytes per token = (K + 1 [+ 1 speculators]) x hidden_size x bytes per element (bfloat16/float16 2, float32 4)
    FP8 (dtype float8_e4m3fn, speculators only; hsextract/contract/fp8.py): the server quantizes on the GPU and
    dumps (K + 1) slots (the last one the pre-norm final state) of 1 byte plus a float32 scale per token:
    bytes per token = (K + 1) x hidden_size + 4
    size (MiB)      = ceil(concurrency x max_seq_len x bytes per token x headroom / 2**20), at least min_mb

The headroom covers dumps complete but not yet taken up, the input ids (8 bytes per token) and meta.json,
and NCCL's own segments. ``playbooks/vars/deploy.yml`` computes ``hsx_shm_size_mb_effective`` with it (ansible.cfg
names this directory in ``filter_plugins``, so every play of the repository has it); role hsx_container_env checks
that the container's memory holds the result.
"""

from __future__ import annotations

import math

#: bytes per element of the dtypes a server dumps hidden states in
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
#: the FP8 storage (one float32 scale per token, the final state in the last of K + 1 slots)
FP8 = "float8_e4m3fn"
FP8_SCALE_BYTES = 4
#: output formats whose dumps also carry the final layer's pre-norm state
FORMATS_WITH_PRENORM = frozenset({"speculators"})
FORMATS = frozenset({"specforge", "speculators"})
MIB = 1024 * 1024


def _positive(name, value):
    number = int(value)
    if number <= 0:
        raise ValueError(f"hsx shm budget: {name} must be a positive integer, got {value!r}")
    return number


def hsx_shm_bytes_per_token(hidden_size, aux_layers, output_format="specforge", dtype="bfloat16"):
    """Bytes one token takes in a dump: (K + 1 [+ 1 pre-norm for speculators]) x hidden_size x dtype bytes."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"hsx shm budget: dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}; set hsx_hidden_dtype")
    if output_format not in FORMATS:
        raise ValueError(f"hsx shm budget: format {output_format!r} is not one of {sorted(FORMATS)}")
    if dtype == FP8:
        if output_format not in FORMATS_WITH_PRENORM:
            raise ValueError(
                f"hsx shm budget: format {output_format!r} has no FP8 reader; set hsx_output_format speculators or "
                "hsx_hidden_dtype to the model's dtype"
            )
        return (_positive("aux_layers", aux_layers) + 1) * _positive("hidden_size", hidden_size) + FP8_SCALE_BYTES
    layers = _positive("aux_layers", aux_layers) + 1 + (1 if output_format in FORMATS_WITH_PRENORM else 0)
    return layers * _positive("hidden_size", hidden_size) * DTYPE_BYTES[dtype]


def hsx_shm_budget_bytes(concurrency, max_seq_len, hidden_size, aux_layers, output_format="specforge", dtype="bfloat16"):
    """Bytes the dumps of ``concurrency`` requests of ``max_seq_len`` tokens take at most (no headroom)."""
    per_token = hsx_shm_bytes_per_token(hidden_size, aux_layers, output_format, dtype)
    return _positive("concurrency", concurrency) * _positive("max_seq_len", max_seq_len) * per_token


def hsx_shm_size_mb(
    concurrency, max_seq_len, hidden_size, aux_layers, output_format="specforge", dtype="bfloat16", headroom=2.0, min_mb=1024
):
    """The /dev/shm size in MiB: the dump budget x headroom, rounded up, at least ``min_mb``."""
    if float(headroom) < 1.0:
        raise ValueError(f"hsx shm budget: headroom must be at least 1.0, got {headroom!r}")
    budget = hsx_shm_budget_bytes(concurrency, max_seq_len, hidden_size, aux_layers, output_format, dtype)
    return max(math.ceil(budget * float(headroom) / MIB), int(min_mb))


class FilterModule:
    def filters(self):
        return {
            "hsx_shm_bytes_per_token": hsx_shm_bytes_per_token,
            "hsx_shm_budget_bytes": hsx_shm_budget_bytes,
            "hsx_shm_size_mb": hsx_shm_size_mb,
        }
