"""``RunSetup``: what preflight established, as one frozen value read by every part of the run.

Made once by :func:`~hsextract.extract.preflight.prepare` (the config, the server's ``/server_info``,
the resolved aux layers, the dump root, the format, the SGLang serving value), then completed with the
output's identity once it is recorded (``dataclasses.replace``: a new value, never a changed one). The
row worker, the end-of-run ``data_config.json`` and the summary read it instead of loose parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hsextract.contract.layers import capture_indices
from hsextract.extract.checks.dump_checks import DumpExpectation

if TYPE_CHECKING:
    from hsextract.contract.server_info import ServerInfo
    from hsextract.extract.config import ExtractConfig
    from hsextract.output.formats.base import OutputFormat
    from hsextract.output.identity import OutputIdentity
    from hsextract.output.serving_hints import SGLangServing


@dataclass(frozen=True)
class RunSetup:
    config: ExtractConfig
    #: what the server reports (``/server_info``)
    server: ServerInfo
    aux_layer_ids: list[int]
    #: where the server dumps, as the extractor reads it
    dump_dir: Path
    fmt: OutputFormat
    serving: SGLangServing
    #: the output's identity once recorded (``identity.json``); None before
    identity: OutputIdentity | None = None
    #: a dataset ``hsextract prepare`` made: its ``prepare.json`` (settings and counts); None otherwise
    dataset_preparation: dict[str, Any] | None = None

    @property
    def vocab_size(self) -> int:
        return self.server.vocab_size

    @property
    def final_prenorm(self) -> bool:
        """Whether each request asks for the pre-norm final state (the format needs it, the server takes it per request)."""
        return self.fmt.needs_final_prenorm and bool(self.server.final_prenorm_per_request)

    @property
    def request_storage(self) -> str | None:
        """The storage each request asks for; None: not asked. A server that cannot take it per request dumps
        what it is configured with (the SGLang hook's storage); every dump's storage is checked either way."""
        cfg = self.config
        return cfg.storage if cfg.fp8 and self.server.fp8_per_request else None

    @property
    def computed_dtype(self) -> str | None:
        """The dtype the server computes the states in (the identity's, pinned by the first dump, else the server's word)."""
        return self.identity.dtype if self.identity is not None else self.server.dtype

    def dump_expectation(self) -> DumpExpectation:
        """What every dump of this run must be (the output's model, layers, sizes, storage)."""
        identity = self.identity
        if identity is None:
            raise ValueError("the run's identity is not recorded yet")
        cfg = self.config
        return DumpExpectation(
            self.aux_layer_ids,
            capture_indices(self.aux_layer_ids),
            identity.hidden_size,
            identity.dtype,
            self.fmt.needs_final_prenorm,
            model_path=identity.model.path,
            model_fingerprint=identity.model.fingerprint,
            storage=cfg.storage if cfg.fp8 else None,
        )
