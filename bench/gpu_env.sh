#!/usr/bin/env bash
# Source me on the GPU machine from the repo root:  source bench/gpu_env.sh
# flwr, Ray and the packages the host's Python lacks, installed offline from .whl/ (made here by
# bench/gpu_wheels.sh) next to the host's own torch: a venv on the host's Python that sees the
# host's site-packages through a .pth line; where no venv can be made, a --target folder on
# PYTHONPATH. This checkout goes on the path; python, flwr, flower-superlink become these.
GPU_VENV=${GPU_VENV:-/tmp/fedvls-gpu-venv}
HOST_PY=${HOST_PY:-$(command -v python3)}
_fedvls_pip() { local py=$1; shift; PIP_CONFIG_FILE=/dev/null "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check "$@"; }
if [ -x "$GPU_VENV/bin/python" ] && "$GPU_VENV/bin/python" -c 'import flwr' 2>/dev/null; then
    export PATH="$GPU_VENV/bin:$PATH"  # made by an earlier source in this machine
elif rm -rf "$GPU_VENV" && "$HOST_PY" -m venv --system-site-packages "$GPU_VENV" 2>/dev/null \
        && [ -x "$GPU_VENV/bin/python" ]; then
    HOST_SITE=${HOST_SITE:-$("$HOST_PY" -c 'import site; print(site.getsitepackages()[0])')}
    VSITE=$("$GPU_VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')
    echo "$HOST_SITE" > "$VSITE/zz-host-site.pth"
    echo "$PWD" > "$VSITE/fedvls-checkout.pth"
    _fedvls_pip "$GPU_VENV/bin/python" .whl/*.whl || return 2
    export PATH="$GPU_VENV/bin:$PATH"
else
    echo "gpu env: no venv on $HOST_PY; installing into /tmp/fedvls-site (PYTHONPATH)"
    _fedvls_pip "$HOST_PY" --target /tmp/fedvls-site .whl/*.whl || return 2
    mkdir -p /tmp/fedvls-site/bin && ln -sf "$HOST_PY" /tmp/fedvls-site/bin/python
    export PYTHONPATH="/tmp/fedvls-site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/fedvls-site/bin:$PATH"
fi
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# what runs, with the host's packages that flwr's gRPC needs (grpcio >= 1.81.1 for the lock's
# grpcio-health-checking); Ray only reported: the session's steps before the Ray one run without it
python - <<'PYEOF'
import importlib.metadata as md, sys, flwr, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "missing"
try:
    import ray
    ray_said = ray.__version__
except Exception as err:  # reported: only the Ray simulation's rows need it
    ray_said = f"cannot be imported ({type(err).__name__}: {err})"
print(f"gpu env: Python {sys.version.split()[0]}, flwr {flwr.__version__}, ray {ray_said}, torch {torch.__version__}, "
      f"CUDA {torch.cuda.is_available()}; grpcio {version('grpcio')}, protobuf {version('protobuf')}, typer {version('typer')}")
PYEOF
