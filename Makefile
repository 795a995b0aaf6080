# hsextract: `make extract` sets everything up and runs the embedded default; `make test` tests it.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; on a GPU host use e.g. TORCH_SPEC=torch==2.14.1
TORCH_SPEC ?= torch==2.13.0
WORK ?= work
# make extract on this machine: DATASET (conversations; default WORK/conversations.jsonl, made when absent),
# PREPARED (prepare's output, default WORK/prepared) and OUTPUT (extract's, default WORK/output)
DATASET ?=
PREPARED ?=
OUTPUT ?=
PYTEST_ARGS ?=

.PHONY: help setup setup-sglang setup-trainers extract pipeline test test-fast test-docker lint bench bench-generate bench-row-cost bench-gpu-generate bench-gpu bench-gpu-e2e bench-gpu-fleet bench-gpu-drafter bench-gpu-spot-check clean clean-venvs

# Deployment (Ansible) and monitoring targets live in their own files.
include $(wildcard mk/*.mk)

# Every target with a `## text` comment, in the Makefile and mk/*.mk, the text aligned past the longest name.
help:  ## list the targets
	@awk -F':.*## ' 'BEGIN { n = w = 0 } \
	  /^[a-z][a-z0-9-]*:.*## / { name[n] = $$1; text[n] = $$2; n++; if (length($$1) > w) w = length($$1) } \
	  END { for (i = 0; i < n; i++) printf("  make %-" w "s  %s\n", name[i], text[i]) }' $(MAKEFILE_LIST)

setup: $(VENV)/.setup-done  ## create .venv with hsextract and its test tools

$(VENV)/.setup-done: extractor/pyproject.toml constraints.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e 'extractor[ops]' -r requirements-dev.txt
	$(BIN)/hsextract --version
	touch $@

setup-sglang: .venv-sglang/.setup-done  ## .venv-sglang: the real sglang 0.5.23 for the contract tests and the live server suite (CPU)

.venv-sglang/.setup-done: scripts/setup-sglang-venv.sh constraints-sglang.txt constraints.txt extractor/pyproject.toml
	PYTHON=$(PYTHON) scripts/setup-sglang-venv.sh .venv-sglang
	touch $@

setup-trainers: .venv-trainers/.setup-done  ## .venv-trainers: the released specforge and speculators, for tests/trainers (CPU)

.venv-trainers/.setup-done: scripts/setup-trainers-venv.sh constraints-trainers.txt constraints.txt extractor/pyproject.toml
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" scripts/setup-trainers-venv.sh .venv-trainers
	touch $@

extract: setup  ## the main job: on the configured inventory's containers, else the embedded default (tiny DeepSeek-V3 model, sample data; DATASET= PREPARED= OUTPUT=)
ifeq ($(HSX_INVENTORY_CONFIGURED),yes)
	$(MAKE) ansible-extract
else
	WORK="$(WORK)" DATASET="$(DATASET)" PREPARED="$(PREPARED)" OUTPUT="$(OUTPUT)" scripts/run-default.sh
endif

pipeline: setup  ## regenerate -> prepare -> extract -> verify from PIPELINE_CONFIG (YAML, a section per step: docs/regenerate.md); each step resumes or is skipped when complete
	@test -n "$(PIPELINE_CONFIG)" || { echo "give PIPELINE_CONFIG=FILE (sections regenerate, prepare, extract: docs/regenerate.md)" >&2; exit 2; }
	$(BIN)/hsextract pipeline --config $(PIPELINE_CONFIG)

test: setup setup-sglang setup-trainers setup-ansible monitoring-deps powerloss-deps  ## everything: package and monitoring tests, SGLang contract, the live SGLang server on the CPU, the trainers' own loaders, LXC deployment, Docker image
	$(BIN)/python -m pytest $(PYTEST_ARGS) --ignore=tests/sglang_contract --ignore=tests/sglang_live --ignore=tests/trainers --ignore=tests/deploy tests
	.venv-sglang/bin/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider tests/sglang_contract
	.venv-sglang/bin/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider tests/sglang_live
	.venv-trainers/bin/python -m pytest $(PYTEST_ARGS) -p no:cacheprovider tests/trainers
	$(MAKE) test-deploy
	$(MAKE) test-docker

test-fast: setup  ## unit tests only (tests/unit): no server, no model, no root; seconds
	$(BIN)/python -m pytest -q $(PYTEST_ARGS) tests/unit

test-docker: setup  ## build docker/ on a locally made SGLang stand-in base and dry-run it (starts its own dockerd; root)
	scripts/ci/docker-test.sh $(VENV)

lint: setup  ## ruff, mypy (strict on the package, bodies of the tests), shellcheck on the shell scripts, ansible-lint on the roles
	$(BIN)/ruff check extractor tests bench
	$(BIN)/mypy --config-file mypy.ini extractor/hsextract tests
	scripts/lint-shell.sh $(BIN)/shellcheck
	$(MAKE) lint-ansible

bench: setup  ## benchmarks; writes bench/results.json, results-durability.json, results-spot-check.json, results-prepare.json, results-generate.json, results-http-client.json, results-dump-pages.json (root: mounts tmpfs), results-output-io.json and results-fresh-memory.json (FRESH_DIR: a tmpfs, default /dev/shm)
	$(BIN)/python bench/bench_core.py --out bench/results.json
	$(BIN)/python bench/bench_durability.py --out bench/results-durability.json
	$(BIN)/python bench/bench_spot_check.py --out bench/results-spot-check.json
	$(BIN)/python bench/bench_prepare.py --out bench/results-prepare.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_generate.py --out bench/results-generate.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_http_client.py --out bench/results-http-client.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_dump_pages.py --out bench/results-dump-pages.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_output_io.py --out bench/results-output-io.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_fresh_memory.py --out bench/results-fresh-memory.json --dir $(or $(FRESH_DIR),/dev/shm)

# Short rows on a tiny model on the CPU (issue 37): what the extraction path costs each side per row when the forward
# is cheap, as CPU milliseconds and context switches (phase c of bench_gpu_e2e.py, --device cpu; about a minute)
ROW_COST_SHAPE = --dtype float32 --layers 4 --layer-ids 0,1,2 --hidden 16 --intermediate 32 --heads 2 --kv-heads 1 --vocab 1024
bench-row-cost: setup  ## on this machine's CPU: serve + extract of 3000 short rows on a tiny model, each side's CPU and context switches per row; writes bench/work/row-cost.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_gpu_e2e.py --device cpu $(ROW_COST_SHAPE) --median 128 --longest 512 --max-seq-len 512 --rows 3000 --skip a,b,d,ref --disk-dir bench/work --out bench/work/row-cost.json $(BENCH_ARGS)

bench-generate:  ## decode tokens/s and peak memory of the embedded server vs transformers generate; writes bench/results-generate.json
	PYTHONPATH=extractor $(BIN)/python bench/bench_generate.py --out bench/results-generate.json

# The server's decode against transformers' generate on an 8B-shaped bf16 model: transformers' growing KV cache, the
# static layout run eagerly and the defaults (static, its step as a CUDA graph; issue 37), each step's launches and syncs
# profiled (tables in bench/work/generate-profile)
bench-gpu-generate:  ## on one GPU: decode tokens/s of the embedded server (each KV layout, graphs) vs transformers generate at 1/16/64 requests; writes bench/results-gpu-generate.json
	PYTHONPATH=extractor $(or $(GPU_PYTHON),python3) bench/bench_generate.py --device cuda --decode dynamic,static,graphs --profile bench/work/generate-profile --out bench/results-gpu-generate.json $(BENCH_ARGS)

bench-gpu:  ## on a GPU host: the SGLang hook's forward-thread hold time and dump rate; writes bench/results-gpu.json
	PYTHONPATH=extractor $(or $(GPU_PYTHON),python3) bench/bench_hook_gpu.py --out bench/results-gpu.json

# BENCH_ARGS e.g. "--disk-dir /data/scratch --tmpfs-dir /dev/shm" (about 60 GB free on each; it checks first)
# SOAK=1: the soak mode instead (issue 16): back-to-back runs per --max-batch-tokens, stalls counted, each server regenerating first; bench/results-gpu-soak.json
# FP8=1: the speculators format stored as bf16 and as FP8 side by side (issue 17); bench/results-gpu-fp8.json
# BENCH_ARGS="--sync-pairs 3": also (s), the power-loss fsyncs' cost (runs of (b) with and without them, issue 36)
# BENCH_ARGS="--pack-pairs 2": also (p), pack processes against the row threads alone (runs of (c) in alternating order, issue 37)
# LAYERS=4 HIDDEN=4096 LAYER_IDS=0,1,2: the model's shape and the server's aux layers (each ceiling one command)
E2E_SHAPE = $(if $(LAYERS),--layers $(LAYERS)) $(if $(HIDDEN),--hidden $(HIDDEN)) $(if $(LAYER_IDS),--layer-ids $(LAYER_IDS))
bench-gpu-e2e:  ## on a GPU host: serve + extract of an 8B-shaped model against its own forward (SOAK=1: back-to-back runs; FP8=1: bf16 vs FP8)
ifneq ($(SOAK),)
	PYTHONPATH=extractor:bench $(or $(GPU_PYTHON),python3) bench/bench_gpu_soak.py --out bench/results-gpu-soak.json $(E2E_SHAPE) $(BENCH_ARGS)
else ifneq ($(FP8),)
	PYTHONPATH=extractor:bench $(or $(GPU_PYTHON),python3) bench/bench_gpu_fp8.py --out bench/results-gpu-fp8.json $(E2E_SHAPE) $(BENCH_ARGS)
else
	PYTHONPATH=extractor $(or $(GPU_PYTHON),python3) bench/bench_gpu_e2e.py --out bench/results-gpu-e2e.json $(E2E_SHAPE) $(BENCH_ARGS)
endif

# N servers, one per GPU (--gpus, default all), one extractor process per shard, merge + verify, bf16 and FP8 (issue 21)
bench-gpu-fleet:  ## on a GPU host: N GPUs' aggregate tokens/s against N x one GPU's and the disk, host CPU, merge + verify; writes bench/results-gpu-fleet.json
	PYTHONPATH=extractor:bench $(or $(GPU_PYTHON),python3) bench/bench_gpu_fleet.py --out bench/results-gpu-fleet.json $(BENCH_ARGS)

# One GPU, about 10 minutes, nothing downloaded (issue 28); BENCH_ARGS="--quick" for a first run on a new machine
bench-gpu-drafter:  ## on one GPU: a stdlib-trained target, our pipeline, speculators' and SpecForge's own trainers at several data sizes and on wrong data, acceptance on held-out code and prose; writes bench/results-gpu-drafter.json
	PYTHONPATH=extractor:bench $(or $(GPU_PYTHON),python3) bench/bench_gpu_drafter.py --out bench/results-gpu-drafter.json $(BENCH_ARGS)

# One GPU, one model per call (about 8 minutes each: BENCH_ARGS="--models kimi --append"), nothing downloaded (issue 34)
bench-gpu-spot-check:  ## on one GPU: the spot check's false alarms (default and every row checked, bf16 and FP8), its cost, and each dump-path fault caught; 8B- and Kimi-shaped models; writes bench/results-gpu-spot-check.json
	PYTHONPATH=extractor:bench $(or $(GPU_PYTHON),python3) bench/bench_gpu_spot_check.py --out bench/results-gpu-spot-check.json $(BENCH_ARGS)

clean:  ## remove the default run's files (WORK: the model, data, outputs, logs); the venvs stay
	rm -rf $(WORK)

clean-venvs:  ## remove the virtualenvs (.venv, .venv-sglang, .venv-trainers, .venv-ansible); the next target rebuilds them
	rm -rf $(VENV) .venv-sglang .venv-trainers .venv-ansible
