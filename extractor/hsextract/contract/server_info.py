"""``GET /server_info``: what a server serves, as the extractor needs it.

The embedded server answers with :meth:`ServerInfo.to_json` (its extra keys are informational).
SGLang's own ``/server_info`` has ``model_path`` but none of the hsextract keys: then the model's
shape comes from its ``config.json`` (when the extractor can read it). It does list the server's
arguments, ``forward_hooks`` among them: the dump hook's config the launcher rendered says the dump
root, whether the pre-norm state is dumped, and the storage of every dump
(:func:`~hsextract.contract.hook_config.find_hook_config`).
What neither says is unknown (None), taken from the extractor's config instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hsextract.contract.context_length import context_length_of
from hsextract.contract.hook_config import find_hook_config
from hsextract.errors import ServerError

#: ``/generate`` key asking a server that says ``final_prenorm_per_request`` to dump the pre-norm state
FINAL_PRENORM_KEY = "hsextract_final_prenorm"
#: ``/generate`` key asking a server that says ``fp8_per_request`` to dump this request as FP8
#: (value ``"float8_e4m3fn"``, :data:`hsextract.contract.files.fp8.FP8_STORAGE`)
STORAGE_KEY = "hsextract_storage"
#: the dump hook's storage when its config has none: the model's dtype
MODEL_DTYPE_STORAGE = "auto"


@dataclass(frozen=True)
class ServerInfo:
    model_path: str
    num_layers: int  # JSON: num_hidden_layers
    hidden_size: int
    vocab_size: int
    dtype: str | None  # None: not said ("auto")
    layer_ids: list[int] | None  # aux, 0-based; None when the server does not say
    dump_dir: str | None
    engine: str  # "sglang" or "hsextract-embedded"
    provides_final_prenorm: bool | None  # None: not said
    engine_version: str | None = None
    rid_prefix: str | None = None
    model_fingerprint: str | None = None  # contract.model_fingerprint, when the server computes it
    # The server dumps the pre-norm state only for requests that ask (``hsextract_final_prenorm``).
    final_prenorm_per_request: bool | None = None
    # The server dumps a request as FP8 (``contract.fp8``) when it asks (``hsextract_storage``).
    fp8_per_request: bool | None = None
    # SGLang: the storage its dump hook writes for every request (MODEL_DTYPE_STORAGE or
    # "float8_e4m3fn"), from the hook's config; None: not said
    hook_storage: str | None = None
    # the model's context as served (contract.context_length): prompts must be shorter; None: unknown
    context_length: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "model_path": self.model_path,
            "model_fingerprint": self.model_fingerprint,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "dtype": self.dtype,
            "layer_ids": self.layer_ids,
            "dump_dir": self.dump_dir,
            "rid_prefix": self.rid_prefix,
            "provides_final_prenorm": self.provides_final_prenorm,
            "final_prenorm_per_request": self.final_prenorm_per_request,
            "fp8_per_request": self.fp8_per_request,
            "context_length": self.context_length,
        }

    @classmethod
    def parse(cls, info: dict[str, Any], model_config: dict[str, Any], vocab_override: int | None = None) -> ServerInfo:
        """From a ``/server_info`` answer, completed by the model's ``config.json`` (may be empty)."""
        model_path = str(info.get("model_path", ""))

        def pick(*names: str) -> Any:
            for name in names:
                if info.get(name) is not None:
                    return info[name]
                if model_config.get(name) is not None:
                    return model_config[name]
            return None

        num_layers, hidden, vocab = pick("num_hidden_layers"), pick("hidden_size"), pick("vocab_size")
        vocab = vocab_override or vocab
        missing = [n for n, v in (("num_hidden_layers", num_layers), ("hidden_size", hidden), ("vocab_size", vocab)) if v is None]
        if missing:
            raise ServerError(
                f"the server's /server_info does not give {missing} and the model's config.json at "
                f"{model_path or '(no model_path)'} is not readable from here; mount the model at the same path "
                "or set vocab_size in the extractor config"
            )
        dtype = info.get("dtype") or model_config.get("dtype") or model_config.get("torch_dtype")
        layer_ids = info.get("layer_ids")
        hook = find_hook_config(info.get("forward_hooks"))
        provides_final_prenorm = info.get("provides_final_prenorm")
        if provides_final_prenorm is None and hook is not None:
            provides_final_prenorm = hook[0].final_prenorm and hook[1]
        return cls(
            model_path=model_path,
            num_layers=int(num_layers),
            hidden_size=int(hidden),
            vocab_size=int(vocab),
            dtype=None if dtype in (None, "auto") else str(dtype),
            layer_ids=None if layer_ids is None else [int(i) for i in layer_ids],
            dump_dir=info.get("dump_dir") or (None if hook is None else str(hook[0].dump_dir)),
            engine=str(info.get("engine", "sglang")),
            provides_final_prenorm=provides_final_prenorm,
            engine_version=info.get("engine_version"),
            rid_prefix=info.get("rid_prefix"),
            model_fingerprint=info.get("model_fingerprint"),
            final_prenorm_per_request=info.get("final_prenorm_per_request"),
            fp8_per_request=info.get("fp8_per_request"),
            hook_storage=None if hook is None else (hook[0].storage or MODEL_DTYPE_STORAGE),
            context_length=context_length_of(info, model_config),
        )
