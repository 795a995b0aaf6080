"""An output's identity: what every sample in it was extracted from and how.

``<out>/identity.json`` is written atomically before the first request of the first run, and
every later run is checked against it before it sends anything; a mismatch stops the run
(:class:`IdentityMismatchError`, naming both values and the fix) instead of mixing samples of two
models, layer sets or settings in one output. Every dump is checked against it too (the model
fingerprint and the layers its ``meta.json`` names), so a server restarted mid-run on another
checkpoint stops the run at its first dump.

What must be equal: the model (its fingerprint, ``contract/model_fingerprint.py``, so a moved or
renamed copy is the same model and another checkpoint is not; the path where no fingerprint is
known), the aux layer ids, the number of layers, the format, ``max_seq_len``, the hidden size, the
dtype the server computes and the one the files store, the shard, and for a dataset ``hsextract prepare``
made, how it was tokenized (tokenizer, chat template, ``--like``: ``preparation``). The dataset may change at
its path: its fingerprint then differs, and the per-row content hashes in ``samples.jsonl`` and
``errors.jsonl`` decide which rows are redone. Another dataset (other path and other content) is
refused.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsextract.contract.layers import LAYER_IDS_NUMBERING
from hsextract.durable.atomic import atomic_write_bytes
from hsextract.errors import IdentityMismatchError, OutputError

if TYPE_CHECKING:
    from hsextract.output.data_config import DataConfig

log = logging.getLogger(__name__)

IDENTITY_FILE = "identity.json"
IDENTITY_VERSION = 1


@dataclass(frozen=True)
class ModelIdentity:
    path: str  # absolute, as the server reports it
    fingerprint: str | None  # None: the model's files are not readable from the extractor
    num_hidden_layers: int


@dataclass(frozen=True)
class DatasetIdentity:
    path: str  # absolute
    fingerprint: str | None  # over every row's content hash, in order
    rows: int | None


@dataclass(frozen=True)
class OutputIdentity:
    model: ModelIdentity
    aux_layer_ids: list[int]
    format: str
    max_seq_len: int
    hidden_size: int
    dtype: str | None  # the server's (computed); None until the server or the first dump says
    shard_index: int
    num_shards: int
    dataset: DatasetIdentity
    created_at: str = ""
    identity_version: int = IDENTITY_VERSION
    stored_dtype: str | None = None  # what the sample files hold (a format may convert: specforge stores bfloat16)
    #: how ``hsextract prepare`` tokenized the dataset (:func:`preparation_identity`); None: not a prepared dataset
    preparation: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: Path) -> OutputIdentity:
        try:
            return cls(
                **{
                    **data,
                    "model": ModelIdentity(**data["model"]),
                    "dataset": DatasetIdentity(**data["dataset"]),
                    "aux_layer_ids": [int(i) for i in data["aux_layer_ids"]],
                }
            )
        except (TypeError, KeyError, ValueError) as exc:
            raise OutputError(
                f"{where} is not an output identity of this hsextract ({exc}); if the file was edited or damaged, "
                "restore it, or start a new --output"
            ) from None


#: the prepare.json settings that decide the token ids and masks: another value is another dataset
PREPARATION_KEYS = ("like", "specforge_template", "tokenizer_fingerprint", "chat_template_sha256", "max_seq_len")


def preparation_identity(provenance: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of a prepared dataset's ``prepare.json`` an output's identity pins."""
    if provenance is None:
        return None
    settings = provenance.get("settings", {})
    return {key: settings.get(key) for key in PREPARATION_KEYS}


def read_identity(output: Path) -> OutputIdentity | None:
    """The output's identity; None when it has none. OutputError when it is empty or torn."""
    identity, torn = read_identity_or_torn(output)
    if torn:
        raise OutputError(f"{Path(output) / IDENTITY_FILE} is empty or torn; rerun the extraction (same command) to rewrite it")
    return identity


def read_identity_or_torn(output: Path) -> tuple[OutputIdentity | None, bool]:
    """The output's identity (None: it has none), and whether the file is there but empty or not whole JSON:
    what a power loss leaves of a file written without a sync (hsextract before 0.1 did not sync it)."""
    path = Path(output) / IDENTITY_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, False
    try:
        data = json.loads(text)
    except ValueError:
        return None, True
    return OutputIdentity.from_json(data, path), False


def write_identity(output: Path, identity: OutputIdentity) -> None:
    atomic_write_bytes(Path(output) / IDENTITY_FILE, (json.dumps(identity.to_json(), indent=2) + "\n").encode())


