#!/usr/bin/env bash
# The GPU path in one command, on a machine with an NVIDIA GPU (also offline, on the host's
# own Python and CUDA build of torch):
#   bash bench/gpu_check.sh
# 0. the environment: .venv if it exists; otherwise a new .venv that sees the host's torch
#    (--system-site-packages) with the project and pytest installed from $WHEELHOUSE, no
#    index (make it on a machine with internet: fedvls wheelhouse --with-tests
#    --python-version 3.12 -o wheelhouse, and copy it over with the checkout);
# 1. the CUDA-only unit tests (skipped on CPU-only machines);
# 2-4. bench/gpu_check.py: MobileNetV2 (CIFAR-format) in Flower's Ray simulation (4 clients at
#    0.25 GPU each, one Ray head for both runs) and the CNN (Fashion-MNIST-format) on the
#    in-process engine, FedAvg and FedVLS, 3 rounds (s/round, img/s, peak GPU memory, the
#    device of every client), the plain PyTorch loop on the same GPU for the ratios, and a
#    2-SuperNode deployment on 127.0.0.1 training on the GPU; every step within --budget
#    (230 s: the whole script fits one 4-minute GPU lease) or said as skipped.
# Prints one summary at the end; the full output is in $LOG.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELHOUSE=${WHEELHOUSE:-wheelhouse}
LOG=${LOG:-$(mktemp /tmp/fedvls-gpu-check.XXXX.log)}
if [ ! -x .venv/bin/python ]; then
    [ -d "$WHEELHOUSE" ] || { echo "no .venv and no wheelhouse at $WHEELHOUSE: run scripts/setup.sh (online) or bring a wheelhouse"; exit 2; }
    "${PYTHON:-python3}" -m venv --system-site-packages .venv
    .venv/bin/python -c 'import torch' || { echo "the host's Python has no torch: install the CUDA build that matches the driver first"; exit 2; }
    PIP_CONFIG_FILE=/dev/null .venv/bin/python -m pip install -q --no-index --find-links "$WHEELHOUSE" fedvls-flwr pytest || exit 2
fi
PY=.venv/bin/python
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
    $PY -c 'import sys, torch, flwr; print(f"Python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), flwr {flwr.__version__}")'
} | tee -a "$LOG"
if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "torch sees no CUDA device here: nothing to check (this script is for a GPU machine)"; exit 2
fi
status=0
echo "== 1. CUDA unit tests" | tee -a "$LOG"
$PY -m pytest -q -rs -p no:cacheprovider tests/test_augment.py tests/test_objectives.py tests/test_training.py tests/test_device.py \
    -k "cuda or gpu" 2>&1 | tee -a "$LOG" | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== 2-4. simulations, plain loop and a deployment on the GPU (bench/gpu_check.py)" | tee -a "$LOG"
$PY bench/gpu_check.py "$@" 2>&1 | tee -a "$LOG" | sed -n '/^GPU check on/,$p'
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "full log: $LOG; exit $status"
exit $status
