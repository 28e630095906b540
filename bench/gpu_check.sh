#!/usr/bin/env bash
# Verify the GPU path in one command, on a machine with an NVIDIA GPU:
#   bash bench/gpu_check.sh
# 1. the CUDA-only unit tests (they are skipped on CPU-only machines),
# 2. every model of the zoo 3 rounds end to end (clients on the GPU),
# 3. throughput of the CIFAR models and of the batched augmentation, CPU vs GPU,
# 4. multi-round FedAvg and FedVLS runs, MobileNetV2 on CIFAR-format data and the CNN on
#    Fashion-MNIST-format data, 4 clients sharing the GPU: s/round, img/s, FedVLS/FedAvg.
# Prints a short summary at the end; the full output is in $LOG.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOG=${LOG:-$(mktemp /tmp/fedvls-gpu-check.XXXX.log)}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
if ! $PY -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "torch sees no CUDA device here: nothing to check (this script is for a GPU machine)"; exit 2
fi
status=0
echo "== 1. CUDA unit tests" | tee -a "$LOG"
$PY -m pytest -q -rs tests/test_augment.py tests/test_objectives.py tests/test_training.py -k "cuda or gpu" 2>&1 | tee -a "$LOG" | tail -3 || status=1
echo "== 2. every model, 3 rounds" | tee -a "$LOG"
$PY -m pytest -q tests/test_e2e_cifar.py 2>&1 | tee -a "$LOG" | tail -2 || status=1
echo "== 3. throughput (bench/bench_models.py --quick)" | tee -a "$LOG"
$PY bench/bench_models.py --quick 2>&1 | tee -a "$LOG" | tail -25
echo "== 4. multi-round runs on the GPU (bench/gpu_check.py)" | tee -a "$LOG"
$PY bench/gpu_check.py 2>&1 | tee -a "$LOG" | tail -9 || status=1
echo "full log: $LOG; exit $status"
exit $status
