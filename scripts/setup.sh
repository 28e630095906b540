#!/usr/bin/env bash
# Creates .venv with this project installed editable, its test tools, and the tested stack.
# Python 3.11 (the default) installs exactly constraints-py311.txt (torch 2.14.1, torchvision
# 0.29.1, flwr 1.41.0, ...): what CI runs. PYTHON=python3.12 (or 3.13) installs from the ranges
# in pyproject.toml instead; a torch already installed in that interpreter's environment is kept
# (e.g. a GPU host's CUDA build: PYTHON=/usr/bin/python3 with VENV_ARGS=--system-site-packages).
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), f"Python >= 3.11 needed, found {sys.version}"'
[ -x .venv/bin/python ] || "$PY" -m venv ${VENV_ARGS:-} .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if .venv/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    # torch/torchvision first, pinned, so no other requirement can pull a different build.
    "${pip[@]}" -c constraints-py311.txt torch torchvision
    "${pip[@]}" -c constraints-py311.txt -e '.[test]'
else
    echo "note: $(.venv/bin/python -V): installing from pyproject's ranges (the exact lock, constraints-py311.txt, is for Python 3.11)"
    "${pip[@]}" -e '.[test]'
fi
.venv/bin/python -c 'import sys, torch, torchvision, flwr, sklearn, yaml; print(f"setup ok: Python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__}, flwr {flwr.__version__}")'
# nginx is not a Python package: the deployment fence (docs/deployment.md) needs it from the system.
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || \
    echo "note: nginx not found; 'fedvls deploy local' (the fence) and its tests need it: apt-get install nginx"