def identity_from_data_config(config: DataConfig) -> OutputIdentity | None:
    """The identity of an output written before identity.json existed (its data_config.json); None when
    it does not record enough to say."""
    if config.format is None or config.max_seq_len is None or config.hidden_size is None:
        return None
    path = config.model.path
    return OutputIdentity(
        model=ModelIdentity(path if os.path.isabs(path) else "", None, config.num_hidden_layers),
        aux_layer_ids=list(config.aux_layer_ids),
        format=config.format,
        max_seq_len=config.max_seq_len,
        hidden_size=config.hidden_size,
        dtype=config.computed_dtype,
        stored_dtype=config.dtype,  # what the files hold (older versions stored the computed dtype)
        shard_index=config.shard_index,
        num_shards=config.num_shards,
        dataset=DatasetIdentity(config.dataset or "", None, None),
        created_at=config.created_at or "",
    )


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _same_path(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b)


def same_model(recorded: ModelIdentity, path: str, fingerprint: str | None) -> bool:
    """The fingerprints decide where both are known; otherwise the paths. An output of an older
    version that recorded a relative path (``path`` ""): nothing to compare, the layers and shapes are."""
    if recorded.fingerprint is not None and fingerprint is not None:
        return recorded.fingerprint == fingerprint
    if not recorded.path:
        return True
    return bool(path) and _same_path(recorded.path, path)


def _model_text(model: ModelIdentity) -> str:
    return f"{model.path} (fingerprint {model.fingerprint or 'unknown: its files are not readable here'})"


def reconcile_identity(
    output: Path, recorded: OutputIdentity | None, current: OutputIdentity
) -> tuple[OutputIdentity, list[str]]:
    """The identity to write for this run, and notes on what changed acceptably.

    Raises :class:`IdentityMismatchError` when this run would add samples of another kind."""
    if recorded is None:
        return replace(current, created_at=current.created_at or now()), []
    mismatches: list[str] = []

    def differs(name: str, old: Any, new: Any, fix: str) -> None:
        if old != new:
            mismatches.append(f"{name} {old!r} (this run: {new!r}); {fix}")

    if not same_model(recorded.model, current.model.path, current.model.fingerprint):
        mismatches.append(
            f"model {_model_text(recorded.model)} (this run's server serves {_model_text(current.model)}); restart the "
            "server with the output's model"
        )
    differs(
        "num_hidden_layers",
        recorded.model.num_hidden_layers,
        current.model.num_hidden_layers,
        "restart the server with the output's model",
    )
    differs(
        "aux_layer_ids",
        recorded.aux_layer_ids,
        current.aux_layer_ids,
        f"restart the server with those layer_ids (and set them in the extractor config; {LAYER_IDS_NUMBERING})",
    )
    differs("format", recorded.format, current.format, f"pass --format {recorded.format}")
    differs("max_seq_len", recorded.max_seq_len, current.max_seq_len, f"pass --max-seq-len {recorded.max_seq_len}")
    differs("hidden_size", recorded.hidden_size, current.hidden_size, "restart the server with the output's model")
    if recorded.dtype is not None and current.dtype is not None:
        differs("dtype", recorded.dtype, current.dtype, f"serve the model in {recorded.dtype}")
    if recorded.stored_dtype is not None and current.stored_dtype is not None:
        differs(
            "stored dtype",
            recorded.stored_dtype,
            current.stored_dtype,
            f"this hsextract stores {current.format} samples as {current.stored_dtype}",
        )
    differs(
        "shard",
        (recorded.shard_index, recorded.num_shards),
        (current.shard_index, current.num_shards),
        f"pass --shard-index {recorded.shard_index} --num-shards {recorded.num_shards}",
    )
    differs(
        "dataset preparation",
        recorded.preparation,
        current.preparation,
        "pass the dataset prepared as the output's was (same tokenizer, chat template and --like), or use a new --output",
    )
    same_dataset_content = (
        recorded.dataset.fingerprint is not None and recorded.dataset.fingerprint == current.dataset.fingerprint
    )
    if not same_dataset_content and not _same_path(recorded.dataset.path, current.dataset.path):
        mismatches.append(
            f"dataset {recorded.dataset.path} (this run: {current.dataset.path}, with other content); pass --dataset "
            f"{recorded.dataset.path}"
        )
    if mismatches:
        raise IdentityMismatchError(
            f"output {output} was started with "
            + "; with ".join(mismatches)
            + f". Nothing was sent: mixing the two would corrupt the output. Fix that, or use a new --output for this run "
            f"(what the output holds: {Path(output) / IDENTITY_FILE})"
        )
    notes: list[str] = []
    if not _same_path(recorded.model.path, current.model.path):
        notes.append(f"the model moved from {recorded.model.path} to {current.model.path} (same fingerprint)")
    if not _same_path(recorded.dataset.path, current.dataset.path):
        notes.append(f"the dataset moved from {recorded.dataset.path} to {current.dataset.path} (same content)")
    elif recorded.dataset.fingerprint != current.dataset.fingerprint:
        notes.append(
            f"the dataset {current.dataset.path} changed since this output was started: rows whose content changed are redone"
        )
    merged = replace(
        current,
        dtype=current.dtype if current.dtype is not None else recorded.dtype,
        stored_dtype=current.stored_dtype if current.stored_dtype is not None else recorded.stored_dtype,
        created_at=recorded.created_at or now(),
    )
    return merged, notes
