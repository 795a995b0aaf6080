"""Read an hsextract output through a trainer's own released loader and print what it yielded, as JSON.

Run in .venv-trainers from the repository root, where another suite cannot import the trainers::

    .venv-trainers/bin/python -m tests.trainers.read_output speculators|specforge OUT

The loaders are the ones tests/trainers checks (helpers.py): speculators' ``ArrowDataset`` from the flags
data_config.json records and its multipack collator over every row; SpecForge's offline reader, normalizer
and collator at the recorded ``data.max_length``. Prints ``{"format", "rows": {row: {"input_ids",
"loss_mask"}}}`` for every row the loader yields; exits non-zero (a traceback) when a loader fails.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from speculators.train.recovery import SampleUnavailable

from .helpers import Output, assert_multipack_collates_every_written_token, dataset_from_flags, load_all


def read_output(fmt: str, path: Path) -> dict[str, Any]:
    config = json.loads((path / "data_config.json").read_text())
    out = Output(str(config["model"].get("family")), fmt, Path(config["model"]["path"]), path)
    rows: dict[int, dict[str, list[int]]] = {}
    if fmt == "speculators":
        dataset = dataset_from_flags(out, config["trainer"]["flags"]["--total-seq-len"])
        for row in range(len(dataset)):
            item = dataset[row]
            if not isinstance(item, SampleUnavailable):
                rows[row] = {"input_ids": item["input_ids"].tolist(), "loss_mask": item["loss_mask"].tolist()}
        assert_multipack_collates_every_written_token(out, dataset, unavailable=len(dataset) - len(rows))
    else:
        for (row,), batch in load_all(out, config["trainer"]["config"]["data"]["max_length"]):
            rows[row] = {"input_ids": batch["input_ids"][0].tolist(), "loss_mask": batch["loss_mask"][0].tolist()}
    return {"format": fmt, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=["speculators", "specforge"])
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    print(json.dumps(read_output(args.format, args.output)))


if __name__ == "__main__":
    main()
