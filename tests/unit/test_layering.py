"""The package's shape, read from its source with ``ast``: each part imports only the parts below it
(``LAYERS``), ``capture/`` never reaches ``extract/`` (directly, through ``hsextract.config`` or any module
between), no import circle among hsextract's modules (``TYPE_CHECKING`` imports included), no module over
500 lines, no folder over 15, a docstring atop every folder, and the benchmarks on the public face alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import hsextract
from hsextract.output.formats import FORMATS

PACKAGE = Path(hsextract.__file__).parent
BENCH = PACKAGE.parents[1] / "bench"
MAX_LINES = 500
MAX_MODULES_PER_FOLDER = 15
#: what each part of the package may import besides itself (a part: a top-level folder or module). The
#: way down: durable -> contract -> capture | prepare | output -> extract -> ops | regen -> pipeline -> cli.
#: ``errors`` (the exceptions every part raises) reads ``contract.states``' reasons; the small shared modules
#: (``errors``, ``paths``, ``exit_codes``, ``ports``, ``config``) sit beside contract.
BASE = {"errors", "paths", "exit_codes", "ports"}
LAYERS: dict[str, set[str]] = {
    "errors": {"contract"},
    "paths": {"durable", "errors"},
    "exit_codes": set(),
    "ports": {"errors"},
    "durable": {"errors"},
    "contract": {"durable", *BASE},
    "config": {"contract", *BASE},
    "capture": {"contract", "config", *BASE},
    "prepare": {"contract", "durable", "config", *BASE},
    "output": {"contract", "durable", *BASE},
    "evaluate": set(),
    "dev": {"capture", "contract", "durable", "output", *BASE},
    "extract": {"contract", "durable", "output", "prepare", "config", *BASE},
    "ops": {"contract", "durable", "output", *BASE},
    "regen": {"contract", "durable", "extract", "ops", "prepare", "config", *BASE},
    "pipeline_checks": {"output", "prepare", *BASE},
    "pipeline": {"contract", "extract", "output", "prepare", "regen", "pipeline_checks", "config", *BASE},
    "api": {"capture", "contract", "durable", "extract", "output", "prepare"},
    "sglang_hook": {"capture"},
    "cli": {"capture", "contract", "dev", "extract", "ops", "output", "pipeline", "prepare", "regen", "config", *BASE},
    "__main__": {"cli"},
}
#: what ``bench/`` may import: the names exported on purpose (``hsextract.api``'s docstring)
PUBLIC = {"api", "cli", "contract", "dev", "evaluate", "errors"}
#: modules still over MAX_LINES, each to be split (empty once the last one is)
TOO_LONG_FOR_NOW: set[str] = set()
#: import circles still to be broken, as sorted module tuples (empty once the last one is)
KNOWN_CIRCLES: set[tuple[str, ...]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _owner(name: str) -> str | None:
    """The hsextract module that ``name`` (a module or a name in one) is, or None outside the package."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, *, with_type_checking: bool) -> Iterator[str]:
    """Every hsextract module ``module`` imports, at its top or inside a function or class; the imports
    under ``if TYPE_CHECKING:`` only when asked (they never run)."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(nodes: list[ast.stmt]) -> Iterator[str]:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node) and not with_type_checking:
                yield from walk(node.orelse)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if (owner := _owner(alias.name)) is not None:
                        yield owner
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in node.names:
                    target = _owner(f"{base}.{alias.name}") or _owner(base)
                    if target is not None:
                        yield target
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from walk([child])

    for target in walk(ast.parse(path.read_text()).body):
        if target != module:
            yield target
    if module == "hsextract.output.formats":  # the registry loads each format's module by name
        yield from (entry.module for entry in FORMATS.values())


def graph(*, with_type_checking: bool = False) -> dict[str, set[str]]:
    return {module: set(_imports(module, with_type_checking=with_type_checking)) for module in modules()}


def circles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def reachable(edges: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` loads, directly or through others: module -> the module that imports it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop()
        for other in edges.get(node, ()):
            if other not in via and other != start:
                via[other] = node
                todo.append(other)
    return via


def _chain(via: dict[str, str], start: str, end: str) -> str:
    chain = [end]
    while chain[-1] != start:
        chain.append(via[chain[-1]])
    return " -> ".join(reversed(chain))


def _part(module: str) -> str:
    """``hsextract.extract.checks.spot_check`` -> ``extract``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_each_part_imports_only_the_parts_below_it() -> None:
    assert {_part(m) for m in modules()} - {"__init__"} == set(LAYERS), "a new part: give it its place in LAYERS"
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in graph(with_type_checking=True).items()
        for target in targets
        if _part(module) != "__init__" and _part(target) not in {_part(module), "__init__"} | LAYERS[_part(module)]
    )
    assert not wrong, "imports against the layering (LAYERS):\n" + "\n".join(wrong)


