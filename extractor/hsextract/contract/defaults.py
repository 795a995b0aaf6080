"""Defaults both sides and the deployment share. The Ansible role defaults repeat them
(YAML cannot import Python); tests/unit/contract/test_defaults.py checks that they agree."""

from __future__ import annotations

#: request-id prefix the extractor sends and the server dumps
RID_PREFIX = "hsx"
#: the inference server's HTTP port (SGLang's default)
SERVER_PORT = 30000
#: the extractor's Prometheus metrics port
METRICS_PORT = 9400
#: dump root on tmpfs
DUMP_DIR = "/dev/shm/hsextract"
#: the ml-env interpreter that has sglang (every command uses it by absolute path)
ML_ENV_PYTHON = "/opt/ml-env/bin/python"
#: the extractor checks every Nth row against the engine's own hidden states; 0 turns it off. Its measured cost
#: (docs/spot-check.md, `make bench-gpu-spot-check`, `make bench`): one unbatched forward per check, about 2-3 %
#: of an H200 run at 1 in 200 (rate ratios 0.94 and 0.97 measured, noisy), 0.975 on the CPU; the target is 0.98
SPOT_CHECK_EVERY = 200
#: and sent with at most this many of the row's first tokens: the answer is JSON (for an 8B-shaped model 64 tokens
#: are 14 MB of it; 256 made the default check cost about half an H200 run's rate before the answer moved to orjson)
SPOT_CHECK_MAX_TOKENS = 64
#: a spot-checked tensor matches when the dump is this many times closer to the engine's state than that state is to
#: its nearest alternative (docs/spot-check.md)
SPOT_CHECK_MARGIN = 2.0
