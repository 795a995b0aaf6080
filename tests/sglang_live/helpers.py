"""Shared code of the live SGLang suite: the real sglang==0.5.23 server, started on the CPU through
``hsextract launch-sglang``, and the extractor driven through its CLI (run in .venv-sglang).

The server config carries the keys the Ansible role renders (``roles/hsx_server/vars/main.yml``,
``_hsx_server_config_sglang``) plus ``final_prenorm`` and ``extra_args`` for the CPU engine, which the
role passes through ``hsx_server_config_extra``. Output files are read by the layouts of DESIGN.md
section 6, not through the extractor's own readers, so the checks do not lean on the code they check.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
#: the stand-in sgl_kernel (see its docstring); on the server's PYTHONPATH
STUB_DIR = Path(__file__).parent / "stub"
STUB_LOG_ENV = "HSX_SGL_KERNEL_STUB_LOG"
BIN = Path(sys.executable).parent
HSEXTRACT = str(BIN / "hsextract")
#: how SGLang 0.5.23 runs on these CPUs (docs/sglang.md): the CPU engine, torch attention, float32
CPU_ARGS = [
    "--device", "cpu", "--attention-backend", "torch_native", "--skip-tokenizer-init",
    "--max-total-tokens", "16384", "--dtype", "float32",
]  # fmt: skip
#: tokens per extend pass: smaller than most prompts of the suite, so most rows arrive in several chunks
CHUNK = 64
VOCAB, LAYERS, HIDDEN = 1024, 8, 64
#: the default aux layers of an 8-layer model: outputs [1, N//2-1, N-4] = transformers hidden_states[2, 4, 5]
DEFAULT_AUX = [1, 3, 4]
START_TIMEOUT_S = 420.0
#: the server's port bound by another process: the launcher's check before it starts SGLang, and uvicorn's
#: bind error when the port was taken after that check
PORT_TAKEN = ("is in use (a zombie server?)", "error while attempting to bind on address")


def free_port() -> int:
    """A port free now; a server binds it later, so another process may take it first (LiveServer.start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def role_config_keys() -> set[str]:
    """The keys the role renders into the launcher's YAML for a single-node SGLang server."""
    rendered = yaml.safe_load((REPO / "roles/hsx_server/vars/main.yml").read_text())
    return set(rendered["_hsx_server_config_sglang"])


def server_config(model: Path, port: int, dump_dir: Path, **extra: Any) -> dict[str, Any]:
    """The launcher YAML as the role renders it (its keys checked against the role's template)."""
    config: dict[str, Any] = {
        "python": sys.executable,
        "model_path": str(model),
        "tp_size": 1,
        "host": "127.0.0.1",
        "port": port,
        "dump_dir": str(dump_dir),
        "chunked_prefill_size": CHUNK,
        "disable_custom_all_reduce": False,
    }
    assert set(config) == role_config_keys(), "the role renders other keys than this suite sets: update both"
    return {**config, "final_prenorm": True, "extra_args": list(CPU_ARGS), **extra}


def server_env(stub_log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUB_DIR), env.get("PYTHONPATH", "")) if p)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env[STUB_LOG_ENV] = str(stub_log)
    return env


