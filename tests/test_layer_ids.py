"""Layer lists as users copy them (issue 29, item 7): ``extract --layer-ids 1 3 4`` against a real embedded
server, the summary naming both numberings, and speculators' ``--target-layer-ids 2 4 5`` given as layer_ids
explained (the server captures layer_ids [1, 3, 4]: the same states in the other numbering)."""

from __future__ import annotations

from pathlib import Path

from hsextract.cli import main
from hsextract.dev.sample_data import make_sample_data


def _extract(server_url: str, tmp_path: Path, *layer_ids: str) -> list[str]:
    dataset = make_sample_data(tmp_path / "rows.jsonl", 2, vocab_size=1024, seed=0)
    args = ["extract", "--server", server_url, "--dataset", str(dataset), "--output", str(tmp_path / "out")]
    return [*args, "--health-timeout-s", "30", "--layer-ids", *layer_ids]


def test_space_separated_layer_ids_run_and_the_summary_names_both_numberings(
    model_dir, start_server, tmp_path: Path, capsys
) -> None:
    server = start_server(model_dir("deepseek_v3"))  # 8 layers: the server captures layer_ids [1, 3, 4]
    assert main(_extract(server.url, tmp_path, "1", "3", "4")) == 0
    out = capsys.readouterr().out
    assert "layers: aux layer_ids [1, 3, 4] and the final layer 7 (0-based layer_ids: the output of decoder layer i" in out
    assert "= capture indices [2, 4, 5] (capture indices: the layer entered, layer_id + 1" in out


def test_speculators_numbering_given_as_layer_ids_is_explained(model_dir, start_server, tmp_path: Path, capsys) -> None:
    server = start_server(model_dir("deepseek_v3"))
    assert main(_extract(server.url, tmp_path, "2", "4", "5")) == 2
    err = capsys.readouterr().err
    assert "layer_ids [2, 4, 5] are configured but the server captures layer_ids [1, 3, 4]" in err
    assert "capture indices [2, 4, 5]" in err and "speculators --target-layer-ids" in err
    assert "pass --layer-ids 1,3,4, or drop layer_ids" in err
    assert not (tmp_path / "out" / "identity.json").exists()
