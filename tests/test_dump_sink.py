"""The dump contract's writer: assembly across passes, rid filtering, atomicity, idempotence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hsextract.capture.dump_sink import DumpSink, ExtendBatch, Segment
from hsextract.contract.files.dumps import DumpSource, dump_path, dump_state, read_dump, read_error
from hsextract.contract.rids import make_rid, parse_rid
from hsextract.errors import DumpError

K, H = 3, 8


def rows(n: int, offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    base = torch.arange(n, dtype=torch.float32).unsqueeze(-1) + offset
    return torch.arange(n) + int(offset), base.expand(n, H).unsqueeze(1).expand(n, K, H).clone(), base.expand(n, H).clone()


def make_sink(root: Path) -> DumpSink:
    return DumpSink(root, DumpSource("test", "0", "model", layer_ids=[2, 4, 5], capture_indices=[3, 5, 6]))


def test_batch_of_several_requests_with_padding_and_foreign_rids(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    ids, aux, final = rows(12, 0.0)  # rows 10, 11 are padding: no segment covers them
    a, b = make_rid(1, 4), make_rid(2, 3)
    segments = [Segment(a, 0, 0, 4), Segment("HEALTH_CHECK_1", 0, 4, 1), Segment(b, 0, 5, 3), Segment("warmup", 0, 8, 2)]
    sink.submit(ExtendBatch(segments, ids, aux, final))
    sink.flush()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a, b])
    dump = read_dump(tmp_path / b)
    assert dump.input_ids.tolist() == [5, 6, 7]
    got_aux, got_final = dump.plain_states("this test")
    assert torch.equal(got_final, final[5:8]) and torch.equal(got_aux, aux[5:8])
    assert dump.meta.source.layer_ids == [2, 4, 5] and dump.meta.num_tokens == 3
    sink.close()


def test_prompt_split_over_chunks_in_different_batches(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    rid = make_rid(7, 10)
    ids, aux, final = rows(10, 100.0)
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 6)], ids[:6], aux[:6], final[:6]))
    sink.flush()
    assert dump_state(tmp_path / rid) == "pending" and not (tmp_path / rid).exists()
    # the second pass arrives in a batch with another request before it
    other_ids, other_aux, other_final = rows(2, 0.0)
    batch = ExtendBatch(
        [Segment("other", 0, 0, 2), Segment(rid, 6, 2, 4)],
        torch.cat([other_ids, ids[6:]]),
        torch.cat([other_aux, aux[6:]]),
        torch.cat([other_final, final[6:]]),
    )
    sink.submit(batch)
    sink.flush()
    dump = read_dump(tmp_path / rid)
    got_aux, got_final = dump.plain_states("this test")
    assert torch.equal(dump.input_ids, ids) and torch.equal(got_aux, aux) and torch.equal(got_final, final)
    assert dump.meta.extend_passes == 2
    sink.close()


def test_request_prefilled_twice_writes_the_same_dump(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    rid = make_rid(3, 4)
    ids, aux, final = rows(4, 1.0)
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 2)], ids[:2], aux[:2], final[:2]))
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 2)], ids[:2], aux[:2], final[:2]))  # retracted, prefilled again
    sink.submit(ExtendBatch([Segment(rid, 2, 0, 2)], ids[2:], aux[2:], final[2:]))
    sink.flush()
    first = (tmp_path / rid / "hidden.safetensors").read_bytes()
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 4)], ids, aux, final))
    sink.flush()
    assert (tmp_path / rid / "hidden.safetensors").read_bytes() == first
    sink.close()


def test_more_rows_than_the_rid_promises_leaves_an_error_marker(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    rid = make_rid(4, 3)
    ids, aux, final = rows(5, 0.0)
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 5)], ids, aux, final))
    sink.flush()
    assert dump_state(tmp_path / rid) == "error"
    assert "promises 3 tokens" in read_error(tmp_path / rid)
    sink.close()


@pytest.mark.parametrize(
    "rid",
    [
        "hsx-../../x-n3",
        "../hsx-000000001-n3",
        "hsx-000000001-n3/../../x",
        "hsx-00000001-n3",
        "hsx-000000001-n0",
        "hsx-000000001-n3\n",
        "HSX-000000001-n3",
        5,
        None,
    ],
)
def test_hostile_or_malformed_rids_are_never_paths(tmp_path: Path, rid: object) -> None:
    root = tmp_path / "root"
    sink = make_sink(root)
    ids, aux, final = rows(3, 0.0)
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 3)], ids, aux, final))  # type: ignore[arg-type]
    sink.flush()
    sink.close()
    assert list(root.iterdir()) == [] and [p.name for p in tmp_path.iterdir()] == ["root"]
    assert parse_rid(rid) is None
    if isinstance(rid, str) and not rid.startswith("HSX"):  # HSX-... is well formed, just another prefix
        with pytest.raises(DumpError):
            dump_path(root, rid)


def test_meta_and_files_follow_the_contract(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    rid = make_rid(0, 2)
    ids, aux, final = rows(2, 0.0)
    sink.submit(ExtendBatch([Segment(rid, 0, 0, 2)], ids, aux.bfloat16(), final.bfloat16()))
    sink.flush()
    names = sorted(p.name for p in (tmp_path / rid).iterdir())
    assert names == ["done", "hidden.safetensors", "meta.json"]
    meta = json.loads((tmp_path / rid / "meta.json").read_text())
    assert meta["dtype"] == "bfloat16" and meta["hidden_size"] == H and meta["num_aux_layers"] == K
    assert meta["capture_indices"] == [3, 5, 6]
    sink.close()


def test_parallel_writers_complete_each_batch_once_after_its_dumps(tmp_path: Path) -> None:
    sink = DumpSink(tmp_path, DumpSource("test", "0", "model", [2, 4, 5], [3, 5, 6]), writers=3, queue_size=2)
    completed: list[int] = []
    released: list[int] = []
    missing: list[str] = []

    def on_complete(index: int, rids: list[str]) -> None:
        missing.extend(r for r in rids if not (tmp_path / r / "done").exists())
        completed.append(index)

    for index in range(12):
        rids = [make_rid(index * 3 + k, 4) for k in range(3)]
        ids, aux, final = rows(12, float(index * 100))
        batch = ExtendBatch([Segment(rid, 0, 4 * k, 4) for k, rid in enumerate(rids)], ids, aux, final)
        batch.release = lambda index=index: released.append(index)
        batch.on_complete = lambda index=index, rids=rids: on_complete(index, rids)
        sink.submit(batch)
    sink.flush()
    assert sorted(completed) == sorted(released) == list(range(12)) and not missing
    dump = read_dump(tmp_path / make_rid(7 * 3 + 2, 4))
    assert torch.equal(dump.plain_states("this test")[1], rows(12, 700.0)[2][8:12])
    assert sink.clock.counts()["dump_write"] == 36 and sink.dumps_failed == 0
    sink.close()


def test_only_segments_that_ask_get_the_pre_norm_state(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    ids, aux, final = rows(6, 0.0)
    prenorm = final + 0.5
    plain, asked = make_rid(1, 3), make_rid(2, 3)
    segments = [Segment(plain, 0, 0, 3, final_prenorm=False), Segment(asked, 0, 3, 3, final_prenorm=True)]
    sink.submit(ExtendBatch(segments, ids, aux, final, final_prenorm=prenorm))
    sink.flush()
    assert read_dump(tmp_path / plain).final_prenorm_hidden_state is None
    got = read_dump(tmp_path / asked).final_prenorm_hidden_state
    assert got is not None and torch.equal(got, prenorm[3:6])
    sink.close()
