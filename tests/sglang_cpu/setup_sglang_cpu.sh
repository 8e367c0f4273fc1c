#!/usr/bin/env bash
# Create a CPU-only SGLang 0.5.23 venv for the opt-in tests/test_real_sglang_cpu.py.
#
#   bash tests/sglang_cpu/setup_sglang_cpu.sh [VENV]        (default .venv-sglang-cpu)
#
# Seen on 2026-12-02 (2 cores, Python 3.11.7, pip's local torch 2.13.0 CPU wheel): about 3 min (170 s),
# 2.8 GB venv; 2026-12-04: 106 s. How it works around SGLang's GPU-only pins:
#   1. torch==2.13.0 first: pip takes the CPU build from this machine's disk. SGLang pins
#      torch==2.14.1 and a loose torch pulls a multi-GB CUDA build, so sglang goes in --no-deps
#      and everything else under the constraint torch==2.13.0.
#   2. requirements.txt: the pure-Python / CPU subset of sglang's dependencies that the text-only
#      server imports (pip freeze of a venv that served; no flashinfer, sgl-kernel, cuda-python,
#      torchvision, torchaudio, triton kernels, deep-ep ...). `pip check` still lists those as
#      missing: expected.
#   3. stubs/: torchvision and sgl_kernel placeholders (PyPI has no CPU builds of either). SGLang
#      imports both at module level; the plain-PyTorch CPU path (SGLANG_USE_CPU_ENGINE=1, no AMX)
#      never calls them. Any call raises RuntimeError.
# Serve with: SGLANG_USE_CPU_ENGINE=1 VENV/bin/python -m sglang.launch_server --model-path M \
#   --device cpu --host 127.0.0.1 --port P --max-total-tokens 4096
# (without --max-total-tokens the scheduler reserves ~15 GB of KV cache and is killed).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="${1:-.venv-sglang-cpu}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
start=$(date +%s)
"$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q torch==2.13.0
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
echo "torch==2.13.0" > "$CONS"
pip install -q --no-deps sglang==0.5.23
pip install -q -c "$CONS" -r "$HERE/requirements.txt"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$SITE/torchvision" "$SITE/sgl_kernel"
cp -r "$HERE/stubs/torchvision" "$HERE/stubs/sgl_kernel" "$HERE/stubs/_sglang_cpu_stub.py" "$SITE/"
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -W ignore -c '
import torch, importlib.metadata as m
assert torch.__version__.startswith("2.13.0"), torch.__version__
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, sglang.srt.models.qwen3
print("sglang", m.version("sglang"), "torch", torch.__version__, "imports ok")'
echo "venv $VENV: $(du -sh "$VENV" | cut -f1), $(( $(date +%s) - start )) s"
echo "run: DQA_REAL_SGLANG_PYTHON=$VENV/bin/python python -m pytest tests/test_real_sglang_cpu.py -v"
