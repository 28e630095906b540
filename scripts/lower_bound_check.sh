#!/usr/bin/env bash
# The project's declared lower bounds, checked: a venv with Python 3.12, torch 2.11.0,
# torchvision 0.26.0 and flwr 1.41.0 (the oldest versions pyproject.toml allows; also the stack of
# the GPU machines this project is measured on), the rest of the lock (constraints-py311.txt) as
# pinned, this checkout installed editable; then ruff, mypy and the tests.
#
#   bash scripts/lower_bound_check.sh                    # the fast tests (-m "not e2e")
#   bash scripts/lower_bound_check.sh -m e2e             # any pytest arguments instead
#   PYTHON=python3.13 VENV=/tmp/lb313 bash scripts/lower_bound_check.sh
#
# Needs PyPI (torch's Linux wheels pull its CUDA libraries, several GB; no GPU is needed) and
# leaves the venv in $VENV (default /tmp/fedvls-lower-bound) for a second run.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.12}
"$PY" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null || {
    echo "error: '$PY' does not run a Python >= 3.11 here; give one: PYTHON=/path/to/python3.12 bash $0" >&2; exit 2; }
VENV=${VENV:-/tmp/fedvls-lower-bound}
TORCH=${TORCH:-2.11.0}
TORCHVISION=${TORCHVISION:-0.26.0}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==$TORCH" "torchvision==$TORCHVISION"
# the lock less torch's own packages (their versions are torch's to choose)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
grep -v -E '^(torch|torchvision|triton|nvidia-|cuda-)' constraints-py311.txt >"$constraints"
"${pip[@]}" -c "$constraints" -e '.[test]'
"$VENV/bin/python" -c 'import sys, torch, torchvision, flwr; print(f"lower-bound stack: Python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__}, flwr {flwr.__version__}")'
"$VENV/bin/ruff" check .
"$VENV/bin/mypy"
if [ $# -eq 0 ]; then set -- -m "not e2e"; fi
"$VENV/bin/python" -m pytest -q -n 2 --dist loadfile -p no:cacheprovider "$@"
