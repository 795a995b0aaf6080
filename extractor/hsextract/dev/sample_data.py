"""Generate a sample tokenized dataset: JSONL rows with ``input_ids`` and ``loss_mask``."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from hsextract.contract.atomic import temp_path


def make_sample_data(path: Path, num: int = 64, vocab_size: int = 4096, seed: int = 0, max_len: int = 6000) -> Path:
    """Conversations with a realistic long-tailed length spread (log-normal, median ~600 tokens),
    a few longer than the default ``--max-seq-len`` 4096. The loss mask is 0 on the "user" turns
    and 1 on the "assistant" turns, as a chat template's mask would be."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    with open(tmp, "w") as handle:
        for index in range(num):
            if index % 16 == 5:
                length = rng.randint(min(4200, max_len), max_len)  # some rows exceed the default max_seq_len
            else:
                length = min(max_len, max(8, int(rng.lognormvariate(6.2, 0.9))))
            ids = [rng.randrange(vocab_size) for _ in range(length)]
            mask: list[int] = []
            turn_user = True
            while len(mask) < length:
                turn = min(length - len(mask), rng.randint(16, 400))
                mask.extend([0 if turn_user else 1] * turn)
                turn_user = not turn_user
            handle.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    os.replace(tmp, path)
    return path
