#!/usr/bin/env bash
# .venv-trainers: the released SpecForge and speculators packages, so tests/trainers can load our
# outputs with the trainers' own readers, collators and dataset classes (their code is never copied
# into this repository). Both go in with --no-deps: their full requirement sets pin GPU stacks
# (sglang, a CUDA torch, flash-attn, mooncake). What their data modules import beyond hsextract's own
# dependencies is small: hs-connectors (speculators' FileTransfer), openai (imported by
# speculators.train.data), pydantic-settings (speculators' training config schema) and loguru (speculators.train.cli,
# whose parse_vocab_mappings builds the draft vocabulary from token_freq.pt).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-trainers}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q "$TORCH_SPEC"
# hsextract makes the outputs the tests load; then the trainers, then their light imports.
"$PIP" install -q -c constraints.txt -e extractor -r requirements-dev.txt
"$PIP" install -q --no-deps -c constraints-trainers.txt specforge speculators hs-connectors
# pip lists every trainer requirement left out ("specforge 0.2.0 requires sglang==0.5.14, which is not
# installed"): expected here, so that output goes to a log, shown only when the install fails.
"$PIP" install -q -c constraints-trainers.txt -c constraints.txt openai pydantic-settings loguru \
  >"$VENV/deps-install.log" 2>&1 || { cat "$VENV/deps-install.log"; exit 1; }
"$VENV/bin/python" -W ignore -c "
from specforge.algorithms.eagle3.data import build_offline_collator, build_offline_normalizer, build_offline_reader
from specforge.runtime.data_plane.feature_dataloader import FeatureDataLoader
from specforge.modeling.target.target_head import TargetHead
from speculators.train.data import ArrowDataset
from speculators.train.dataloader import _setup_dataloader
from speculators.train.config.schema import DataArgs
from hs_connectors import FileTransfer
from importlib.metadata import version
print('specforge', version('specforge'), 'and speculators', version('speculators'), 'import in', '$VENV')
"
