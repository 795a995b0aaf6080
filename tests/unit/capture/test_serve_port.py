"""``hsextract serve`` checks its port before it loads anything."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hsextract.cli import main


def test_a_busy_port_is_refused_before_the_model_is_looked_at(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the model directory has no config.json: had the model been loaded first, that would be the error
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = main(["serve", "--model", str(tmp_path / "no-model"), "--dump-dir", str(tmp_path / "d"), "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"ConfigError: cannot listen on 127.0.0.1:{port}" in err and f"fuser {port}/tcp" in err
    assert "config.json" not in err
    assert not (tmp_path / "d").exists(), "the dump root was made before the port was checked"
