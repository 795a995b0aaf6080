"""Typed configuration: the pydantic -> argparse bridge and the YAML loading every command shares.

Each side owns its options beside its code: :class:`~hsextract.extract.config.ExtractConfig`
(``extract``), :class:`~hsextract.capture.embedded.config.ServeConfig` (``serve``),
:class:`~hsextract.capture.sglang.config.SGLangLaunchConfig` (``launch-sglang``), all
:class:`StrictConfig`. Each field is a CLI flag (``--max-seq-len``) and a key of the YAML file given
with ``--config`` (``max_seq_len``); the flag wins over the file. Unknown keys are refused, so a typo
in the file rendered by Ansible stops the run before any work starts.

This module imports neither side (``capture/`` must not reach ``extract/`` through it): import each
class from its side's module.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import types
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError

from hsextract.contract.rids import check_prefix
from hsextract.errors import ConfigError
from hsextract.paths import check_creatable

#: keys a release removed, and what replaced them: said instead of "unknown key"
RETIRED_KEYS = {
    "spot_check_tolerance": "the spot check no longer compares elements against a fixed tolerance; it judges each "
    "tensor against the engine's distance to its nearest alternative (spot_check_margin, --spot-check-margin; "
    "docs/spot-check.md): remove the key",
}


class StrictConfig(BaseModel):
    """A command's options: unknown keys refused, frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the path options the command creates (an output): :func:`load_config` refuses one that cannot be created
    #: (a file where a directory should be, a directory this user cannot write) before any work starts
    created_paths: ClassVar[tuple[str, ...]] = ("output",)


def _valid_prefix(value: str) -> str:
    try:
        return check_prefix(value)
    except ConfigError as exc:  # pydantic reports ValueErrors as validation errors
        raise ValueError(str(exc)) from None


#: a rid prefix: 1-32 letters or digits (it becomes part of a path)
RidPrefix = Annotated[str, AfterValidator(_valid_prefix)]


def int_list(value: Any) -> Any:
    """A list of integers written as a user writes one: ``[1, 3, 4]`` (YAML), ``"1,3,4"``, ``"1 3 4"``,
    ``"[1, 3, 4]"``, or one integer; anything else goes on as given, for pydantic to say what is wrong."""
    if isinstance(value, str):
        parts = value.strip().removeprefix("[").removesuffix("]").replace(",", " ").split()
        try:
            return [int(part) for part in parts]
        except ValueError:
            raise ValueError(
                f"{value!r} is not a list of integers; give them space- or comma-separated: '1 3 4' or 1,3,4"
            ) from None
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    return value


#: a list of integers; a flag and a YAML value take it space- or comma-separated too (``layer_ids: "1,3,4"``)
IntList = Annotated[list[int], BeforeValidator(int_list)]


class _IntListAction(argparse.Action):
    """``--layer-ids 1 3 4``, ``--layer-ids 1,3,4`` and ``--layer-ids '1, 3, 4'``: one flat list."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, [i for part in values for i in part])


def _flag_type(annotation: Any) -> tuple[dict[str, Any], str]:
    """argparse keyword arguments for a field's annotation."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is Annotated:
        return _flag_type(args[0])
    if origin in (typing.Union, types.UnionType) and len(args) == 1:
        return _flag_type(args[0])
    if origin is Literal:
        return {"choices": list(args)}, ""
    if origin is list:
        (item,) = typing.get_args(annotation)
        if item is int:
            return {"type": _int_list, "nargs": "+", "action": _IntListAction}, "N"
        return {"type": _word_list}, "'ARG ...'"
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}, ""
    if annotation in (int, float):
        return {"type": annotation}, ""
    return {"type": str}, ""


def _int_list(text: str) -> list[int]:
    """One word of an integer-list flag: ``3``, ``1,3,4`` or ``[1,3,4]``."""
    try:
        parsed: list[int] = int_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return parsed


def _word_list(text: str) -> list[str]:
    """A list of strings from one shell-quoted flag value: ``--extra-args='--foo 1 --bar'``."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shell-quoted list of words: {exc}") from None


def _default_text(field: Any) -> str:
    """`` (default: ...)`` for the help, unless the field is required or its description already says it."""
    if field.is_required() or "(default:" in (field.description or ""):
        return ""
    default = field.get_default(call_default_factory=True)
    if isinstance(default, list):
        default = " ".join(str(item) for item in default) or "none"
    return f" (default: {default})"


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], positional: tuple[str, ...] = ()) -> None:
    """One flag per field (positional for ``positional``), defaults left to the model."""
    parser.add_argument("--config", type=Path, help="YAML file with any of these options (flags override it)")
    for name, field in model.model_fields.items():
        kwargs, metavar = _flag_type(field.annotation)
        help_text = (field.description or "") + _default_text(field)
        if name in positional:
            parser.add_argument(name, nargs="?", default=argparse.SUPPRESS, help=help_text, **kwargs)
            continue
        if metavar:
            kwargs["metavar"] = metavar
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS, help=help_text, **kwargs)


def load_config(model: type[StrictConfig], args: argparse.Namespace) -> Any:
    """Merge the YAML file (if any) with the flags given, and validate."""
    data: dict[str, Any] = {}
    config_path: Path | None = getattr(args, "config", None)
    if config_path is not None:
        loaded = read_yaml_file(config_path, "config file")
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_path} must hold a mapping of option: value")
        data.update(loaded or {})
    for name in model.model_fields:
        if name in vars(args):
            data[name] = vars(args)[name]
    config = _validate(model, data, config_path)
    for name in model.created_paths:
        value = getattr(config, name, None)
        if isinstance(value, Path):
            flag = "--" + name.replace("_", "-")
            check_creatable(value, name, f"{flag} ({name} in a --config file)")
    return config


def read_yaml_file(path: Path, what: str) -> Any:
    """What the YAML file ``path`` given with ``--config`` holds; ConfigError naming it (``what``: "config file")
    and the flag when it is missing, a directory, unreadable or not YAML."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; fix --config") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory, not a YAML file; give --config the file itself") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); fix --config") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror or exc}; fix --config") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path} is not valid YAML: {exc}") from None


def _validate(model: type[StrictConfig], data: dict[str, Any], config_path: Path | None) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"])
            flag = "--" + where.replace("_", "-")
            if not where:  # a check across options (a model validator): its message names them, the input is the config
                problems.append(str(error["msg"]).removeprefix("Value error, "))
            elif error["type"] == "missing":
                problems.append(f"{where} ({flag}) is required; set it")
            elif error["type"] == "extra_forbidden":
                # a key no flag has: name the key and where it came from, and the nearest real key
                origin = config_path if config_path is not None else "the configuration"
                if where in RETIRED_KEYS:
                    problems.append(f"{where!r} in {origin} is no longer an option: {RETIRED_KEYS[where]}")
                    continue
                close = difflib.get_close_matches(where, list(model.model_fields), n=1)
                hint = f"; did you mean {close[0]}?" if close else f"; valid keys: {', '.join(model.model_fields)}"
                problems.append(f"unknown key {where!r} in {origin}{hint}")
            else:
                problems.append(f"{where} ({flag}): {error['msg']} (got {error.get('input')!r})")
        source = f" in {config_path} or on the command line" if config_path else ""
        raise ConfigError("invalid configuration" + source + ": " + "; ".join(problems)) from None
