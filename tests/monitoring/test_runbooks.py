"""Runbooks: each has its sections, every link resolves, and every command it names exists
(make targets in the Makefile and mk/*.mk, playbooks in the repo, hsextract subcommands)."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache

import pytest

from .helpers import REPO, RUNBOOKS
from .test_rules import rules_of

PAGES = sorted(p for p in RUNBOOKS.glob("*.md") if p.name != "README.md")
SECTIONS = ("## Symptoms", "## Alert", "## Diagnosis", "## Fix", "## Verify")
EXPECTED = {
    "restart-server.md",
    "server-never-healthy.md",
    "shm-full.md",
    "disk-full.md",
    "extraction-stalled.md",
    "resume-after-crash.md",
    "errors-rising.md",
    "change-model-or-layers.md",
    "shard-behind.md",
    "regeneration.md",
}


def code_of(text: str) -> str:
    """Fenced blocks and inline code spans: where a runbook names commands."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    rest = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    return "\n".join(fenced + re.findall(r"`([^`\n]+)`", rest))


def named(pattern: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for page in [*PAGES, RUNBOOKS / "README.md"]:
        for name in re.findall(pattern, code_of(page.read_text()), flags=re.M):
            found.setdefault(name, set()).add(page.name)
    return found


@cache
def make_targets() -> set[str]:
    """Targets of the top Makefile and the mk/*.mk it includes, from make's own database."""
    done = subprocess.run(["make", "-pRrq", "-C", str(REPO), "--no-print-directory"], capture_output=True, text=True, timeout=60)
    targets = set()
    for line in done.stdout.splitlines():
        match = re.match(r"^([a-zA-Z0-9][a-zA-Z0-9_.-]*):(?!=)", line)
        if match:
            targets.add(match.group(1))
    return targets


def test_every_runbook_the_issue_asks_for_exists_with_its_sections() -> None:
    assert {p.name for p in PAGES} >= EXPECTED
    for page in PAGES:
        text = page.read_text()
        assert text.startswith("# "), page.name
        positions = [text.find(section) for section in SECTIONS]
        assert all(p >= 0 for p in positions), f"{page.name} lacks one of {SECTIONS}"
        assert positions == sorted(positions), f"{page.name}: sections out of order"


def test_restart_runbook_covers_the_three_cases() -> None:
    text = (RUNBOOKS / "restart-server.md").read_text()
    assert "### 1. Normal restart" in text and "### 2. A zombie process holds the port" in text
    assert "### 3. The container does not answer" in text
    assert "pct exec <vmid> -- fuser -k <port>/tcp" in text


def test_every_runbook_is_indexed_and_every_link_resolves() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    for page in [*PAGES, RUNBOOKS / "README.md"]:
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"{page.name} is not in docs/runbooks/README.md"
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")):
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_alert_names_its_runbook_and_the_runbook_names_the_alert() -> None:
    for rule in rules_of("alert"):
        page = REPO / rule["annotations"]["runbook_url"]
        assert rule["alert"] in page.read_text(), f"{page.name} does not mention {rule['alert']}"


def test_every_make_target_a_runbook_names_exists() -> None:
    wanted = named(r"\bmake ([a-z][a-z-]*)")
    assert {"status", "logs", "restart", "deploy", "extract"} <= set(wanted)
    missing = {t: sorted(pages) for t, pages in wanted.items() if t not in make_targets()}
    assert missing == {}, f"make targets named by runbooks but not defined (Makefile, mk/*.mk): {missing}"


def test_every_playbook_a_runbook_names_exists() -> None:
    wanted = named(r"ansible-playbook(?: -i \S+)? (\S+\.yml)")
    assert {"deploy.yml", "playbooks/restart.yml", "playbooks/extract.yml", "playbooks/status.yml"} <= set(wanted)
    missing = {p: sorted(pages) for p, pages in wanted.items() if not (REPO / p).is_file()}
    assert missing == {}, f"playbooks named by runbooks but missing: {missing}"


@pytest.mark.parametrize("subcommand", sorted(named(r"(?:^|\s|bin/)hsextract ([a-z][a-z-]+)")))
def test_every_hsextract_subcommand_a_runbook_names_exists(subcommand: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hsextract", subcommand, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"hsextract {subcommand} --help failed: {done.stderr[-500:]}"
    assert f"usage: hsextract {subcommand}" in done.stdout


def test_every_runbook_names_the_make_target_or_playbook_an_operator_runs() -> None:
    """Issue 29 item 13: a runbook's Fix says what to run, not only "rerun the command"."""
    without = []
    for page in PAGES:
        fix = page.read_text().split("## Fix", 1)[1].split("## Verify", 1)[0]
        if not re.search(r"\bmake [a-z][a-z-]*|ansible-playbook (?:-i \S+ )?\S+\.yml", code_of(fix)):
            without.append(page.name)
    assert without == [], f"runbooks whose Fix names no make target or playbook: {without}"


def test_regeneration_runbook_gives_the_fleet_restart() -> None:
    text = (RUNBOOKS / "regeneration.md").read_text()
    fleet = text.split("### On the fleet", 1)[1].split("## Verify", 1)[0]
    for needed in ("make regenerate INVENTORY=", "playbooks/regenerate.yml", "hsextract-regenerate.service",
                   "What survives a restart", "Check each shard", "OUT.journal/rows.jsonl", "summary.json"):
        assert needed in fleet, f"regeneration.md's fleet part does not give {needed!r}"