def test_the_layers_have_no_circle() -> None:
    edges = {part: allowed - {"contract"} if part == "errors" else allowed for part, allowed in LAYERS.items()}
    assert circles(edges) == []


def test_no_folder_over_15_modules_and_each_says_what_it_holds() -> None:
    folders = {path.parent for path in PACKAGE.rglob("*.py")}
    for folder in sorted(folders):
        if folder.name == "__pycache__":
            continue
        count = len(list(folder.glob("*.py")))
        assert count <= MAX_MODULES_PER_FOLDER + 1, f"{folder.relative_to(PACKAGE)}: {count} modules (split it)"
        init = folder / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), (
            f"{folder.relative_to(PACKAGE)}/__init__.py: say what lives there and what it may import"
        )


def _bench_imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hsextract"):
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.startswith("hsextract"))


def test_the_benchmarks_use_the_public_face() -> None:
    wrong = [
        f"bench/{path.name}:{line}: {module}"
        for path in sorted(BENCH.glob("*.py"))
        for line, module in _bench_imports(path)
        if module == "hsextract" or module.split(".")[1] not in PUBLIC
    ]
    assert not wrong, "bench/ reaches into the package (export the name in hsextract.api):\n" + "\n".join(wrong)


def test_every_public_name_loads() -> None:
    import hsextract.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError, match="exports"):
        api.not_a_name  # noqa: B018


def test_capture_never_reaches_extract() -> None:
    runtime = graph()
    direct = graph(with_type_checking=True)
    problems = []
    for module in modules():
        if not module.startswith("hsextract.capture"):
            continue
        problems += [f"{module} -> {t} (direct)" for t in direct[module] if t.startswith("hsextract.extract")]
        via = reachable(runtime, module)
        problems += [_chain(via, module, t) for t in via if t.startswith("hsextract.extract")]
    assert not problems, "capture/ must not import extract/ (share through hsextract.contract):\n" + "\n".join(
        sorted(set(problems))
    )


def test_capture_loads_no_extract_module() -> None:
    """The same at run time: the server side's modules, imported in a fresh interpreter, load nothing of extract/."""
    code = (
        "import sys\n"
        "import hsextract.capture.embedded, hsextract.capture.embedded.config, hsextract.capture.front\n"
        "import hsextract.capture.sglang.launcher, hsextract.capture.sglang.multinode, hsextract.capture.sglang.hook\n"
        "print(sorted(m for m in sys.modules if m.startswith('hsextract.extract')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"


def test_no_import_circle() -> None:
    found = set(circles(graph(with_type_checking=True)))
    new = found - KNOWN_CIRCLES
    assert not new, "import circles (a module-level or function-level import, or the format registry):\n" + "\n".join(
        " <-> ".join(circle) for circle in sorted(new)
    )
    assert not KNOWN_CIRCLES - found, "a known circle is gone: remove it from KNOWN_CIRCLES"


def test_circle_finder_finds_one() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [("a", "b", "c")]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_500_lines() -> None:
    lengths = {module: len(path.read_text().splitlines()) for module, path in modules().items()}
    too_long = {module for module, n in lengths.items() if n > MAX_LINES}
    assert not too_long - TOO_LONG_FOR_NOW, {m: lengths[m] for m in sorted(too_long - TOO_LONG_FOR_NOW)}
    assert not TOO_LONG_FOR_NOW - too_long, "a module is short enough now: remove it from TOO_LONG_FOR_NOW"


def test_the_cli_and_the_launcher_import_without_torch() -> None:
    """The SGLang image runs ``hsextract launch-sglang`` (and builds the CLI's parser, ``serve``'s options
    included) before torch is there: none of that may load torch, transformers or datasets."""
    code = (
        "import sys\n"
        "import hsextract.cli, hsextract.capture.embedded.config, hsextract.capture.sglang.launcher\n"
        "hsextract.cli.build_parser()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]", done.stdout
