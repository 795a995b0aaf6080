"""The SGLang dump hook's config: what the launcher renders into ``--forward-hooks``, what the hook
reads, and what the extractor reads back from SGLang's ``/server_info`` (which lists the server's
arguments, ``forward_hooks`` among them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.contract.files.storages import STORAGES
from hsextract.contract.rids import DEFAULT_PREFIX, check_prefix
from hsextract.errors import ConfigError

#: the ``--forward-hooks`` factories the launcher registers in SGLang
HOOK_FACTORY = "hsextract.capture.sglang.hook:make_hook"
PRENORM_HOOK_FACTORY = "hsextract.capture.sglang.hook:make_prenorm_hook"


@dataclass(frozen=True)
class HookConfig:
    dump_dir: Path
    rid_prefix: str = DEFAULT_PREFIX
    layer_ids: tuple[int, ...] | None = None  # aux, 0-based, as recorded in every dump's meta
    model_path: str = ""
    queue_size: int = 4  # extend batches copied and waiting for the writer threads
    dump_writers: int = 4  # threads writing dumps in parallel
    final_prenorm: bool = False  # expect make_prenorm_hook on model.norm as well
    storage: str | None = None  # "float8_e4m3fn": every dump in speculators' FP8 layout, quantized on the device

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> HookConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"hsextract hook config has unknown keys {sorted(unknown)}; known: {sorted(known)}")
        if not raw.get("dump_dir"):
            raise ConfigError("hsextract hook config needs dump_dir (the extractor's dump root, on tmpfs)")
        layer_ids = raw.get("layer_ids")
        storage = raw.get("storage")
        if storage is not None and storage not in STORAGES:
            raise ConfigError(
                f"hsextract hook config storage {storage!r} is not one the hook writes: leave it out (the model's dtype) "
                f"or set {STORAGES[0]!r}"
            )
        return cls(
            dump_dir=Path(raw["dump_dir"]),
            rid_prefix=check_prefix(str(raw.get("rid_prefix", DEFAULT_PREFIX))),
            layer_ids=None if layer_ids is None else tuple(int(i) for i in layer_ids),
            model_path=str(raw.get("model_path", "")),
            queue_size=int(raw.get("queue_size", 4)),
            dump_writers=int(raw.get("dump_writers", 4)),
            final_prenorm=bool(raw.get("final_prenorm", False)),
            storage=storage,
        )


def find_hook_config(forward_hooks: Any) -> tuple[HookConfig, bool] | None:
    """The dump hook's config among a server's ``forward_hooks`` (a list, or its JSON text), and whether
    the pre-norm hook is registered too; None when the server has no hsextract dump hook."""
    if isinstance(forward_hooks, str):
        try:
            forward_hooks = json.loads(forward_hooks)
        except ValueError:
            return None
    if not isinstance(forward_hooks, list):
        return None
    specs = [spec for spec in forward_hooks if isinstance(spec, dict)]
    dump = next((spec for spec in specs if spec.get("hook_factory") == HOOK_FACTORY), None)
    if dump is None:
        return None
    raw = dump.get("config")
    try:
        config = HookConfig.parse(raw if isinstance(raw, dict) else {})
    except ConfigError as exc:
        raise ConfigError(
            f"the server's /server_info lists an hsextract dump hook whose config this extractor cannot read ({exc}); "
            "run the extractor from the same hsextract version as the server's ml-env"
        ) from exc
    return config, any(spec.get("hook_factory") == PRENORM_HOOK_FACTORY for spec in specs)
