"""``data/token_freq.pt`` against speculators 0.9.0's own vocabulary code: the file its data preparation
would write from our rows, and the draft vocabulary its trainer builds from it (no full-vocabulary fallback)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from datasets import load_from_disk
from speculators.train.cli import parse_vocab_mappings
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution, save_token_frequency_distribution

from hsextract.output.formats import format_class, token_freq
from hsextract.output.verify import verify_output

from .helpers import VOCAB


def _ours(out_path: Path) -> dict[int, int]:
    loaded: dict[int, int] = torch.load(out_path / "data" / token_freq.TOKEN_FREQ_FILE, weights_only=True)
    return loaded


def test_token_freq_is_what_speculators_own_counting_writes(output, tmp_path: Path) -> None:
    out = output("llama", "speculators")
    theirs_path = tmp_path / "token_freq.pt"
    save_token_frequency_distribution(load_from_disk(str(out.path / "data")), theirs_path)
    theirs = torch.load(theirs_path, weights_only=True)
    ours = _ours(out.path)
    assert ours == theirs
    assert list(ours) == list(theirs)  # the same key order, so the same bytes of the pickled dict
    supervised = sum(int(m.sum()) for m in load_from_disk(str(out.path / "data"))["loss_mask"])
    assert sum(ours.values()) == supervised > 0
    assert verify_output(out.path).ok


def test_the_trainer_builds_a_draft_vocabulary_of_the_asked_size_from_it(output, tmp_path: Path) -> None:
    out = output("llama", "speculators")
    data = tmp_path / "data"
    shutil.copytree(out.path / "data", data)  # the trainer caches d2t/t2d beside the file
    ours = _ours(out.path)
    draft = 64
    assert len(ours) > draft
    args = argparse.Namespace(
        d2t_path=None,
        t2d_path=None,
        data_path=str(data),
        draft_vocab_size=draft,
        token_freq_path=None,
        verifier_name_or_path=str(out.model),
        trust_remote_code=False,
    )
    d2t, t2d, size = parse_vocab_mappings(args)
    assert size == draft and d2t is not None and t2d is not None  # not the full-vocabulary fallback (None, None, V)
    assert t2d.shape == (VOCAB,) and int(t2d.sum()) == draft
    expected_d2t, expected_t2d = build_vocab_mappings_from_distribution(ours, draft, VOCAB)
    assert torch.equal(d2t, expected_d2t) and torch.equal(t2d, expected_t2d)
    most_frequent = sorted(ours, key=lambda t: (-ours[t], t))[:draft]
    assert set(torch.nonzero(t2d).flatten().tolist()) == set(most_frequent)


def test_the_summary_says_how_to_pick_the_draft_vocab_size(output) -> None:
    out = output("llama", "speculators")
    line = format_class("speculators").trainer_summary(out.config["trainer"], out.path, str(out.model))[-1]
    distinct = len(_ours(out.path))
    assert f"--draft-vocab-size N with N at most {distinct}, the distinct supervised tokens counted in " in line
    assert str(out.path / "data" / "token_freq.pt") in line
