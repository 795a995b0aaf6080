"""A stand-in for ``sgl_kernel``, so that the real SGLang 0.5.23 server starts on a CPU without a GPU.

This is NOT sgl-kernel. SGLang imports ``sgl_kernel`` (and some of its submodules) at module level,
and sgl-kernel has no build for a CPU without AMX. On these machines SGLang's CPU engine
(``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu --attention-backend torch_native``) never calls it: the
server computes everything with torch. So every name here (and in every ``sgl_kernel.<sub>``
module) resolves to a function that appends ``call <name>`` to the file ``$HSX_SGL_KERNEL_STUB_LOG``
and raises; importing the stand-in appends ``import``. ``tests/sglang_live`` puts this directory on
the server's ``PYTHONPATH`` and asserts that the file shows imports (this stand-in, not a real
sgl-kernel, was loaded) and no call: a call swallowed by a fallback in SGLang would otherwise change
what the suite verifies without anyone noticing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

__version__ = "0.0.0+hsextract-test-stub"
STUB = True  # what the tests check to be sure this, not a real sgl-kernel, was loaded
LOG_ENV = "HSX_SGL_KERNEL_STUB_LOG"


def _record(event: str) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{os.getpid()} {event}\n")


class _Stub:
    """What every attribute of the stand-in is: recorded and refused when called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _record(f"call {self._name}")
        raise RuntimeError(f"{self._name} is the hsextract test stand-in for sgl_kernel (no CPU build): it must never be called")

    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel test stub {self._name}>"


def _module_getattr(module_name: str) -> Callable[[str], Any]:
    def getattr_(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return _Stub(f"{module_name}.{name}")

    return getattr_


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every ``sgl_kernel.<anything>`` import with a stub module like this one."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, f"hsextract test stand-in for {spec.name}")
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[method-assign]  # PEP 562 module __getattr__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


__getattr__ = _module_getattr(__name__)
sys.meta_path.insert(0, _SubmoduleFinder())
_record("import")
