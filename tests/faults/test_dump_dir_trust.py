"""The dump directory is untrusted input: symlinks are never followed, on write or read, and a dump
root someone else could write into is refused. Real symlinks, real ownership and modes (root)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hsextract.capture.dump_sink import DumpSink, ExtendBatch, Segment
from hsextract.contract.files.dumps import DumpSource, read_dump, write_dump
from hsextract.contract.rids import make_rid, parse_rid
from hsextract.errors import UnsafeDumpDirError

from ..helpers import run_extraction
from .helpers import Answer, assert_same_output, make_rows, run_extract, write_rows

pytestmark = pytest.mark.root  # tmpfs mounts, chown: root only


SOURCE = DumpSource("test", "0", "/models/test", layer_ids=[2, 4, 5], capture_indices=[3, 5, 6])
NOBODY = 65534


def _batch(rid: str, tokens: int) -> ExtendBatch:
    return ExtendBatch(
        segments=[Segment(rid, 0, 0, tokens)],
        input_ids=torch.arange(tokens),
        aux=torch.randn(tokens, 3, 8),
        final=torch.randn(tokens, 8),
    )


def test_a_symlink_named_like_a_rid_is_never_written_through(tmp_path: Path) -> None:
    root, victim = tmp_path / "dumps", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    sink = DumpSink(root, SOURCE)
    linked, with_linked_file = make_rid(0, 4), make_rid(1, 4)
    (root / linked).symlink_to(victim)  # the whole request directory
    (root / with_linked_file).mkdir(mode=0o700)
    (root / with_linked_file / "meta.json").symlink_to(victim / "keep.txt")  # one file in a real directory
    sink.submit(_batch(linked, 4))
    sink.submit(_batch(with_linked_file, 4))
    sink.flush()
    sink.close()

    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and (victim / "keep.txt").read_text() == "keep"
    for rid in (linked, with_linked_file):
        assert not (root / rid).is_symlink() and not (root / rid / "meta.json").is_symlink()
        assert read_dump(root / rid).input_ids.tolist() == [0, 1, 2, 3]


def test_a_planted_dump_behind_a_symlink_is_never_packed(models, start_server, proxy, tmp_path: Path) -> None:
    """Something that is not the server links a complete dump of its own under the rid the extractor
    waits for, right after the request is sent (the worst case: no check before the request sees it)."""
    server = start_server(models["main"])
    planted_root = tmp_path / "planted"
    planted_root.mkdir()

    def plant(method: str, path: str, body: bytes) -> Answer | None:
        if path != "/generate":
            return None
        request = json.loads(body)
        rid = parse_rid(request["rid"])
        if rid is None or rid.row != 0:
            return None
        tokens = len(request["input_ids"])
        ids = torch.tensor(request["input_ids"])
        source = server.engine._dump_source()  # the real server's own metadata: only the values are fake
        aux, final, prenorm = torch.zeros(tokens, 3, 64), torch.zeros(tokens, 64), torch.zeros(tokens, 64)
        write_dump(planted_root, request["rid"], ids, aux, final, source, prenorm)
        link = server.dump_dir / request["rid"]
        if not os.path.lexists(link):
            link.symlink_to(planted_root / request["rid"])
        return Answer(200, json.dumps({"text": "", "meta_info": {"prompt_tokens": tokens}}).encode())

    front = proxy(server.url, plant)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(4, seed=16))
    output = tmp_path / "out"
    # one row a request: the planting rule reads one rid a body (row 0's retry must be planted too)
    extra = ("--dump-dir", str(server.dump_dir), "--max-attempts", "2", "--rows-per-request", "1")
    result = run_extract(front.url, dataset, output, *extra)
    assert result.returncode == 3, result.stderr
    assert "is a symlink" in result.stderr
    written = [json.loads(line)["row"] for line in (output / "samples.jsonl").read_text().splitlines()]
    assert written == [1, 2, 3], "the planted dump was packed"
    errors = [json.loads(line) for line in (output / "errors.jsonl").read_text().splitlines()]
    assert [(e["row"], e["kind"], e["reason"]) for e in errors] == [(0, "failed", "unsafe_dump")]
    planted = next(planted_root.iterdir())
    assert sorted(p.name for p in planted.iterdir()) == ["done", "hidden.safetensors", "meta.json"], "removed through the link"

    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)
    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


@pytest.mark.parametrize(
    ("owner", "mode", "says"),
    [
        (NOBODY, 0o700, "uid 65534"),
        (0, 0o777, "mode 0777: writable by group or others"),
        (0, 0o1777, "mode 1777: writable by group or others"),
        (0, 0o770, "mode 0770: writable by group or others"),
    ],
    ids=["other-user", "world-writable", "sticky-world-writable", "group-writable"],
)
def test_a_dump_root_someone_else_can_write_is_refused(owner: int, mode: int, says: str, tmp_path: Path) -> None:
    root = tmp_path / "shm" / "hsextract"
    root.mkdir(parents=True)
    os.chown(root, owner, owner)
    os.chmod(root, mode)
    with pytest.raises(UnsafeDumpDirError) as caught:
        DumpSink(root, SOURCE)
    assert str(root) in str(caught.value) and says in str(caught.value)


def test_the_server_creates_its_dump_root_0700_and_refuses_a_link(tmp_path: Path) -> None:
    root = tmp_path / "shm" / "hsextract"
    DumpSink(root, SOURCE).close()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(UnsafeDumpDirError, match="is a symlink"):
        DumpSink(link, SOURCE)


def test_serve_and_extract_refuse_an_unsafe_dump_root(models, start_server, tmp_path: Path) -> None:
    planted = tmp_path / "shm" / "hsextract"
    planted.mkdir(parents=True)
    os.chown(planted, NOBODY, NOBODY)
    serve = subprocess.run(
        [sys.executable, "-m", "hsextract", "serve", "--model", str(models["main"]), "--dump-dir", str(planted), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert serve.returncode == 2, serve.stderr
    assert f"UnsafeDumpDirError: dump dir {planted} belongs to" in serve.stderr and f"rm -rf {planted}" in serve.stderr

    server = start_server(models["main"])
    shared = tmp_path / "world-writable"
    shared.mkdir()
    os.chmod(shared, 0o777)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(2, seed=17))
    result = run_extract(server.url, dataset, tmp_path / "out", "--dump-dir", str(shared))
    assert result.returncode == 2, result.stderr
    assert "writable by group or others" in result.stderr and f"chmod 700 {shared}" in result.stderr
