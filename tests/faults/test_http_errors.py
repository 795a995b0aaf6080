"""A proxy or auth layer in front of the server: its answers are not the prompt's fault.

The wall is a real HTTP server that forwards everything to the real embedded server except what
it answers itself: 403 or 404 to /generate, an HTML page with status 200, HTML on /server_info.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..helpers import run_extraction
from .helpers import Answer, assert_same_output, make_rows, run_extract, write_rows

HTML = b"<!DOCTYPE html><html><body><h1>Access denied</h1></body></html>"


def _errors(output: Path) -> list[dict[str, object]]:
    path = output / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        (Answer(403, b'{"detail": "Forbidden"}'), "HTTP 403"),
        (Answer(403, HTML, "text/html"), "HTTP 403"),
        (Answer(404, b'{"detail": "Not Found"}'), "HTTP 404"),
        (Answer(200, HTML, "text/html; charset=utf-8"), "HTTP 200 (text/html"),
    ],
    ids=["403-json", "403-html", "404", "200-html"],
)
def test_wrong_answers_on_generate_stop_the_run_after_one_request(
    answer: Answer, shown: str, models, start_server, proxy, tmp_path: Path
) -> None:
    server = start_server(models["main"])
    wall = proxy(server.url, lambda method, path, body: answer if path == "/generate" else None)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(8, seed=7))
    output = tmp_path / "out"

    stopped = run_extract(wall.url, dataset, output, "--concurrency", "4", "--dump-dir", str(server.dump_dir))
    assert stopped.returncode == 1, stopped.stderr
    assert f"POST {wall.url}/generate answered {shown}" in stopped.stderr
    assert "WrongServerError" in stopped.stderr and "Traceback" not in stopped.stderr
    assert wall.generate_calls == 1, "the run fanned out before its first answer was checked"
    assert _errors(output) == [], "rows were recorded as bad input or failed"
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "stopped" and config["total_samples"] == 0

    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    good = run_extract(server.url, dataset, output)
    assert good.returncode == 0, good.stderr
    assert_same_output(output, reference)


def test_html_on_server_info_is_a_clear_error(models, start_server, proxy, tmp_path: Path) -> None:
    server = start_server(models["main"])
    page = Answer(200, HTML, "text/html")
    wall = proxy(server.url, lambda method, path, body: page if path in ("/server_info", "/get_server_info") else None)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(2, seed=8))

    result = run_extract(wall.url, dataset, tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert f"WrongServerError: GET {wall.url}/server_info answered HTTP 200 (text/html" in result.stderr
    assert not (tmp_path / "out").exists(), "something was written before the server was known"


def test_a_prompt_the_server_rejects_is_still_bad_input(models, start_server, tmp_path: Path) -> None:
    """The server's JSON 400 names the prompt: that row is bad input and the run goes on (a guard
    that the classification above does not swallow real rejections)."""
    server = start_server(models["main"])
    rows = make_rows(4, seed=9)
    rows[1] = {"input_ids": [5, 6, 7, 1500]}  # beyond the model's 1024 ids: the server answers 400
    dataset = write_rows(tmp_path / "data.jsonl", rows)
    output = tmp_path / "out"
    result = run_extract(server.url, dataset, output, "--vocab-size", "2048")  # so our own check lets it through
    assert result.returncode == 0, result.stderr
    assert [(e["row"], e["kind"], e["reason"]) for e in _errors(output)] == [(1, "bad_input", "server_rejected")]
    assert json.loads((output / "data_config.json").read_text())["total_samples"] == 3
