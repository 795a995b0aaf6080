"""The docs read as prose: no paragraph starts in the middle of a sentence (issue 23 item 5: an edit left
"becomes a path. `DumpSink` is the one code path..." as a paragraph of design-notes.md, a fragment of
the sentence before it). Text that goes on after a code block may start lowercase."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _docs() -> list[Path]:
    return [
        ROOT / "README.md",
        ROOT / "monitoring" / "README.md",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "roles").glob("*/README.md")),
    ]


def fragment_paragraphs(text: str) -> list[tuple[int, str]]:
    """(line, text) of every paragraph that starts with a lowercase letter and does not follow a code block."""
    found: list[tuple[int, str]] = []
    in_fence, starts, after_fence = False, True, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_fence, after_fence, starts = not in_fence, True, False
            continue
        if in_fence:
            continue
        if not line.strip():
            starts = True
            continue
        if starts and not after_fence and re.match(r"[a-z]", line):
            found.append((number, line[:80]))
        starts = after_fence = False
    return found


def test_the_check_finds_the_fragment_of_item_5() -> None:
    text = "`rid` never becomes a path. `meta.json` names the model.\n\nbecomes a path. `DumpSink` is the one code path\n"
    assert fragment_paragraphs(text) == [(3, "becomes a path. `DumpSink` is the one code path")]
    assert fragment_paragraphs("```\ncode\n```\nwhich goes on here.\n") == []


def test_no_doc_paragraph_starts_mid_sentence() -> None:
    docs = _docs()
    assert len(docs) > 10
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {text}" for path in docs for line, text in fragment_paragraphs(path.read_text())
    ]
    assert not problems, "paragraphs that start mid-sentence (a leftover of an edit?):\n" + "\n".join(problems)
