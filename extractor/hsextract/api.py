"""What hsextract exports on purpose to code beside it: the benchmarks (``bench/``), a user's own
script. These names stay when the modules behind them move; everything not named here or below is
internal and may change without notice (``tests/unit/test_layering.py`` holds ``bench/`` to this).

Public besides: the CLI (``hsextract.cli.main``, as ``hsextract``), ``hsextract.contract`` (what the server
side and the extractor agree on: dumps, rids, layers, FP8, defaults), ``hsextract.dev`` (tiny models,
tokenizers, sample data, engines with a broken dump path), ``hsextract.evaluate`` and ``hsextract.errors``.

Each name loads its module on first use (torch comes with most of them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hsextract.capture import dump_sink
    from hsextract.capture.embedded import Engine
    from hsextract.capture.embedded.config import ServeConfig
    from hsextract.capture.embedded.decode import DECODE_PHASES
    from hsextract.capture.front import HttpFront
    from hsextract.capture.sglang.hook import HiddenStateDumper
    from hsextract.contract.hook_config import HookConfig
    from hsextract.durable.mounts import mount_of
    from hsextract.durable.sync import sync_file
    from hsextract.extract.checks.dump_checks import DumpExpectation, check_dump
    from hsextract.extract.config import ExtractConfig
    from hsextract.extract.metrics import ExtractMetrics
    from hsextract.extract.outcome import RunSummary
    from hsextract.extract.pack_processes import PackProcesses
    from hsextract.extract.planning.dataset import iter_raw_rows, validate_row
    from hsextract.extract.requests.plain_post import PlainConnection
    from hsextract.extract.run import Extraction
    from hsextract.output.formats import open_format
    from hsextract.output.formats.specforge import SpecForgeFormat
    from hsextract.output.sample import Sample
    from hsextract.output.sample_file import SampleFile, choose_direct
    from hsextract.output.verify import VerifyReport, verify_output
    from hsextract.prepare.config import PrepareConfig
    from hsextract.prepare.run import run_prepare

#: name -> (module, attribute; None: the module itself)
_EXPORTS: dict[str, tuple[str, str | None]] = {
    # the extraction run, as ``hsextract extract`` runs it, in this process (its metrics readable)
    "ExtractConfig": ("hsextract.extract.config", "ExtractConfig"),
    "Extraction": ("hsextract.extract.run", "Extraction"),
    "ExtractMetrics": ("hsextract.extract.metrics", "ExtractMetrics"),
    # the run's pack processes (bench_gpu_e2e measures what one costs to start)
    "PackProcesses": ("hsextract.extract.pack_processes", "PackProcesses"),
    "RunSummary": ("hsextract.extract.outcome", "RunSummary"),
    # the connection a row's /generate goes out on (bench_http_client times it against httpx)
    "PlainConnection": ("hsextract.extract.requests.plain_post", "PlainConnection"),
    # the checks every dump passes before it is packed (bench_dump_pages times them)
    "DumpExpectation": ("hsextract.extract.checks.dump_checks", "DumpExpectation"),
    "check_dump": ("hsextract.extract.checks.dump_checks", "check_dump"),
    # the rows of a dataset and the output formats they are written in
    "Sample": ("hsextract.output.sample", "Sample"),
    "iter_raw_rows": ("hsextract.extract.planning.dataset", "iter_raw_rows"),
    "validate_row": ("hsextract.extract.planning.dataset", "validate_row"),
    "open_format": ("hsextract.output.formats", "open_format"),
    "SpecForgeFormat": ("hsextract.output.formats.specforge", "SpecForgeFormat"),
    # a sample file written as the extractor writes it (direct I/O on a local disk): the disk's limit writes so
    "SampleFile": ("hsextract.output.sample_file", "SampleFile"),
    "choose_direct": ("hsextract.output.sample_file", "choose_direct"),
    # ``hsextract verify``, in this process
    "verify_output": ("hsextract.output.verify", "verify_output"),
    "VerifyReport": ("hsextract.output.verify", "VerifyReport"),
    # the embedded server, as ``hsextract serve`` runs it, in this process
    "ServeConfig": ("hsextract.capture.embedded.config", "ServeConfig"),
    "Engine": ("hsextract.capture.embedded", "Engine"),
    "HttpFront": ("hsextract.capture.front", "HttpFront"),
    "DECODE_PHASES": ("hsextract.capture.embedded.decode", "DECODE_PHASES"),
    # the SGLang hook without SGLang, and its writer (the hook's benchmark times both)
    "HiddenStateDumper": ("hsextract.capture.sglang.hook", "HiddenStateDumper"),
    "HookConfig": ("hsextract.contract.hook_config", "HookConfig"),
    "dump_sink": ("hsextract.capture.dump_sink", None),
    # the mount that holds a path: which filesystem the I/O benchmarks wrote to
    "mount_of": ("hsextract.durable.mounts", "mount_of"),
    # a written file's fsync, as a row's thread makes it once its sample is written
    "sync_file": ("hsextract.durable.sync", "sync_file"),
    # every fsync a no-op inside a block: what the benchmarks measure the syncs' cost with
    "syncs_off": ("hsextract.durable.sync", "syncs_off"),
    # ``hsextract prepare``, in this process
    "PrepareConfig": ("hsextract.prepare.config", "PrepareConfig"),
    "run_prepare": ("hsextract.prepare.run", "run_prepare"),
}

__all__ = [
    "DECODE_PHASES",
    "DumpExpectation",
    "Engine",
    "ExtractConfig",
    "ExtractMetrics",
    "Extraction",
    "HiddenStateDumper",
    "HookConfig",
    "HttpFront",
    "PackProcesses",
    "PlainConnection",
    "PrepareConfig",
    "RunSummary",
    "Sample",
    "SampleFile",
    "ServeConfig",
    "SpecForgeFormat",
    "VerifyReport",
    "check_dump",
    "choose_direct",
    "dump_sink",
    "iter_raw_rows",
    "mount_of",
    "open_format",
    "run_prepare",
    "sync_file",
    "validate_row",
    "verify_output",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: hsextract.api exports {', '.join(__all__)}")
    module, attribute = _EXPORTS[name]
    loaded = importlib.import_module(module)
    return loaded if attribute is None else getattr(loaded, attribute)
