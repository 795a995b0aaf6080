"""Server failures: retries with backoff, a clear stop after N in a row, a clear error when unreachable.

The flaky server is a real HTTP server in front of the real embedded server; only the extractor
(the code under test) is unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from hsextract.dev.sample_data import make_sample_data
from hsextract.errors import ConfigError, ServerError

from .helpers import free_port, run_extraction


class FlakyProxy:
    """Forwards to ``upstream``; answers 503 to the first ``fail_first`` /generate calls (or all)."""

    def __init__(self, upstream: str, fail_first: int) -> None:
        self.fail_first = fail_first
        self.generate_calls = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self, response: httpx.Response) -> None:
                self.send_response(response.status_code)
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            def do_GET(self) -> None:
                self._relay(httpx.get(upstream + self.path, timeout=30))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with threading.Lock():
                    proxy.generate_calls += 1
                    failing = proxy.fail_first < 0 or proxy.generate_calls <= proxy.fail_first
                if failing:
                    self._relay(httpx.Response(503, content=b'{"error": {"message": "overloaded"}}'))
                else:
                    self._relay(httpx.post(upstream + self.path, content=body, timeout=60))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_transient_failures_are_retried(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    proxy = FlakyProxy(server.url, fail_first=2)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=3, vocab_size=1024, max_len=50)
    try:
        summary = run_extraction(
            proxy.url, dataset, tmp_path / "out", concurrency=1, dump_dir=server.dump_dir, max_attempts=3, spot_check_every=0
        )  # requests counted one by one: no spot-check request among them
    finally:
        proxy.close()
    assert summary.status == "complete" and summary.total_samples == 3
    assert proxy.generate_calls == 5


def test_stops_after_consecutive_failures_with_a_clear_error(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    proxy = FlakyProxy(server.url, fail_first=-1)
    dataset = make_sample_data(tmp_path / "data.jsonl", num=10, vocab_size=1024, max_len=50)
    try:
        summary = run_extraction(
            proxy.url,
            dataset,
            tmp_path / "out",
            concurrency=1,
            dump_dir=server.dump_dir,
            max_attempts=2,
            max_consecutive_failures=3,
        )
    finally:
        proxy.close()
    assert summary.status == "stopped"
    assert "3 samples in a row failed" in (summary.fatal_error or "") and "health_generate" in (summary.fatal_error or "")
    assert proxy.generate_calls == 6
    failed = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in failed] == ["failed"] * 3
    assert json.loads((tmp_path / "out" / "data_config.json").read_text())["status"] == "stopped"


def test_unreachable_server_fails_fast_with_the_fix(tmp_path: Path) -> None:
    dataset = make_sample_data(tmp_path / "data.jsonl", num=1)
    with pytest.raises(ServerError, match="did not answer HTTP 200 on /health_generate within 1 s"):
        run_extraction(f"http://127.0.0.1:{free_port()}", dataset, tmp_path / "out", health_timeout_s=1)
    assert not (tmp_path / "out").exists()


def test_bad_config_stops_before_any_work(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=1, vocab_size=1024)
    with pytest.raises(ConfigError, match=r"layer_ids \[2, 3, 4\] are configured but the server captures layer_ids \[1, 3, 4\]"):
        run_extraction(server.url, dataset, tmp_path / "out", layer_ids=[2, 3, 4])
    with pytest.raises(ConfigError, match="contain \\[9\\], outside"):
        run_extraction(server.url, dataset, tmp_path / "out", layer_ids=[2, 4, 9])
    with pytest.raises(ConfigError, match="not the expected model"):
        run_extraction(server.url, dataset, tmp_path / "out", expect_model="Kimi-K2.5")
    # another dump dir than the server's: refused at once, not dump_timeout_s per row
    other = tmp_path / "other-dumps"
    other.mkdir(mode=0o700)
    with pytest.raises(ConfigError) as caught:
        run_extraction(server.url, dataset, tmp_path / "out", dump_dir=other, dump_timeout_s=1, max_attempts=1)
    assert f"--dump-dir {other} is not the dump dir the server reports in /server_info ({server.dump_dir})" in str(caught.value)
    assert "Drop --dump-dir" in str(caught.value)
    # the server's own dir given explicitly, through another spelling of the same path, is accepted by the check
    assert run_extraction(server.url, dataset, tmp_path / "out2", dump_dir=server.dump_dir / ".." / server.dump_dir.name)
    assert not (tmp_path / "out").exists()
    assert list(server.dump_dir.iterdir()) == []


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hsextract", *args], capture_output=True, text=True, timeout=120)


def test_cli_config_errors_name_the_input_and_the_fix(tmp_path: Path) -> None:
    config = tmp_path / "extract.yaml"
    config.write_text("dataset: /nope.jsonl\noutput: out\nconcurency: 4\n")
    result = cli("extract", "--config", str(config))
    assert result.returncode == 2 and "ConfigError" in result.stderr and "concurency" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("extract", "--dataset", "d.jsonl", "--output", "o", "--shard-index", "2", "--num-shards", "2")
    assert result.returncode == 2 and "shard_index 2 (--shard-index) must be below num_shards 2 (--num-shards)" in result.stderr
    result = cli("extract", "--output", "o")
    assert result.returncode == 2 and "dataset (--dataset) is required" in result.stderr
    result = cli(
        "extract", "--dataset", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o"), "--health-timeout-s", "0"
    )
    # a dataset path that does not exist is a bad configuration: exit 2, the path named
    assert result.returncode == 2 and "ConfigError" in result.stderr and str(tmp_path / "missing.jsonl") in result.stderr


def test_cli_config_file_and_flags_merge(model_dir, start_server, tmp_path: Path) -> None:
    server = start_server(model_dir("deepseek_v3"))
    dataset = make_sample_data(tmp_path / "data.jsonl", num=3, vocab_size=1024, max_len=60)
    config = tmp_path / "extract.yaml"
    config.write_text(
        f"server: {server.url}\ndataset: {dataset}\noutput: {tmp_path / 'out'}\nformat: speculators\nmax_seq_len: 10\n"
    )
    result = cli("extract", "--config", str(config), "--max-seq-len", "20")
    assert result.returncode == 0, result.stderr
    data_config = json.loads((tmp_path / "out" / "data_config.json").read_text())
    assert data_config["format"] == "speculators" and data_config["max_seq_len"] == 20
    verify = cli("verify", str(tmp_path / "out"))
    assert verify.returncode == 0 and "OK" in verify.stdout


def test_help_tells_every_subcommand_and_option() -> None:
    top = cli("--help")
    for command in ("serve", "extract", "verify", "make-tiny-model", "make-sample-data"):
        assert command in top.stdout
    extract = cli("extract", "--help").stdout
    for flag in (
        "--server",
        "--dataset",
        "--output",
        "--dump-dir",
        "--format",
        "--layer-ids",
        "--max-seq-len",
        "--concurrency",
        "--metrics-port",
        "--shard-index",
        "--num-shards",
        "--config",
    ):
        assert flag in extract
    assert "--chunked-prefill-size" in cli("serve", "--help").stdout
