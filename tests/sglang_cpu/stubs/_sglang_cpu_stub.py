"""Placeholder packages for a CPU-only SGLang 0.5.23 venv (see tests/sglang_cpu/README.md).

PyPI has no CPU builds of torchvision (matching torch 2.13.0) or sgl_kernel, but SGLang imports both
at module level: ``import torchvision.transforms as T`` (multimodal configs) and
``from sgl_kernel import copy_all_layer_kv_cache_cpu`` (KV cache), and transformers, seeing a
torchvision package, imports ``torchvision.io``. The text-only, plain-PyTorch CPU path
(SGLANG_USE_CPU_ENGINE=1, no AMX) calls none of them. So every submodule imports, every name is
a placeholder, and calling a placeholder raises RuntimeError: a real use is loud, never silent.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class Placeholder:
    """A name from a stubbed package: attribute access gives another placeholder; calling raises."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname} was called, but it is a stub in this CPU-only SGLang venv")

    def __repr__(self):
        return f"<stub {self._qualname}>"


def _module_getattr(modname: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{modname}.{name}")
    return __getattr__


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []  # a package, so deeper submodules import too
        mod.__getattr__ = _module_getattr(spec.name)
        return mod

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def install(package_name: str, namespace: dict) -> None:
    """Make ``package_name`` (already importing) hand out placeholders for any name or submodule."""
    namespace["__getattr__"] = _module_getattr(package_name)
    sys.meta_path.insert(0, _Finder(package_name))
