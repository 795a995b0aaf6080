"""Build, check and exec the SGLang command line that extraction needs.

``hsextract launch-sglang --config FILE`` reads the YAML the Ansible role renders and execs
``<ml-env python> -m sglang.launch_server ...`` with: the radix cache off (a cached prefix is never
recomputed, so its rows would never be dumped), aux hidden-state capture for the configured layers,
the dump hook, prefill CUDA graphs off (hooks do not run on graph replay), the chunked prefill
size, and, when ``disable_custom_all_reduce`` is set (LXC containers), NCCL-only all-reduce.
Settings that would corrupt or lose data are refused before anything starts.

``profile: generate`` builds a plain generation server for ``hsextract regenerate`` instead: the radix
cache kept (regeneration sends each conversation's growing history, whose prefix it computes once), no
hook, no aux capture, prefill CUDA graphs allowed; the extraction-only settings are refused there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shlex
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.capture.sglang.multinode import OWNED_FLAGS as MULTINODE_FLAGS
from hsextract.capture.sglang.multinode import multinode_args
from hsextract.contract.files.dump_dir import prepare_dump_root
from hsextract.contract.hook_config import HOOK_FACTORY, PRENORM_HOOK_FACTORY
from hsextract.contract.layers import resolve_aux_layer_ids
from hsextract.contract.model_config import read_model_config
from hsextract.contract.sglang_capture import (
    SGLANG_MODEL_CLASSES,
    SGLANG_VERSION,
    ModelFamily,
    draft_layer_ids,
    family_of,
    layers_to_capture,
)
from hsextract.errors import ConfigError

log = logging.getLogger(__name__)

#: flags the launcher owns: setting them through extra_args would bypass its checks
_OWNED_FLAGS = {
    "--model-path": "model_path",
    "--model": "model_path",
    "--tp-size": "tp_size",
    "--tensor-parallel-size": "tp_size",
    "--host": "host",
    "--port": "port",
    "--chunked-prefill-size": "chunked_prefill_size",
    "--forward-hooks": "(set by the launcher)",
    "--return-aux-hidden-state-layer-ids": "layer_ids",
    "--enable-return-aux-hidden-states": "(set by the launcher)",
    "--enable-return-hidden-states": "(set by the launcher)",
    "--speculative-algorithm": "(set by the launcher)",
    "--disable-radix-cache": "disable_radix_cache",
    "--mem-fraction-static": "mem_fraction_static",
    "--dp-size": "dp_size",
    "--disable-custom-all-reduce": "disable_custom_all_reduce",
}
#: flags refused outright, with the reason
_REFUSED_FLAGS = {
    "--speculative-draft-model-path": "a draft model changes what the target computes per request; extraction needs none",
    "--pp-size": "aux hidden-state capture works only with pipeline parallel size 1",
    "--pipeline-parallel-size": "aux hidden-state capture works only with pipeline parallel size 1",
    "--cuda-graph-backend-prefill": "prefill CUDA graphs replay without running Python hooks: nothing would be dumped",
    "--enable-hierarchical-cache": "a prefix cache skips recomputing cached tokens, so their rows would never be dumped",
}


def _architecture(config: SGLangLaunchConfig, model_config: dict[str, Any]) -> ModelFamily:
    if config.architecture != "auto":
        return ModelFamily(config.architecture)
    family = family_of(model_config)
    if family is None:
        raise ConfigError(
            f"cannot tell the model family of {config.model_path} (config.json not readable, or its architectures "
            f"{model_config.get('architectures')} / model_type {model_config.get('model_type')!r} are not ones whose "
            "aux-layer numbering is checked); set architecture: deepseek, llama or qwen2"
        )
    return family


def sglang_capture(family: ModelFamily | str, layer_ids: Sequence[int] | None, num_layers: int) -> list[int]:
    """``layers_to_capture`` that the installed SGLang sets for these aux layer ids.

    Runs SGLang's own ``set_eagle3_layers_to_capture`` when sglang imports; otherwise the pinned
    0.5.23 rules of :mod:`hsextract.contract.sglang_capture` (a dry run on a machine without SGLang)."""
    family = ModelFamily(family)
    try:
        method = _sglang_method(family)
    except Exception as exc:  # sglang not installed here (a dry run elsewhere): the pinned rules
        log.debug("sglang not importable (%s); using the %s capture rules", exc, SGLANG_VERSION)
        return layers_to_capture(family, layer_ids, num_layers)
    from types import SimpleNamespace

    stand_in = SimpleNamespace(
        pp_group=SimpleNamespace(is_last_rank=True),
        config=SimpleNamespace(num_hidden_layers=num_layers),
        model=SimpleNamespace(layers_to_capture=[]),
        capture_aux_hidden_states=False,
    )
    method(stand_in, None if layer_ids is None else list(layer_ids))
    return list(stand_in.model.layers_to_capture)


def _sglang_method(family: ModelFamily | str) -> Any:
    module, name = SGLANG_MODEL_CLASSES[ModelFamily(family)]
    return getattr(importlib.import_module(module), name).set_eagle3_layers_to_capture


def layer_id_argument(family: ModelFamily | str, aux_layer_ids: list[int], num_layers: int) -> list[int]:
    """The ``--return-aux-hidden-state-layer-ids`` values that make the installed SGLang capture exactly
    ``aux_layer_ids + 1``: the same value a drafter's ``eagle_aux_hidden_state_layer_ids`` needs.
    Refuses (ConfigError) when no value does."""
    return draft_layer_ids(ModelFamily(family), aux_layer_ids, num_layers, rule=sglang_capture)


def _check_extra_args(extra: list[str]) -> None:
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in _REFUSED_FLAGS:
            raise ConfigError(f"extra_args {arg!r} refused: {_REFUSED_FLAGS[flag]}")
        owned = _OWNED_FLAGS.get(flag) or MULTINODE_FLAGS.get(flag)
        if owned:
            raise ConfigError(f"extra_args {arg!r} refused: the launcher sets {flag}; use the config key {owned}")


def hook_specs(config: SGLangLaunchConfig, aux_layer_ids: list[int]) -> list[dict[str, Any]]:
    hook_config = {
        "dump_dir": config.dump_dir,
        "rid_prefix": config.rid_prefix,
        "layer_ids": aux_layer_ids,
        "model_path": config.model_path,
        "queue_size": config.hook_queue_size,
        "dump_writers": config.hook_dump_writers,
        "final_prenorm": config.final_prenorm,
    }
    if config.storage is not None:  # absent otherwise: the hook config of a model-dtype server is as before
        hook_config["storage"] = config.storage
    specs = [
        {
            "name": "hsextract_dump",
            "target_modules": ["logits_processor"],
            "hook_factory": HOOK_FACTORY,
            "config": hook_config,
        }
    ]
    if config.final_prenorm:
        specs.append(
            {
                "name": "hsextract_prenorm",
                "target_modules": ["model.norm"],
                "hook_factory": PRENORM_HOOK_FACTORY,
                "config": hook_config,
            }
        )
    return specs


#: settings only an extraction server uses: a generation server refuses them rather than ignore them
_EXTRACT_ONLY = {
    "layer_ids": "aux layers are captured only by the extract profile",
    "final_prenorm": "the pre-norm dump is the extract profile's",
    "storage": "dump storage is the extract profile's",
}
#: flags a generation server refuses in extra_args: each would capture or dump what nobody reads
_GENERATE_REFUSED = ("--forward-hooks", "--enable-return-aux-hidden-states", "--return-aux-hidden-state-layer-ids")


def build_command(config: SGLangLaunchConfig) -> list[str]:
    """The full argv; raises ConfigError for any setting that would corrupt or lose data."""
    if config.profile == "generate":
        return _generate_command(config)
    return _extract_command(config)


def _common_args(config: SGLangLaunchConfig) -> list[str]:
    argv = [
        config.python, "-m", "sglang.launch_server",
        "--model-path", config.model_path,
        "--tp-size", str(config.tp_size),
        "--host", config.host,
        "--port", str(config.port),
    ]  # fmt: skip
    return argv


def _tail_args(config: SGLangLaunchConfig) -> list[str]:
    argv: list[str] = []
    if config.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(config.mem_fraction_static)]
    if config.dp_size > 1:
        argv += ["--dp-size", str(config.dp_size)]
    if config.enable_dp_attention:
        argv.append("--enable-dp-attention")
    if config.disable_custom_all_reduce:
        argv.append("--disable-custom-all-reduce")
    if config.enable_metrics:
        argv.append("--enable-metrics")
    if config.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + list(config.extra_args)


def _generate_command(config: SGLangLaunchConfig) -> list[str]:
    """A generation server (``hsextract regenerate``): no hook, no aux capture, the radix cache kept unless asked off."""
    for name, why in _EXTRACT_ONLY.items():
        if getattr(config, name) not in (None, False):
            raise ConfigError(f"{name} is set with profile generate, which dumps nothing: {why}; unset it or use profile extract")
    for arg in config.extra_args:
        if arg.split("=", 1)[0] in _GENERATE_REFUSED:
            raise ConfigError(f"extra_args {arg!r} refused: profile generate dumps nothing; use profile extract for that")
    _check_extra_args(config.extra_args)
    argv = [*_common_args(config), "--chunked-prefill-size", str(config.chunked_prefill_size)]
    if config.disable_radix_cache:
        argv.append("--disable-radix-cache")
    return argv + multinode_args(config) + _tail_args(config)


def _extract_command(config: SGLangLaunchConfig) -> list[str]:
    if config.disable_radix_cache is False:
        raise ConfigError(
            "disable_radix_cache is false: the radix cache skips recomputing cached prefixes, so their rows are "
            "never dumped; set disable_radix_cache: true"
        )
    if config.chunked_prefill_size != -1 and config.chunked_prefill_size < 1:
        raise ConfigError(f"chunked_prefill_size {config.chunked_prefill_size} must be -1 (off) or positive")
    _check_extra_args(config.extra_args)
    nodes = multinode_args(config)
    model_config = read_model_config(config.model_path)
    num_layers = config.num_hidden_layers or model_config.get("num_hidden_layers")
    if not num_layers:
        raise ConfigError(f"the layer count of {config.model_path} is unknown (no readable config.json); set num_hidden_layers")
    aux = resolve_aux_layer_ids(config.layer_ids, int(num_layers))
    family = _architecture(config, model_config)
    ids_arg = layer_id_argument(family, aux, int(num_layers))
    argv = [
        *_common_args(config),
        "--disable-radix-cache",
        "--chunked-prefill-size", str(config.chunked_prefill_size),
        "--disable-prefill-cuda-graph",
        "--enable-return-aux-hidden-states",
        "--enable-return-hidden-states",  # the extractor's spot check (docs/spot-check.md); the line above implies it in 0.5.23
        "--speculative-algorithm", "EAGLE3",
        "--return-aux-hidden-state-layer-ids", *map(str, ids_arg),
        "--forward-hooks", json.dumps(hook_specs(config, aux), separators=(",", ":")),
    ]  # fmt: skip
    return argv + nodes + _tail_args(config)


def validate_with_sglang(argv: list[str]) -> bool:
    """Parse the arguments with SGLang's own parser when it imports; False when it does not."""
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:
        log.warning("sglang is not importable here (%s): the command was not checked by its parser", exc)
        return False
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    try:
        namespace = parser.parse_args(argv[3:])
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ConfigError(f"SGLang's argument parser rejects the command: {exc}") from None
    ServerArgs.from_cli_args(namespace)
    return True


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            raise ConfigError(
                f"port {port} on {host} is in use (a zombie server?); reclaim it with `fuser -k {port}/tcp` "
                "(make restart does) and start again"
            ) from None


def launch(config: SGLangLaunchConfig, dry_run: bool = False) -> int:
    argv = build_command(config)
    validated = validate_with_sglang(argv)
    if dry_run:
        print(shlex.join(argv), flush=True)
        if validated:
            log.info("dry run: SGLang's own argument parser accepts the command")
        return 0
    if not os.access(config.python, os.X_OK):
        raise ConfigError(f"python {config.python} does not exist or is not executable; install the ml-env there or fix python")
    check_port_free(config.host, config.port)
    if config.profile == "extract":
        prepare_dump_root(Path(config.dump_dir))  # 0700 and checked, as the hook's DumpSink does it
    log.info("exec %s", shlex.join(argv))
    os.execv(config.python, argv)
    return 0  # not reached
