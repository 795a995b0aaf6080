"""A busy metrics port (issue 29, item 2): extract and regenerate refuse it before any work, exit 2, naming
the port and the settings that choose another; never an OSError traceback after the resume check."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hsextract.cli import main
from hsextract.dev.sample_data import make_sample_conversations, make_sample_data
from hsextract.errors import ConfigError
from hsextract.extract.metrics import ExtractMetrics
from hsextract.regen.metrics import RegenMetrics


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another socket listens on, as when something else holds 9400."""
    with socket.create_server(("127.0.0.1", 0)) as holder:
        yield int(holder.getsockname()[1])


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _assert_names_the_port(err: str, port: int) -> None:
    assert f"cannot listen on 127.0.0.1:{port} for the metrics endpoint" in err, err
    assert f"fuser {port}/tcp" in err and "--metrics-port" in err and "HSX_METRICS_PORT" in err
    assert "Traceback" not in err and "OSError" not in err


def test_extract_refuses_a_busy_metrics_port_before_any_work(busy_port: int, tmp_path: Path, capsys) -> None:
    dataset = make_sample_data(tmp_path / "rows.jsonl", 4, vocab_size=256, seed=0)
    out = tmp_path / "out"
    # the server URL is a closed port: a check after the health wait would end with another error
    args = ["extract", "--server", _closed_port_url(), "--dataset", str(dataset), "--output", str(out)]
    code = main([*args, "--metrics-port", str(busy_port), "--health-timeout-s", "0"])
    err = capsys.readouterr().err
    assert code == 2, err
    _assert_names_the_port(err, busy_port)
    assert not out.exists()


def test_regenerate_refuses_a_busy_metrics_port_before_any_work(busy_port: int, tmp_path: Path, capsys) -> None:
    dataset = make_sample_conversations(tmp_path / "c.jsonl", 2, 0)
    out = tmp_path / "out.jsonl"
    args = ["regenerate", "--server", _closed_port_url(), "--dataset", str(dataset), "--output", str(out)]
    code = main([*args, "--metrics-port", str(busy_port), "--health-timeout-s", "0", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    _assert_names_the_port(err, busy_port)
    assert not out.exists() and not (tmp_path / "out.jsonl.journal").exists()


@pytest.mark.parametrize("metrics", [ExtractMetrics, RegenMetrics])
def test_a_port_taken_after_the_check_is_the_same_clear_error(metrics: type, busy_port: int) -> None:
    with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{busy_port} for the metrics endpoint"):
        metrics().serve(busy_port, "127.0.0.1")


def test_make_extract_refuses_a_busy_metrics_port_before_any_work(busy_port: int, tmp_path: Path) -> None:
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    work = tmp_path / "work"
    with socket.socket() as probe:  # the server's port free: this machine may run a make extract of its own
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    env = {**os.environ, "WORK": str(work), "HSX_PORT": str(free), "HSX_METRICS_PORT": str(busy_port)}
    done = subprocess.run([str(repo / "scripts" / "run-default.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"port {busy_port} is already in use" in done.stderr and "HSX_METRICS_PORT" in done.stderr
    assert list(work.iterdir()) == []  # no model, no conversations, no prepare: nothing was done
