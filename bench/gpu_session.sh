#!/usr/bin/env bash
# Every GPU figure and check this project waits for, in one call on a lent GPU machine
# (the device tool: one command of at most 10 minutes; start-up and idle time count too):
#
#   OUT=/some/folder bash bench/gpu_session.sh          # on the GPU machine, .whl/ carried along
#   bash bench/gpu_session.sh --cpu                     # rehearsal here: tiny sizes, .venv's Python
#   OUT=/some/folder bash bench/gpu_session.sh --quick  # a second, shorter call: gpu_step --quick, no Ray
#
# 1. the environment (bench/gpu_env.sh: flwr and Ray from .whl/ beside the host's CUDA torch);
# 2. the CUDA-only tests: every part's graphed step against its eager step over 3 rounds, the
#    augmentation replayed from a graph, the client on the GPU (they skip, saying so, on a CPU);
# 3. bench/gpu_step.py: per model eager vs graphed, augmentation per batch, amp and channels-last
#    on and off, the FedVLS / FedAvg step ratio, a round on the in-process engine;
# 4. bench/round_phases.py: where an ordinary round's time goes (4 ResNet-18 clients, 1 worker);
# 5. bench/bench_gpu_workers.py: a round's clients at once (client workers) against one worker
#    and Flower's Ray simulation, and 10 ResNet-18 clients' images per second.
# Each step has its own time limit so that a slow one cannot take the others' time; every
# step's output and JSON land in $OUT, and one summary line per step is printed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
CPU=0 QUICK=0
for arg in "$@"; do
    case $arg in
        --cpu) CPU=1 ;;
        --quick) QUICK=1 ;;
        *) echo "gpu session: unknown argument $arg (--cpu, --quick)"; exit 2 ;;
    esac
done
OUT=${OUT:-$(mktemp -d /tmp/fedvls-gpu-session.XXXX)}
mkdir -p "$OUT"
SUMMARY=()
step() {  # step NAME SECONDS COMMAND...: run it with a limit, keep its output, note its exit code
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    SUMMARY+=("$name: rc $rc in $((SECONDS - t0)) s (limit $limit s)$([ $rc -eq 124 ] && echo ', cut off')")
    printf '%s\n' "${SUMMARY[@]}" >"$OUT/summary.txt"  # after every step: a call cut off keeps it
    tail -n 25 "$OUT/$name.txt"
}
if [ $CPU -eq 1 ]; then
    export PATH="$PWD/.venv/bin:$PATH"
    BENCH_FLAG=(--cpu)
else
    # shellcheck source=bench/gpu_env.sh
    source bench/gpu_env.sh || { echo "gpu session: the environment could not be made (is .whl/ carried?)"; exit 2; }
    BENCH_FLAG=()
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode,mig.mode.current --format=csv,noheader >"$OUT/nvidia-smi.txt" 2>&1
fi
python -c 'import sys, torch; print(f"Python {sys.version.split()[0]}, torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")' | tee "$OUT/python.txt"
# limits: the full call fits one 10-minute command after the environment; --quick fits what a
# first call leaves of a session's 15 minutes of device time (about 7)
if [ $QUICK -eq 1 ]; then
    STEP_FLAG=(--quick) WORKER_FLAG=(--skip-ray --budget 130) LIMITS=(90 90 70 150)
else
    STEP_FLAG=() WORKER_FLAG=(--budget 180) LIMITS=(150 200 90 200)
fi
step cuda-tests "${LIMITS[0]}" python -m pytest -q -p no:cacheprovider tests/test_graphed_step.py tests/test_augment.py tests/test_device.py -rs
step gpu-step "${LIMITS[1]}" python bench/gpu_step.py "${BENCH_FLAG[@]}" "${STEP_FLAG[@]}" --out "$OUT/gpu-step.json"
step round-phases "${LIMITS[2]}" python bench/round_phases.py "${BENCH_FLAG[@]}" --out "$OUT/round-phases.json"
step gpu-workers "${LIMITS[3]}" python bench/bench_gpu_workers.py "${BENCH_FLAG[@]}" "${WORKER_FLAG[@]}" --out "$OUT/gpu-workers.json"
printf '%s\n' "gpu session ($([ $CPU -eq 1 ] && echo 'CPU rehearsal' || echo GPU)), results in $OUT:" "${SUMMARY[@]}" | tee "$OUT/summary.txt"
