"""A target that has learned something, from text every machine has: the Python standard library.

For ``bench_gpu_drafter.py``: a drafter's acceptance only means something against a target whose
next-token distribution is peaked (a random-weight target's is nearly flat). So:

* ``stdlib_sources``: the ``.py`` files of the running interpreter's standard library (site- and
  dist-packages left out), split into train and held-out **by file** (a stable hash of the path), so
  no held-out line was ever seen in training.
* ``code_conversations``: one conversation per pair of consecutive chunks of a file: the user turn
  shows a chunk and asks for what follows, the assistant turn is the next chunk.
* ``prose_conversations``: the same over a file's prose alone (its docstrings and comments, in source
  order): text where copying from the context helps far less than in code.
* ``build_target``: a byte-level BPE trained on that text with the llama3 chat template
  (``hsextract.dev.tokenizer.write_tokenizer``, the ``make-tiny-model`` machinery), and a small
  Llama-shaped model trained from scratch on the rendered train conversations (next-token loss on
  every token, packed sequences, AdamW, cosine schedule). Saved as a normal Hugging Face model
  directory; its held-out loss is measured on the held-out files' conversations.
"""

from __future__ import annotations

import ast
import hashlib
import io
import logging
import math
import re
import sysconfig
import time
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hsextract.dev.tokenizer import write_tokenizer

log = logging.getLogger("bench_gpu_drafter.target")
CHAT_FAMILY = "llama3"


@dataclass(frozen=True)
class Source:
    path: str  # relative to the standard library's folder
    text: str


def stdlib_sources(limit_bytes: int | None = None) -> list[Source]:
    """The standard library's own ``.py`` files, in path order (at most ``limit_bytes`` of text)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[Source] = []
    total = 0
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root)
        if {"site-packages", "dist-packages"} & set(rel.parts):
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(Source(str(rel), text))
        total += len(text)
        if limit_bytes is not None and total >= limit_bytes:
            break
    if not out:
        raise RuntimeError(f"no standard library sources under {root}")
    return out


def is_heldout(source: Source, heldout_percent: int) -> bool:
    """A stable split by file: the same files are held out on every machine and run."""
    return int(hashlib.sha256(source.path.encode()).hexdigest()[:8], 16) % 100 < heldout_percent


def _chunks(text: str, lines: int) -> Iterator[str]:
    rows = [row for row in text.splitlines() if row.strip()]
    for start in range(0, len(rows) - lines + 1, lines):
        yield "\n".join(rows[start : start + lines])


def code_conversations(sources: list[Source], user_lines: int, assistant_lines: int) -> list[dict[str, Any]]:
    """ShareGPT rows: a chunk of a file, then what follows it (the assistant's turn)."""
    rows: list[dict[str, Any]] = []
    for source in sources:
        parts = list(_chunks(source.text, user_lines + assistant_lines))
        for part in parts:
            lines = part.split("\n")
            prompt, answer = "\n".join(lines[:user_lines]), "\n".join(lines[user_lines:])
            rows.append(
                {
                    "source": source.path,
                    "kind": "code",
                    "conversations": [
                        {"from": "human", "value": f"Continue {source.path}:\n{prompt}"},
                        {"from": "gpt", "value": answer},
                    ],
                }
            )
    return rows


#: comments that are directives to a tool, not prose
_DIRECTIVE = re.compile(r"^(!|-\*-|noqa|type:|pragma|pylint:|fmt:|mypy:|ruff:|XXX$|TODO$)", re.IGNORECASE)


def prose_lines(text: str) -> list[str]:
    """A file's docstrings and comments, in source order, one stripped non-empty line each
    (tool directives and commented-out separators left out). ``[]`` for a file that does not parse."""
    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, ValueError, tokenize.TokenError):
        return []
    found: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=True)
            if doc and node.body:
                found.append((node.body[0].lineno, doc.splitlines()))
    for token in tokens:
        if token.type == tokenize.COMMENT:
            comment = token.string.lstrip("#").strip()
            if comment and not _DIRECTIVE.match(comment) and any(c.isalpha() for c in comment):
                found.append((token.start[0], [comment]))
    found.sort(key=lambda item: item[0])
    return [line.strip() for _, lines in found for line in lines if line.strip()]


def prose_conversations(sources: list[Source], user_lines: int, assistant_lines: int) -> list[dict[str, Any]]:
    """ShareGPT rows over each file's prose (:func:`prose_lines`): a chunk, then what follows it."""
    rows: list[dict[str, Any]] = []
    for source in sources:
        lines = prose_lines(source.text)
        step = user_lines + assistant_lines
        for start in range(0, len(lines) - step + 1, step):
            prompt, answer = lines[start : start + user_lines], lines[start + user_lines : start + step]
            rows.append(
                {
                    "source": source.path,
                    "kind": "prose",
                    "conversations": [
                        {"from": "human", "value": f"Continue the prose of {source.path}:\n" + "\n".join(prompt)},
                        {"from": "gpt", "value": "\n".join(answer)},
                    ],
                }
            )
    return rows


