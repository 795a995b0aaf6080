#!/usr/bin/env bash
# .venv-sglang: the real sglang==0.5.23 on a CPU machine, kept out of .venv: for the contract tests
# (tests/sglang_contract) and the live server suite (tests/sglang_live), which starts the real server.
# sglang goes in with --no-deps (its full set is GPU-only) plus the packages its modules import and its
# HTTP server and scheduler need (fastapi, uvicorn, uvloop, python-multipart, setproctitle, jsonschema,
# xgrammar, soundfile: the set a server start on the CPU engine imports), and datasets + pyarrow for
# hsextract's own CLI (the live suite runs `hsextract extract` from here too); torch 2.14.1 and torchvision
# 0.29.1 are what it pins (the CUDA build imports and runs on a CPU). sgl-kernel has no CPU build: the
# live suite brings a stand-in (tests/sglang_live/stub).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-sglang}
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --no-deps sglang==0.5.23
"$PIP" install -q torch==2.14.1 torchvision==0.29.1
# pip lists every sglang requirement left out ("sglang 0.5.23 requires X, which is not installed"):
# expected here, so that output goes to a log, shown only when the install fails.
"$PIP" install -q -c constraints-sglang.txt \
  numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
  ipython aiohttp dill einops gguf partial-json-parser transformers tokenizers apache-tvm-ffi \
  sentencepiece compressed-tensors openai \
  fastapi uvicorn uvloop python-multipart setproctitle jsonschema xgrammar soundfile \
  datasets pyarrow >"$VENV/deps-install.log" 2>&1 \
  || { cat "$VENV/deps-install.log"; exit 1; }
# hsextract itself, without re-resolving torch
"$PIP" install -q --no-deps -e extractor
"$PIP" install -q -c constraints.txt safetensors httpx prometheus-client pyyaml xxhash uvicorn pytest pytest-timeout \
  >>"$VENV/deps-install.log" 2>&1 || { cat "$VENV/deps-install.log"; exit 1; }
PYTHONPATH=tests/sglang_live/stub SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -W ignore -c "
from sglang.srt.model_executor.hook_manager import register_forward_hooks
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.server_args import ServerArgs
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler  # the server (needs sgl_kernel's stand-in)
import sglang, hsextract.capture.sglang.hook
print('sglang', sglang.__version__, 'imports in', '$VENV')
"
