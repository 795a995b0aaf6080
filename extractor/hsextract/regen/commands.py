"""The CLI of the regeneration commands: ``hsextract regenerate`` and ``hsextract merge-regenerated``
(their parsers and what they print; the work is in ``run`` and ``merge``)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

from hsextract.config import add_config_arguments, load_config
from hsextract.errors import ConfigError
from hsextract.exit_codes import EXIT_INCOMPLETE, EXIT_INTERRUPTED
from hsextract.regen.config import RegenerateConfig


def _by_reason(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counts.items())


def cmd_regenerate(args: argparse.Namespace) -> int:
    from hsextract.regen.run import ALREADY_COMPLETE, COMPLETE, INTERRUPTED, Regeneration

    config: RegenerateConfig = load_config(RegenerateConfig, args)
    regeneration = Regeneration(config)

    def stop(signum: int, _frame: object) -> None:
        regeneration.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    summary = regeneration.run()
    counts = summary.counts
    failed = _by_reason(counts.get("failed_by_reason", {})) or "none"
    skipped = f" ({reasons})" if (reasons := _by_reason(counts.get("skipped_by_reason", {}))) else ""
    print(
        f"\n{summary.status.upper()}: {summary.output} (model {summary.model})\n"
        f"  input rows {counts.get('rows_in')}: ok {counts.get('ok')}, failed {counts.get('failed')} ({failed}), "
        f"skipped {counts.get('skipped')}{skipped}; {summary.resumed} were done by an earlier run\n"
        f"  {counts.get('turns_regenerated')} turns, {counts.get('generated_tokens')} tokens generated, "
        f"{counts.get('truncated_turns')} turns cut at --max-new-tokens {config.max_new_tokens}\n"
        f"  took {summary.seconds:.1f} s; "
        + (f"errors.jsonl and summary.json in {summary.journal}" if summary.status in (COMPLETE, ALREADY_COMPLETE)
           else f"progress kept in {summary.journal}/rows.jsonl")
    )
    if summary.status in (COMPLETE, ALREADY_COMPLETE):
        if counts.get("ok"):
            print(f"  next: hsextract prepare --dataset {summary.output} --model ... --output ...")
        if counts.get("failed"):  # as extract's exit 3: the run finished, but rows are missing from OUT
            print(f"{counts['failed']} rows failed ({failed}) and are not in {summary.output}: see "
                  f"{summary.journal}/errors.jsonl. Rows failed on server errors are retried by the same command; fix "
                  "the others in the input", file=sys.stderr)
            return EXIT_INCOMPLETE
        return 0
    if summary.status == INTERRUPTED:
        print(summary.stop_reason, file=sys.stderr)
        return EXIT_INTERRUPTED
    print("some rows failed on server errors (retryable); rerun the same command to retry them", file=sys.stderr)
    return EXIT_INCOMPLETE


def cmd_merge_regenerated(args: argparse.Namespace) -> int:
    from hsextract.regen.merge import merge_regenerated

    outputs: list[Path] = list(args.shards)
    if args.inventory is not None:
        from hsextract.ops.fleet import fetch_regenerated
        from hsextract.ops.inventory import load_inventory

        if outputs:
            raise ConfigError("give either SHARD_OUT files or --inventory, not both")
        targets = sorted(load_inventory(args.inventory, args.ansible_inventory), key=lambda t: (t.shard_index or 0, t.name))
        gather_into = args.gather_into or args.into.with_name(args.into.name + ".shards")
        for target in targets:
            if target.shard_index is None:
                continue  # a node 1.. of a multi-node server: no shard
            outputs.append(fetch_regenerated(target, gather_into / target.name, args.ssh_option))
            print(f"shard {target.shard_index}/{target.num_shards} of {target.name}: {outputs[-1]}")
    elif not outputs:
        raise ConfigError("no shard outputs: give SHARD_OUT files, or --inventory to take them from the hosts")
    summary = merge_regenerated(outputs, args.into)
    print(f"MERGED {summary.shards} regeneration shard(s) into {summary.into}: input rows {summary.rows_in}: ok "
          f"{summary.ok}, failed {summary.failed}, skipped {summary.skipped} (errors.jsonl and summary.json in "
          f"{summary.into}.journal)")
    return 0


def add_regenerate(sub: Any) -> None:
    regenerate = sub.add_parser(
        "regenerate",
        help="answer every assistant turn again with the served target model (before prepare)",
        description="Replace each assistant turn (or the last) of ShareGPT or messages conversations by the served "
        "model's answer to the history before it: the prompt rendered with the model's chat template as prepare "
        "renders it, sent as input_ids to /generate (SGLang or hsextract serve), the answer decoded here. Output in "
        "the input's schema with per-row metadata; resumable after a kill (OUTPUT.journal/). --reasoning defaults to "
        "keep: the drafter is trained to predict what the target emits, thinking included. See docs/regenerate.md.",
    )
    add_config_arguments(regenerate, RegenerateConfig)
    regenerate.set_defaults(func=cmd_regenerate)


def add_merge_regenerated(sub: Any) -> None:
    merge_regen = sub.add_parser(
        "merge-regenerated",
        help="join the shards of one regeneration (regenerate --shard-index I --num-shards N) in input order",
        description="Check that the shards are complete, were made with the same model, template, sampling and "
        "input, and cover every input row once; then write their rows in input order into --into (JSONL, or "
        "Parquet by its name) and INTO.journal/ (errors.jsonl, summary.json with the counts summed). See "
        "docs/regenerate.md.",
    )
    merge_regen.add_argument("shards", type=Path, nargs="*", metavar="SHARD_OUT", help="each shard's regenerated file")
    regen_fleet = merge_regen.add_argument_group("shards from an Ansible inventory (make regenerate)")
    regen_fleet.add_argument(
        "--inventory", type=Path, help="take the shards from this inventory's extraction_containers (hsx_regen_output)"
    )
    regen_fleet.add_argument(
        "--gather-into", type=Path, help="where the shards are copied over SSH first (default: INTO.shards/<host>)"
    )
    regen_fleet.add_argument("--ansible-inventory", help="the ansible-inventory program (default: found next to python)")
    regen_fleet.add_argument(
        "--ssh-option", action="append", default=[], metavar="OPT", help="an ssh -o option for the copies (repeatable)"
    )
    merge_regen.add_argument("--into", type=Path, required=True, help="the merged file (.jsonl or .parquet)")
    merge_regen.set_defaults(func=cmd_merge_regenerated)
