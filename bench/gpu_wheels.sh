#!/usr/bin/env bash
# Makes .whl/: what bench/gpu_env.sh installs on an offline GPU machine whose Python already has
# torch and many common packages (this workplace's lent H100/H200: Python 3.12, torch 2.11).
#   bash bench/gpu_wheels.sh [HOST_PACKAGES_FILE]
# 1. flwr[simulation] and its dependencies at the tested lock's versions, as cp312 Linux wheels;
# 2. without the packages the host already has (HOST_PACKAGES_FILE, default
#    bench/gpu_host_packages.txt: the lent machines' image as read on 2026-11-17) and without uv (runtime dependency
#    installation stays off: FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1);
# 3. Ray repacked without what a Flower simulation never loads (its Java jars, RLlib, Serve,
#    Tune, Train, Data, LLM, the dashboard's web client) and with its binaries stripped, every
#    file's mode kept (bench/repack_wheels.py): 72 MB -> 29 MB, so that the checkout and the
#    wheels fit a 64 MiB transfer (about 58 MiB together).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
HOST_PACKAGES=${1:-bench/gpu_host_packages.txt}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -v '^#' constraints-py311.txt | grep -viE '^(torch|torchvision|triton|nvidia-|cuda-)' > "$work/constraints.txt"
PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q -d "$work/all" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -c "$work/constraints.txt" 'flwr[simulation]==1.41.0'
rm -rf .whl && mkdir -p .whl
"$PY" bench/repack_wheels.py "$work/all" .whl --host-packages "$HOST_PACKAGES"
du -sh .whl; ls .whl | wc -l
