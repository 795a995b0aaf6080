"""``hsextract``: the command line. Prints ``ErrorType: message`` and exits non-zero on errors.

Exit codes: 0 success (every row written or recorded as bad input); 1 a fatal stop;
2 a bad configuration or usage; 3 the run finished but some rows failed (rerun to retry them);
130 interrupted (rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from hsextract import __version__
from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.config import add_config_arguments, load_config
from hsextract.contract.layers import capture_indices
from hsextract.errors import ConfigError, HsextractError
from hsextract.exit_codes import EXIT_CONFIG, EXIT_FATAL, EXIT_INTERRUPTED
from hsextract.extract.config import ExtractConfig
from hsextract.paths import check_creatable
from hsextract.ports import check_port_free

log = logging.getLogger("hsextract")



def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from hsextract.dev.tiny_model import make_tiny_model

    path = make_tiny_model(
        args.dir, args.arch, args.layers, args.hidden, args.vocab_size, args.seed, args.dtype, args.chat_family
    )
    print(f"model written to {path}")
    return 0


def _cmd_make_sample_data(args: argparse.Namespace) -> int:
    from hsextract.dev.sample_data import make_sample_conversations, make_sample_data

    if args.conversations:
        path = make_sample_conversations(args.file, args.num, args.seed, args.conversations)
        print(f"{args.num} {args.conversations} conversations written to {path} (tokenize them with hsextract prepare)")
        return 0
    path = make_sample_data(args.file, args.num, args.vocab_size, args.seed)
    print(f"{args.num} rows written to {path}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from hsextract.capture.embedded import Engine
    from hsextract.capture.front import HttpFront

    config: ServeConfig = load_config(ServeConfig, args)
    # before the model loads (minutes for a large one)
    check_port_free(config.host, config.port, "the server", "--port (port in a --config file; HSX_PORT for make extract)")
    engine = Engine(config)
    try:
        server = HttpFront(engine, config.host, config.port)
    except OSError as exc:
        engine.shutdown()
        raise ConfigError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror}; free the port (fuser -k {config.port}/tcp) "
            "or choose --port"
        ) from None
    info = engine.info()
    log.info(
        "serving %s (%s, %d layers, hidden %d, %s) on http://%s:%d, aux layer_ids %s (0-based outputs; capture "
        "indices, the layer entered: %s), dumps to %s",
        config.model,
        engine.architecture,
        info.num_layers,
        info.hidden_size,
        info.dtype,
        config.host,
        server.port,
        info.layer_ids,
        capture_indices(info.layer_ids or []),
        config.dump_dir,
    )
    try:
        server.serve_forever()  # returns on SIGTERM/SIGINT once every open request is answered
    finally:
        log.info("stopping: finishing the dumps in the queue")
        server.shutdown()
    return 0


def _cmd_extract(args: argparse.Namespace) -> int:
    from hsextract.extract.report import print_extract_summary
    from hsextract.extract.run import Extraction

    config: ExtractConfig = load_config(ExtractConfig, args)
    extraction = Extraction(config)

    def stop(signum: int, frame: object) -> None:
        # Requests in flight are cancelled (not failed), the summary and data_config.json are written.
        extraction.request_stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return print_extract_summary(extraction.run(), config)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from hsextract.prepare.config import PrepareConfig
    from hsextract.prepare.run import run_prepare

    config: PrepareConfig = load_config(PrepareConfig, args)
    summary = run_prepare(config)
    counts = summary.counts
    state = "ALREADY COMPLETE" if summary.already_complete else "COMPLETE"
    template = f", SpecForge template {summary.specforge_template}" if summary.specforge_template else ""
    dropped = ", ".join(f"{reason} {n}" for reason, n in counts.get("dropped", {}).items()) or "none"
    print(
        f"\n{state}: {summary.output} (like {summary.like}{template})\n"
        f"  input rows {counts.get('rows_in')}: rows out {counts.get('rows_out')} from {counts.get('conversations_used')} "
        f"conversations; dropped {counts.get('dropped_total')} ({dropped})\n"
        f"  {counts.get('tokens')} tokens, {counts.get('supervised_tokens')} supervised; "
        f"{counts.get('truncated')} rows truncated to max_seq_len {config.max_seq_len}\n"
        f"  took {summary.seconds:.1f} s; details in {summary.output}/prepare.json and errors.jsonl\n"
        f"  next: hsextract extract --dataset {summary.output} --format {summary.like} ..."
    )
    return 0


def _cmd_pipeline(args: argparse.Namespace) -> int:
    from hsextract.pipeline import load_pipeline, run_pipeline

    return run_pipeline(load_pipeline(args.config))


def _cmd_verify(args: argparse.Namespace) -> int:
    from hsextract.output.verify import verify_output

    report = verify_output(args.output)
    print(report.summary())
    return 0 if report.ok else EXIT_FATAL


def _cmd_merge(args: argparse.Namespace) -> int:
    from hsextract.output.merge import merge_outputs
    from hsextract.output.verify import verify_output

    check_creatable(args.into, "merge target", "--into")  # before the shards are read or gathered over SSH
    shards: list[Path] = list(args.shards)
    if args.inventory is not None:
        from hsextract.ops.fleet import shard_dirs_from_inventory
        from hsextract.ops.inventory import load_inventory

        if shards:
            raise ConfigError("give either SHARD_OUT directories or --inventory, not both")
        targets = load_inventory(args.inventory, args.ansible_inventory)
        gather_into = None if args.shared else (args.gather_into or args.into.with_name(args.into.name + ".shards"))
        shards = shard_dirs_from_inventory(targets, gather_into, args.ssh_option, args.gather_with)
        for target, path in zip(sorted(targets, key=lambda t: (t.shard_index or 0, t.name)), shards, strict=True):
            print(f"shard {target.shard_index}/{target.num_shards} of {target.name}: {path}")
    elif not shards:
        raise ConfigError("no shard outputs: give SHARD_OUT directories, or --inventory to take them from the hosts")
    summary = merge_outputs(shards, args.into, copy=args.copy)
    print(
        f"MERGED {summary.shards} shards into {summary.into}: {summary.samples} samples, {summary.tokens} tokens, "
        f"{summary.bad_input} bad-input rows\n"
        f"  sample files: {summary.linked} hard-linked, {summary.copied} copied, {summary.already_present} already in place"
    )
    if args.no_verify:
        return 0
    report = verify_output(summary.into)
    print(report.summary())
    return 0 if report.ok else EXIT_FATAL


def _cmd_draft_config(args: argparse.Namespace) -> int:
    from hsextract.output.drafter import eagle_config_for, read_output_layers, write_eagle_config

    layers = read_output_layers(args.output, args.family)
    if args.write is None:
        print(json.dumps({"eagle_config": eagle_config_for(layers)}, indent=2))
        return 0
    config = write_eagle_config(layers, args.write)
    print(f"{args.write}: eagle_config = {json.dumps(config['eagle_config'])}")
    return 0


def _cmd_check_draft(args: argparse.Namespace) -> int:
    from hsextract.output.drafter import check_draft, read_output_layers

    result = check_draft(read_output_layers(args.output, args.family), args.draft_config)
    if result.ok:
        print(f"OK: {result.message}")
        return 0
    print(f"DraftMismatch: {result.message}", file=sys.stderr)
    return EXIT_FATAL


def _cmd_launch_sglang(args: argparse.Namespace) -> int:
    from hsextract.capture.sglang.launcher import launch

    config: SGLangLaunchConfig = load_config(SGLangLaunchConfig, args)
    return launch(config, dry_run=args.dry_run)


def _cmd_status(args: argparse.Namespace) -> int:
    from hsextract.ops import fleet
    from hsextract.ops import status as ops_status

    targets = sorted(ops_status.targets_from_args(args), key=lambda t: (t.shard_index or 0, t.name))
    statuses = ops_status.gather_all(targets, args.logs)
    total = fleet.fleet_total(statuses, targets)
    if args.json:
        print(fleet.to_json(statuses, targets, total))
    else:
        shard = {t.name: f"shard {t.shard_index}/{t.num_shards}" for t in targets if t.shard_index is not None}
        print("\n".join([*(ops_status.render(s, shard.get(s.name, "")) for s in statuses), fleet.render_total(total)]))
    unreachable = [s.name for s in statuses if not s.reachable]
    if unreachable:
        print(f"StatusError: could not reach {', '.join(unreachable)} (see above)", file=sys.stderr)
        return EXIT_FATAL
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hsextract",
        description="Extract a target model's hidden states for EAGLE-3 drafter training, verified and resumable.",
        epilog="Exit codes: 0 ok, 1 fatal stop, 2 bad configuration, 3 some rows failed (rerun), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"hsextract {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tiny = sub.add_parser("make-tiny-model", help="write a small random-weight model transformers loads")
    tiny.add_argument("dir", type=Path, help="output directory (save_pretrained layout)")
    tiny.add_argument(
        "--arch",
        choices=["deepseek_v3", "llama", "qwen2"],
        default="deepseek_v3",
        help="architecture (default: deepseek_v3, as Kimi-K2.5)",
    )
    tiny.add_argument("--layers", type=int, default=8, help="decoder layers, at least 7 (default: 8)")
    tiny.add_argument("--hidden", type=int, default=128, help="hidden size, a multiple of 32 (default: 128)")
    tiny.add_argument("--vocab-size", type=int, default=4096, help="vocabulary size (default: 4096)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")
    tiny.add_argument(
        "--dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16", help="weight dtype (default: bfloat16)"
    )
    from hsextract.dev.tokenizer import FAMILIES as CHAT_FAMILIES

    tiny.add_argument(
        "--chat-family",
        choices=list(CHAT_FAMILIES),
        help="the tokenizer's special tokens and chat template shape (default: qwen2 chatml, llama llama3, "
        "deepseek_v3 kimi_k2)",
    )
    tiny.set_defaults(func=_cmd_make_tiny_model)

    data = sub.add_parser("make-sample-data", help="write a sample tokenized JSONL dataset (or conversations)")
    data.add_argument("file", type=Path, help="output .jsonl file")
    data.add_argument("--num", type=int, default=64, help="rows (default: 64)")
    data.add_argument("--vocab-size", type=int, default=4096, help="ids are drawn below this (default: 4096)")
    data.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    data.add_argument(
        "--conversations",
        choices=["sharegpt", "messages"],
        help="write conversations instead (ShareGPT from/value or OpenAI role/content; multi-turn, unicode, some with "
        "a system prompt), the input of hsextract prepare",
    )
    data.set_defaults(func=_cmd_make_sample_data)

    serve = sub.add_parser("serve", help="run the embedded transformers server (SGLang's HTTP subset)")
    add_config_arguments(serve, ServeConfig)
    serve.set_defaults(func=_cmd_serve)

    extract = sub.add_parser(
        "extract",
        help="extract hidden states from a running server into an output directory",
        description="Send every row of a tokenized dataset (input_ids, loss_mask: hsextract prepare's output, .jsonl or "
        ".parquet) to a running SGLang or hsextract serve server, check each hidden-state dump it writes (tokens, shapes, "
        "dtype, layers, finite) and pack it into OUTPUT in the trainer's format (specforge or speculators, by default the "
        "dataset's prepare.json --like), with data_config.json, identity.json and errors.jsonl. Resumable: rerun the same "
        "command after any stop. Start the server first. Every option is also a key of --config's YAML file.",
        epilog="Exit codes: 0 ok, 1 fatal stop, 2 bad configuration or another output's identity, 3 some rows failed "
        "(rerun), 130 interrupted (rerun).",
    )
    add_config_arguments(extract, ExtractConfig)
    extract.set_defaults(func=_cmd_extract)

    from hsextract.prepare.config import PrepareConfig

    prepare = sub.add_parser(
        "prepare",
        help="tokenize conversations into a trainer's rows (input_ids, loss_mask) as its own preprocessing does",
        description="Tokenize ShareGPT or messages conversations with the model's own tokenizer and chat template, "
        "as SpecForge 0.2.0 (one row per conversation) or speculators 0.9.0 (one row per assistant turn) does; write "
        "a save_to_disk directory with prepare.json (provenance, counts) and errors.jsonl. Resumable: rerun the same "
        "command after an interruption. See docs/data.md.",
    )
    add_config_arguments(prepare, PrepareConfig)
    prepare.set_defaults(func=_cmd_prepare)

    from hsextract.regen import commands as regen_commands

    regen_commands.add_regenerate(sub)

    pipeline = sub.add_parser(
        "pipeline",
        help="regenerate -> prepare -> extract -> verify from one YAML file (a section per step)",
        description="Run hsextract regenerate (optional), prepare, extract and verify with the options of the "
        "config's regenerate, prepare and extract sections; each step resumes, one already complete is skipped, "
        "and the output's data_config.json records the sources (regenerating model and parameters, prepare "
        "provenance). See docs/regenerate.md.",
    )
    pipeline.add_argument("--config", type=Path, required=True, help="YAML file: sections regenerate, prepare, extract")
    pipeline.set_defaults(func=_cmd_pipeline)

    launcher = sub.add_parser(
        "launch-sglang",
        help="exec SGLang with the flags extraction needs (radix cache off, aux capture, dump hook)",
        description="Build the SGLang command from the config, refuse settings that corrupt or lose data, "
        "validate it with SGLang's own parser when importable, then exec it (or print it with --dry-run).",
    )
    add_config_arguments(launcher, SGLangLaunchConfig)
    launcher.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    launcher.set_defaults(func=_cmd_launch_sglang)

    family_help = "model family, when data_config.json records none (deepseek, llama, qwen2)"
    draft = sub.add_parser(
        "draft-config",
        help="the drafter eagle_config that makes SGLang serve the states an output holds",
        description="Print the eagle_config (eagle_aux_hidden_state_layer_ids) a drafter trained on OUT needs so that "
        "SGLang serves it on exactly the states OUT holds, or write it into the drafter's config.json.",
    )
    draft.add_argument("output", type=Path, help="output directory of hsextract extract")
    draft.add_argument("--write", type=Path, metavar="FILE", help="set eagle_config in this drafter config.json (atomic)")
    draft.add_argument("--family", help=family_help)
    draft.set_defaults(func=_cmd_draft_config)

    check = sub.add_parser(
        "check-draft",
        help="exit 1 when SGLang would serve a drafter on other states than an output holds",
        description="Read the drafter's config.json as SGLang reads it, and compare the states SGLang would capture "
        "for it with the states OUT holds. Exit 0 when they match, 1 (naming both) when not.",
    )
    check.add_argument("output", type=Path, help="output directory of hsextract extract")
    check.add_argument("--draft-config", type=Path, required=True, metavar="FILE", help="the drafter's config.json")
    check.add_argument("--family", help=family_help)
    check.set_defaults(func=_cmd_check_draft)

    verify = sub.add_parser("verify", help="re-read an output directory and check every sample and total")
    verify.add_argument("output", type=Path, help="output directory of hsextract extract")
    verify.set_defaults(func=_cmd_verify)

    merge = sub.add_parser(
        "merge",
        help="merge the shards' outputs of one dataset into one trainer-ready output (hard links where possible)",
        description="Check that the shards agree (model, layers, format, max_seq_len, dataset), do not overlap and "
        "leave no row missing; then hard-link (or copy) every sample into --into, merge the manifests, the "
        "speculators Arrow dataset and data_config.json (totals summed, each shard's provenance), and verify it. "
        "Resumable: rerun the same command after an interruption.",
    )
    merge.add_argument("shards", type=Path, nargs="*", metavar="SHARD_OUT", help="each shard's output directory")
    fleet_group = merge.add_argument_group("shards from an Ansible inventory (make merge)")
    fleet_group.add_argument(
        "--inventory", type=Path, help="take the shards from this inventory's extraction_containers (hsx_output_dir)"
    )
    fleet_group.add_argument(
        "--shared",
        action="store_true",
        help="the outputs sit on a shared filesystem mounted here at the same paths: merge them in place",
    )
    fleet_group.add_argument(
        "--gather-into", type=Path, help="where the outputs are copied over SSH first (default: INTO.shards/<host>)"
    )
    fleet_group.add_argument(
        "--gather-with",
        choices=["auto", "rsync", "tar"],
        default="auto",
        help="how outputs are copied over SSH (auto: rsync when both ends have it, else a tar stream)",
    )
    fleet_group.add_argument("--ansible-inventory", help="the ansible-inventory program (default: found next to python)")
    fleet_group.add_argument(
        "--ssh-option", action="append", default=[], metavar="OPT", help="an ssh -o option for the copies (repeatable)"
    )
    merge.add_argument("--into", type=Path, required=True, help="the merged output directory (new, or an earlier merge)")
    merge.add_argument("--copy", action="store_true", help="copy the sample files instead of hard-linking them")
    merge.add_argument("--no-verify", action="store_true", help="skip the hsextract verify pass over the merged output")
    merge.set_defaults(func=_cmd_merge)

    regen_commands.add_merge_regenerated(sub)

    status = sub.add_parser(
        "status",
        help="server health, units, /dev/shm and disk, progress and ETA of each host (read-only)",
        description="Gather what the runbooks ask to look at from the inventory's extraction_containers over SSH "
        "(one connection per host), or from this machine without --inventory. Exit 1 when a host could not be reached.",
    )
    from hsextract.ops.status import add_arguments as add_status_arguments

    add_status_arguments(status)
    status.set_defaults(func=_cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    func: Any = args.func
    try:
        return int(func(args))
    except ConfigError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except HsextractError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FATAL
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
