"""``hsextract status`` on a finished output: its final counts come from its data_config.json."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from hsextract.ops import fleet
from hsextract.ops import status as ops_status
from hsextract.ops.inventory import Target


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_finished_output_shows_its_final_counts_and_status(tmp_path: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    recorded = {
        "status": "complete",
        "rows_in_shard": 12,
        "total_samples": 10,
        "bad_input_samples": 2,
        "failed_samples": 0,
        "total_tokens": 4321,
        "error_counts": {"not_json": 2},
    }
    (output / "data_config.json").write_text(json.dumps(recorded))
    port = _free_port()  # nothing runs: no server, no extractor metrics
    target = Target("here", server_port=port, metrics_port=port, output_dir=str(output))
    [status] = ops_status.gather_all([target])
    text = ops_status.render(status)
    assert "12/12 samples settled (100.0%)" in text and "data_config.json says complete" in text
    assert "tokens: 4321/4321" in text and "errors: not_json 2" in text
    total = fleet.render_total(fleet.fleet_total([status], [target]))
    assert "finished" in total and "12/12 samples" in total and "ETA unknown" not in total and "0/0" not in total


def test_an_interrupted_output_says_so_and_keeps_its_eta_unknown(tmp_path: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    recorded = {"status": "interrupted", "rows_in_shard": 12, "total_samples": 5, "bad_input_samples": 0,
                "failed_samples": 0, "total_tokens": 900, "error_counts": {}}  # fmt: skip
    (output / "data_config.json").write_text(json.dumps(recorded))
    port = _free_port()
    target = Target("here", server_port=port, metrics_port=port, output_dir=str(output))
    [status] = ops_status.gather_all([target])
    assert "5/12 samples settled" in ops_status.render(status) and "says interrupted" in ops_status.render(status)
    line = fleet.shard_progress(status, target)
    assert line.state == "stopped" and line.eta_s is None