class LiveServer:
    """One real SGLang server, started with ``hsextract launch-sglang --config`` in its own process group."""

    def __init__(self, family: str, model: Path, config_path: Path, workdir: Path, stub_log: Path) -> None:
        self.family = family
        self.model = model
        self.config_path = config_path
        self.config = yaml.safe_load(config_path.read_text())
        self.dump_dir = Path(self.config["dump_dir"])
        self.workdir = workdir
        self.stub_log = stub_log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_seconds: list[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config['port']}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"server-{self.starts}.log"

    def command(self) -> list[str]:
        """What starts the server: the launcher on its config."""
        return [HSEXTRACT, "launch-sglang", "--config", str(self.config_path)]

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start it and wait for its health check. Its port was free when chosen, but another process (an
        outgoing connection's ephemeral port) may bind it first: the launcher then refuses to start, or, when
        the port was taken after its check, SGLang logs the bind error and hangs in its shutdown. Either is read
        from the log and the server starts again, once, on a port free now."""
        if not self._start_once(timeout):
            self.kill()
            taken = self.config["port"]
            self.config["port"] = free_port()
            self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=True))
            print(f"\n{self.family} server: port {taken} was taken before it bound it; starting on {self.config['port']}")
            if not self._start_once(timeout):
                self.kill()
                raise RuntimeError(f"the {self.family} server found its port taken twice:\n{self.log_tail()}")

    def _start_once(self, timeout: float) -> bool:
        """True once the server answers its health check; False when its port was taken."""
        self.starts += 1
        started = time.monotonic()
        command = self.command()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log, stderr=subprocess.STDOUT, env=server_env(self.stub_log), start_new_session=True,
            )  # fmt: skip
        deadline = started + timeout
        while time.monotonic() < deadline:
            exited = self.process.poll() is not None
            if any(line in self.log_path.read_text(errors="replace") for line in PORT_TAKEN):
                return False
            if exited:
                raise RuntimeError(f"the {self.family} server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health_generate", timeout=30).status_code == 200:
                    self.start_seconds.append(time.monotonic() - started)
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.kill()
        raise RuntimeError(f"the {self.family} server did not answer 200 within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (launcher exec'd into SGLang, its scheduler and detokenizer)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        self.process.wait(timeout=60)
        if sig == signal.SIGKILL:
            _wait_group_gone(self.process.pid)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            _kill_group(self.process)
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        _kill_group(self.process)

    def server_info(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/server_info", timeout=30)
        answer.raise_for_status()
        info: dict[str, Any] = answer.json()
        return info


def _kill_group(process: subprocess.Popen[bytes] | None) -> None:
    if process is None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _wait_group_gone(process.pid)


def _wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    raise RuntimeError(f"process group {pgid} still alive {timeout:.0f} s after SIGKILL")


def write_dataset(path: Path, lengths: Sequence[int], seed: int) -> Path:
    generator = torch.Generator().manual_seed(seed)
    with open(path, "w") as handle:
        for length in lengths:
            ids = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
            handle.write(json.dumps({"input_ids": ids, "loss_mask": [1] * length}) + "\n")
    return path


def extract(
    server: LiveServer, dataset: Path, output: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``hsextract extract`` through its CLI; the caller checks the return code."""
    argv = [
        HSEXTRACT, "extract", "--server", server.url, "--dataset", str(dataset), "--output", str(output),
        "--dump-dir", str(server.dump_dir), "--health-timeout-s", "60", *args,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def data_config(output: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((output / "data_config.json").read_text())
    return loaded


def errors(output: Path) -> list[dict[str, Any]]:
    path = output / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


@dataclass(frozen=True)
class Stored:
    """One sample as a trainer reads it: ids, aux states [T, K, H], final state [T, H]."""

    input_ids: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor


def read_specforge(output: Path, row: int) -> Stored:
    group = row - row % 2000
    sample = torch.load(output / f"rows_{group}-{group + 2000}" / f"data_{row}.ckpt", weights_only=True)
    hidden, aux = sample["hidden_state"][0], sample["aux_hidden_state"][0]
    return Stored(sample["input_ids"], aux.reshape(aux.shape[0], -1, hidden.shape[-1]), hidden)


def read_speculators(output: Path, row: int) -> Stored:
    sample = load_file(str(output / "hidden_states" / f"hs_{row}.safetensors"))
    states = sample["hidden_states"]
    return Stored(sample["token_ids"], states[:, :-1], states[:, -1])


class Reference:
    """The float32 transformers forward of a model: full sequence, batch 1, every hidden state."""

    def __init__(self, model: Path) -> None:
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
        self.norm = self.model.base_model.norm

    def states(self, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(transformers ``hidden_states`` [index][T, H], the final layer's pre-norm output [T, H])."""
        captured: dict[str, torch.Tensor] = {}
        handle = self.norm.register_forward_hook(lambda m, a, o: captured.__setitem__("prenorm", a[0]))
        try:
            with torch.no_grad():
                out = self.model(ids.long().unsqueeze(0), output_hidden_states=True)
        finally:
            handle.remove()
        return [h[0] for h in out.hidden_states], captured["prenorm"][0]


#: how far storing a float32 value in a narrower dtype may move it, relative to the value
UNIT_ROUNDOFF = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest difference beyond the storage dtype's rounding, relative to the reference's largest value."""
    rounding = ref.abs() * UNIT_ROUNDOFF[got.dtype]
    excess = ((got.float() - ref).abs() - rounding).clamp(min=0)
    return float(excess.max() / ref.abs().max())
