"""The docs' pipeline examples (issue 29 items 10 and 14): each loads as a pipeline file, and none of its outputs
is a path `make extract` (scripts/run-default.sh) or `make regenerate` (REGEN_INTO) writes in the same checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hsextract.pipeline import PipelineConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "regenerate.md"]


def pipeline_examples(text: str) -> list[dict[str, object]]:
    """Every ```yaml block with prepare and extract sections."""
    blocks = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    return [b for b in blocks if isinstance(b, dict) and {"prepare", "extract"} <= set(b)]


def make_paths() -> set[str]:
    """The work/ paths `make extract` and `make regenerate` write (the default WORK=work)."""
    script = (ROOT / "scripts" / "run-default.sh").read_text()
    paths = {f"work/{name}" for name in re.findall(r'\$WORK/([\w.-]+)', script)}
    regen_into = re.search(r"^REGEN_INTO \?= \$\(WORK\)/(\S+)", (ROOT / "mk" / "fleet.mk").read_text(), re.M)
    assert regen_into is not None and {"work/prepared", "work/output"} <= paths
    return paths | {f"work/{regen_into.group(1)}"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_pipeline_examples_load_and_keep_clear_of_the_make_targets_paths(doc: Path) -> None:
    examples = pipeline_examples(doc.read_text())
    assert examples, f"{doc.name} has no pipeline YAML example"
    taken = make_paths()
    for example in examples:
        PipelineConfig.model_validate(example)
        outputs = {str(section["output"]) for name, section in example.items() if isinstance(section, dict)}
        assert not outputs & taken, f"{doc.name}: {sorted(outputs & taken)} collide with make extract / make regenerate"


def _prepares_like_specforge(example: dict[str, object]) -> bool:
    prepare, extract = example["prepare"], example["extract"]
    assert isinstance(prepare, dict) and isinstance(extract, dict)
    return (prepare.get("like") or prepare.get("format") or extract.get("format") or "specforge") == "specforge"


def test_the_readmes_specforge_examples_name_the_registry_template() -> None:
    """Issue 39 item 6: the README's `like: specforge` pipeline, and the drafter section's `prepare --like specforge`,
    stopped on a model whose chat template fits several SpecForge registry templates; each names its template."""
    text = (ROOT / "README.md").read_text()
    specforge = [example for example in pipeline_examples(text) if _prepares_like_specforge(example)]
    assert specforge, "the README has no specforge pipeline example"
    for example in specforge:
        assert "specforge_template" in example["prepare"], example  # type: ignore[operator]
    commands = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()
                if "hsextract prepare " in line and "--like specforge" in line]  # fmt: skip
    assert commands, "the README's drafter section has no prepare --like specforge"
    for line in commands:
        assert "--specforge-template" in line, line
