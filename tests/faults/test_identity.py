"""One identity per output: after a SIGKILL (no data_config.json yet) a rerun with another layer set,
another checkpoint or another max_seq_len is refused before anything is sent; a moved copy of the
model is the same model; a server swapped to another checkpoint mid-run stops the run at its first dump."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..helpers import run_extraction
from .helpers import (
    assert_same_output,
    kill_after_samples,
    make_rows,
    run_extract,
    samples_written,
    start_extract,
    wait_for,
    write_rows,
)


def _killed_run(url: str, dataset: Path, output: Path, *extra: str) -> bytes:
    written = kill_after_samples(start_extract(url, dataset, output, *extra), output, 3)
    assert 3 <= written < 12, f"the kill came too late to test anything ({written} samples)"
    assert not (output / "data_config.json").exists()
    return (output / "samples.jsonl").read_bytes()


def test_rerun_with_other_layers_after_sigkill_is_refused(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    other_layers = start_server(models["main"], layer_ids=[2, 4, 5])
    assert server.engine.aux_layer_ids == [1, 3, 4], "the default of an 8-layer model changed: adapt this test"
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(12, seed=1))
    reference = tmp_path / "reference"
    assert run_extraction(server.url, dataset, reference, concurrency=1).status == "complete"

    output = tmp_path / "out"
    before = _killed_run(server.url, dataset, output)
    refused = run_extract(other_layers.url, dataset, output)
    assert refused.returncode == 2, refused.stderr
    assert "aux_layer_ids [1, 3, 4] (this run: [2, 4, 5])" in refused.stderr
    assert "use a new --output" in refused.stderr
    assert (output / "samples.jsonl").read_bytes() == before, "the refused run touched the output"
    assert not any(other_layers.dump_dir.iterdir()), "the refused run sent requests"

    rerun = run_extract(server.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


def test_rerun_with_another_checkpoint_is_refused_and_a_moved_copy_accepted(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    other = start_server(models["other"])  # same architecture, layers, hidden size and dtype: other weights
    moved_model = tmp_path / "moved" / "renamed-model"
    shutil.copytree(models["main"], moved_model)
    moved = start_server(moved_model)
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(12, seed=2))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)

    output = tmp_path / "out"
    _killed_run(server.url, dataset, output)
    refused = run_extract(other.url, dataset, output)
    assert refused.returncode == 2, refused.stderr
    assert f"model {models['main']}" in refused.stderr and str(models["other"]) in refused.stderr
    assert "fingerprint sha256:" in refused.stderr

    rerun = run_extract(moved.url, dataset, output)
    assert rerun.returncode == 0, rerun.stderr
    assert "the model moved" in rerun.stderr
    assert json.loads((output / "data_config.json").read_text())["model"]["path"] == str(moved_model)
    assert_same_output(output, reference, ignore=("model.path",))


def test_rerun_with_other_max_seq_len_after_sigkill_is_refused(models, start_server, tmp_path: Path) -> None:
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(12, seed=3))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1, max_seq_len=100)

    output = tmp_path / "out"
    _killed_run(server.url, dataset, output, "--max-seq-len", "100")
    refused = run_extract(server.url, dataset, output, "--max-seq-len", "120")
    assert refused.returncode == 2, refused.stderr
    assert "max_seq_len 100 (this run: 120); pass --max-seq-len 100" in refused.stderr

    rerun = run_extract(server.url, dataset, output, "--max-seq-len", "100")
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


def test_server_swapped_to_another_checkpoint_mid_run_stops_at_its_first_dump(
    models, start_server, proxy, tmp_path: Path
) -> None:
    dumps = tmp_path / "shared-dumps"
    server = start_server(models["main"], dump_dir=dumps)
    other = start_server(models["other"], dump_dir=dumps)  # restarted on another checkpoint, same dump root
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(12, seed=4))
    reference = tmp_path / "reference"
    run_extraction(server.url, dataset, reference, concurrency=1)

    front = proxy(server.url)
    output = tmp_path / "out"
    process = start_extract(front.url, dataset, output, "--dump-dir", str(dumps))
    wait_for(lambda: samples_written(output) >= 3, what="3 samples", process=process)
    front.upstream = other.url
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr
    assert "ModelMismatchError" in stderr and str(models["other"]) in stderr
    config = json.loads((output / "data_config.json").read_text())
    assert config["status"] == "stopped" and "ModelMismatchError" in config["stop_reason"]
    assert config["total_samples"] < 12

    front.upstream = server.url
    rerun = run_extract(front.url, dataset, output, "--dump-dir", str(dumps))
    assert rerun.returncode == 0, rerun.stderr
    assert_same_output(output, reference)


def test_an_identity_a_power_loss_emptied_is_written_again_by_the_same_command(models, start_server, tmp_path: Path) -> None:
    """An older hsextract wrote identity.json without a sync: a power loss could leave it empty. The same
    command rewrites it: from data_config.json when that survived (nothing redone), else by redoing every
    row (nothing else says which model they came from). Never a refusal only deleting the output clears."""
    server = start_server(models["main"])
    dataset = write_rows(tmp_path / "data.jsonl", make_rows(12, seed=7))
    reference = tmp_path / "reference"
    assert run_extraction(server.url, dataset, reference, concurrency=1).status == "complete"
    output = tmp_path / "out"
    assert run_extract(server.url, dataset, output).returncode == 0

    (output / "identity.json").write_bytes(b"")
    again = run_extract(server.url, dataset, output)
    assert again.returncode == 0, again.stderr
    assert "identity.json is empty or torn" in again.stderr and "written now 0, already done 12" in again.stdout
    assert_same_output(output, reference)

    (output / "identity.json").write_bytes(b"")
    (output / "data_config.json").write_bytes(b'{"status": "comp')
    redone = run_extract(server.url, dataset, output)
    assert redone.returncode == 0, redone.stderr
    assert "every row is redone" in redone.stderr and "written now 12, already done 0" in redone.stdout
    assert_same_output(output, reference)