def _messages(row: dict[str, Any]) -> list[dict[str, str]]:
    roles = {"human": "user", "gpt": "assistant"}
    return [{"role": roles[turn["from"]], "content": turn["value"]} for turn in row["conversations"]]


def _packed(tokenizer: Any, rows: list[dict[str, Any]], seq_len: int) -> torch.Tensor:
    """Rendered conversations, tokenized and concatenated, cut into ``[N, seq_len + 1]`` windows."""
    texts = [tokenizer.apply_chat_template(_messages(row), tokenize=False) for row in rows]
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
    n = len(ids) // (seq_len + 1)
    if n == 0:
        raise RuntimeError(f"{len(ids)} tokens make no window of {seq_len + 1}")
    return torch.tensor(ids[: n * (seq_len + 1)], dtype=torch.long).view(n, seq_len + 1)


@dataclass(frozen=True)
class TargetShape:
    layers: int = 8
    hidden: int = 384
    heads: int = 6
    intermediate: int = 1024
    vocab_size: int = 8192


@dataclass(frozen=True)
class TargetTraining:
    steps: int = 1500
    batch: int = 64
    seq_len: int = 512
    lr: float = 1.5e-3
    warmup: int = 100
    max_seconds: float = 200.0  # stop early (and say so) if the machine is slower than planned


def _heldout_loss(model: Any, windows: torch.Tensor, device: torch.device, batch: int) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for start in range(0, windows.shape[0], batch):
            chunk = windows[start : start + batch].to(device)
            logits = model(input_ids=chunk[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += chunk[:, 1:].numel()
    model.train()
    return total / max(count, 1)


def build_target(
    directory: Path,
    train_rows: list[dict[str, Any]],
    heldout_rows: list[dict[str, Any]],
    corpus: list[Source],
    shape: TargetShape,
    training: TargetTraining,
    device: torch.device,
    seed: int = 0,
) -> dict[str, Any]:
    """Train the tokenizer and the model, save both in ``directory``; return what was measured."""
    import transformers

    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    lines = (line for source in corpus for line in source.text.splitlines() if line.strip())
    write_tokenizer(directory, CHAT_FAMILY, shape.vocab_size, seed=seed, corpus=lines)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    tokenizer_s = time.monotonic() - started

    train = _packed(tokenizer, train_rows, training.seq_len)
    heldout = _packed(tokenizer, heldout_rows, training.seq_len)
    config = transformers.LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=training.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )

    def lr_at(step: int) -> float:
        if step < training.warmup:
            return training.lr * (step + 1) / training.warmup
        progress = (step - training.warmup) / max(1, training.steps - training.warmup)
        return training.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))

    generator = torch.Generator().manual_seed(seed)
    loss_log: list[tuple[int, float]] = []
    train_started = time.monotonic()
    step = 0
    model.train()
    for step in range(training.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        index = torch.randint(0, train.shape[0], (training.batch,), generator=generator)
        batch = train[index].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == training.steps - 1:
            loss_log.append((step, round(float(loss), 4)))
            log.info("target step %d/%d: train loss %.3f", step, training.steps, float(loss))
        if time.monotonic() - train_started > training.max_seconds:
            log.warning("target training stopped at step %d: over its %.0f s budget", step, training.max_seconds)
            break
    train_s = time.monotonic() - train_started
    heldout_loss = _heldout_loss(model, heldout, device, training.batch)
    train_loss = _heldout_loss(model, train[: heldout.shape[0]], device, training.batch)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(str(directory))
    log.info(
        "target: %.1fM parameters, held-out loss %.3f (train %.3f), %d steps in %.0f s",
        params / 1e6,
        heldout_loss,
        train_loss,
        step + 1,
        train_s,
    )
    return {
        "parameters": params,
        "shape": shape.__dict__,
        "training": {**training.__dict__, "steps_done": step + 1},
        "train_tokens": int(train.numel()),
        "tokens_seen": (step + 1) * training.batch * training.seq_len,
        "heldout_tokens": int(heldout.numel()),
        "heldout_loss": round(heldout_loss, 4),
        "heldout_perplexity": round(math.exp(heldout_loss), 3),
        "train_loss": round(train_loss, 4),
        "loss_log": loss_log,
        "tokenizer_seconds": round(tokenizer_s, 1),
        "train_seconds": round(train_s, 1),
    }
