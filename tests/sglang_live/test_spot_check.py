"""The spot check on the real SGLang 0.5.23 server (CPU, float32, chunked prefill of 64 tokens).

A run with ``--spot-check-every 1``, alone and at the default concurrency, passes: every row's dump equals SGLang's own
``return_hidden_states`` at the positions SGLang returns (the last extend pass of the first
``spot_check_max_tokens`` tokens), and ``data_config.json`` says what was checked and what not (the
final state: SGLang returns only the aux states when aux capture is on). The same run against the same
server whose dump hook is one layer late (``stub/hsx_faulty_hook.py``, in place of ``make_hook``) is
caught on the first checked rows and stops, nothing written. Llama only: the check does not depend on
the family, and each server start costs a minute or two here.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from .helpers import CHUNK, LiveServer, data_config, errors, extract, server_env, write_dataset

LENGTHS = [3, 17, 40, 64, 65, 90, 128, 150, 191, 257, 300]  # most above CHUNK; two above spot_check_max_tokens 256
FAULTY_FACTORY = "hsx_faulty_hook:make_aux_late_hook"


class FaultyHookServer(LiveServer):
    """The launcher's own command, with the dump hook's factory swapped for the broken one."""

    def command(self) -> list[str]:
        dry = subprocess.run([*super().command(), "--dry-run"], capture_output=True, text=True, check=True,
                             env=server_env(self.stub_log))  # fmt: skip
        argv = shlex.split(dry.stdout.strip().splitlines()[-1])
        at = argv.index("--forward-hooks") + 1
        hooks = json.loads(argv[at])
        for spec in hooks:
            if spec["name"] == "hsextract_dump":
                spec["hook_factory"] = FAULTY_FACTORY
        argv[at] = json.dumps(hooks)
        return argv


@pytest.fixture(scope="module")
def server(live):  # type: ignore[no-untyped-def]
    return live("llama")


@pytest.mark.parametrize("concurrency", ["1", "256"], ids=["alone", "default"])
def test_every_row_checked_gives_no_false_alarm(server, tmp_path: Path, concurrency: str) -> None:  # type: ignore[no-untyped-def]
    dataset = write_dataset(tmp_path / "data.jsonl", LENGTHS, seed=5)
    result = extract(server, dataset, tmp_path / "out", "--spot-check-every", "1", "--spot-check-max-tokens", "256",
                     "--concurrency", concurrency)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    config = data_config(tmp_path / "out")
    assert config["status"] == "complete" and errors(tmp_path / "out") == []
    spot = config["spot_checks"]
    assert spot["checked_rows"] == spot["matched_rows"] == len(LENGTHS) and spot["mismatched_rows"] == 0
    assert spot["checked_tensors"] == ["aux layer 1", "aux layer 3", "aux layer 4"]
    assert spot["worst_matching_error"] < 1e-5  # float32: batched with others or alone, only the summation order differs
    for name, tensor in spot["tensors"].items():  # every aux layer judged on every row, far from its nearest alternative
        assert tensor["rows"] == tensor["matched"] == len(LENGTHS), (name, tensor)
        assert tensor["smallest_separation"] > 0.1 and tensor["nearest_alternative"], (name, tensor)
    # SGLang returns the last extend pass of the (at most 256-token) prompt: at most a chunk of it; where a
    # pass ends depends on what shares the batch's token budget, so only the bound is fixed
    assert len(LENGTHS) <= spot["checked_positions"] <= sum(min(n, 256, CHUNK) for n in LENGTHS)
    assert spot["not_checked"] == [
        "final state (the engine does not return it)",
        "some positions (past spot_check_max_tokens)",
        "some positions (the engine returned only its last extend pass)",
    ]
    assert "spot check (1 row in 1" in result.stdout + result.stderr


def test_a_hook_one_layer_off_is_caught_on_the_first_checked_rows_and_stops(  # type: ignore[no-untyped-def]
    server, tmp_path: Path
) -> None:
    server.stop()  # one server at a time: the fixture restarts the clean one for later tests
    config = {**server.config, "layer_ids": [1, 2, 3]}  # consecutive: one slot late is one layer late
    config_path = tmp_path / "faulty.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=True))
    faulty = FaultyHookServer("llama", server.model, config_path, tmp_path, server.stub_log)
    faulty.start()
    try:
        dataset = write_dataset(tmp_path / "data.jsonl", LENGTHS, seed=5)
        out = tmp_path / "out"
        result = extract(faulty, dataset, out, "--spot-check-every", "4", "--spot-check-max-mismatches", "2",
                         "--concurrency", "1", "--layer-ids", "1,2,3")  # fmt: skip
    finally:
        faulty.stop()
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert "2 spot-checked rows differed from the engine's own hidden states" in text
    recorded = data_config(out)
    assert recorded["status"] == "stopped" and recorded["spot_checks"]["mismatched_rows"] == 2
    bad = errors(out)
    assert [e["reason"] for e in bad] == ["spot_check_mismatch"] * 2
    assert [e["row"] for e in bad] == [0, 4]  # the first two checked rows (sent shortest first: dataset order here)
    message = bad[0]["message"]
    assert "aux layer 1: " in message and "DIFFERS" in message and "from aux layer 2; the nearest" in message, message
    assert recorded["total_samples"] <= 4  # stopped at the second checked row: rows 1..3 at most were written
