"""Throughput of ``hsextract prepare`` against the tokenizer's own batch encode; writes one JSON file.

On N synthetic conversations (``make_sample_conversations``: multi-turn, unicode, some with a system
prompt) and a tokenizer of the tiny models (byte-level BPE, ChatML family, vocabulary 4096):

- baseline: ``tokenizer(texts, add_special_tokens=False)``, one batched call over every conversation's
  chat-template text (rendered beforehand, not timed): tokens/s of that text;
- ``run_prepare`` in-process, ``--like specforge`` and ``--like speculators``, reading the JSONL and
  writing the save_to_disk output (start-up imports not timed): rows/s in and out, tokens/s of the
  same conversation text (the baseline's tokens over prepare's seconds) and tokens/s written
  (speculators writes each turn's history again).

The ratios are prepare's conversation tokens/s over the baseline's: the share of a bare encode's
speed prepare keeps while rendering, finding boundaries and writing resumably.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from hsextract.api import PrepareConfig, run_prepare
from hsextract.dev.sample_data import make_sample_conversations
from hsextract.dev.tokenizer import write_tokenizer

VOCAB = 4096


def _texts(tokenizer: Any, source: Path) -> list[str]:
    texts = []
    for line in source.read_text(encoding="utf-8").splitlines():
        turns = json.loads(line)["messages"]
        texts.append(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=False))
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num", type=int, default=20000, help="conversations (default: 20000)")
    parser.add_argument("--out", type=Path, default=Path("bench/results-prepare.json"), help="result file")
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-", dir=args.work_dir))
    try:
        model = write_tokenizer(work / "model", "chatml", VOCAB)
        source = make_sample_conversations(work / "conversations.jsonl", args.num, seed=11, style="messages")
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        texts = _texts(tokenizer, source)
        started = time.perf_counter()
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        encode_s = time.perf_counter() - started
        text_tokens = sum(len(ids) for ids in encoded)
        results: dict[str, Any] = {
            "conversations": args.num,
            "conversation_tokens": text_tokens,
            "batch_encode": {"seconds": encode_s, "tokens_per_s": text_tokens / encode_s},
        }
        for like in ("specforge", "speculators"):
            config = PrepareConfig(model=model, dataset=source, output=work / f"out-{like}", like=like,
                                   specforge_template="qwen" if like == "specforge" else None, progress=False)
            started = time.perf_counter()
            summary = run_prepare(config)
            seconds = time.perf_counter() - started
            counts = summary.counts
            results[like] = {
                "seconds": seconds,
                "rows_in_per_s": counts["rows_in"] / seconds,
                "rows_out_per_s": counts["rows_out"] / seconds,
                "rows_out": counts["rows_out"],
                "conversation_tokens_per_s": text_tokens / seconds,
                "tokens_written_per_s": counts["tokens"] / seconds,
            }
            results[f"{like}_vs_batch_encode_ratio"] = (text_tokens / seconds) / (text_tokens / encode_s)
        results["meta"] = {
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "note": "ChatML tiny tokenizer; SpecForge template qwen; --max-seq-len 4096; chunk 1000 rows",
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
