"""The package's shape, read from its source with ``ast``: ``capture/`` never reaches ``extract/`` (directly,
through ``hsextract.config`` or any module between), no import circle among hsextract's modules, no module
over 500 lines."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import hsextract
from hsextract.extract.formats import FORMATS

PACKAGE = Path(hsextract.__file__).parent
MAX_LINES = 500
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
    if module == "hsextract.extract.formats":  # the registry loads each format's module by name
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
    found = set(circles(graph()))
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
