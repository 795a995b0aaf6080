"""The dump files: write, read back, states, and damaged dumps as DumpErrors (never tracebacks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hsextract.contract.dumps import (
    DONE_FILE,
    HIDDEN_FILE,
    META_FILE,
    DumpMeta,
    DumpSource,
    dump_path,
    dump_state,
    read_dump,
    write_dump,
    write_error_marker,
)
from hsextract.contract.rids import make_rid
from hsextract.contract.states import DumpState
from hsextract.errors import DumpError

SOURCE = DumpSource("test", "1", "/models/m", layer_ids=[1, 3, 4], capture_indices=[2, 4, 5], final_layer_id=7)


def write(root: Path, tokens: int = 5, prenorm: bool = True) -> Path:
    aux = torch.randn(tokens, 3, 8).to(torch.bfloat16)
    final = torch.randn(tokens, 8).to(torch.bfloat16)
    rid = make_rid(3, tokens)
    return write_dump(root, rid, torch.arange(tokens), aux, final, SOURCE, final.clone() if prenorm else None, extend_passes=2)


def test_round_trip_with_typed_meta(tmp_path: Path) -> None:
    directory = write(tmp_path)
    dump = read_dump(directory)
    assert dump.input_ids.tolist() == [0, 1, 2, 3, 4] and dump.input_ids.dtype == torch.int64
    assert dump.meta.source == SOURCE
    assert (dump.meta.num_tokens, dump.meta.num_aux_layers, dump.meta.hidden_size, dump.meta.dtype) == (5, 3, 8, "bfloat16")
    assert dump.meta.has_final_prenorm and dump.meta.extend_passes == 2
    assert dump.final_prenorm_hidden_state is not None
    on_disk = json.loads((directory / META_FILE).read_text())
    assert on_disk["layer_ids"] == [1, 3, 4] and on_disk["rid"] == directory.name  # one flat object
    assert DumpMeta.from_json(on_disk, directory) == dump.meta


def test_states(tmp_path: Path) -> None:
    rid = make_rid(1, 5)
    assert dump_state(tmp_path / rid) is DumpState.PENDING
    write_error_marker(tmp_path, rid, "disk full")
    assert dump_state(tmp_path / rid) is DumpState.ERROR
    assert dump_state(write(tmp_path)) is DumpState.DONE


def test_write_is_idempotent(tmp_path: Path) -> None:
    first = write(tmp_path)
    before = (first / HIDDEN_FILE).read_bytes()
    second = write(tmp_path)
    assert first == second and (second / HIDDEN_FILE).read_bytes() == before


def test_bad_rid_never_becomes_a_path(tmp_path: Path) -> None:
    with pytest.raises(DumpError) as caught:
        dump_path(tmp_path, "hsx-000000001-n5/../../etc")
    assert caught.value.reason == "bad_rid"


def test_no_done_sentinel_is_incomplete(tmp_path: Path) -> None:
    directory = write(tmp_path)
    (directory / DONE_FILE).unlink()
    with pytest.raises(DumpError) as caught:
        read_dump(directory)
    assert caught.value.reason == "dump_incomplete"


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / HIDDEN_FILE).write_bytes((d / HIDDEN_FILE).read_bytes()[:50]), "dump_unreadable"),
        (lambda d: (d / META_FILE).write_text("{not json"), "dump_unreadable"),
        (lambda d: (d / META_FILE).write_text('{"rid": "x"}'), "dump_malformed"),
        (lambda d: (d / META_FILE).write_text("[1, 2]"), "dump_malformed"),
    ],
)
def test_damaged_dumps_are_dump_errors(tmp_path: Path, damage: object, reason: str) -> None:
    directory = write(tmp_path)
    damage(directory)  # type: ignore[operator]
    with pytest.raises(DumpError) as caught:
        read_dump(directory)
    assert caught.value.reason == reason
