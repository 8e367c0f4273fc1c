"""Stub torchvision for a CPU-only SGLang 0.5.23 venv: importable, raises when called (see _sglang_cpu_stub)."""

import _sglang_cpu_stub

__version__ = "0.0.0+stub"
_sglang_cpu_stub.install(__name__, globals())
