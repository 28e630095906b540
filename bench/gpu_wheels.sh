#!/usr/bin/env bash
# Makes .whl/: what bench/gpu_env.sh installs on an offline GPU machine whose Python already has
# torch and many common packages (this workplace's lent H100/H200: Python 3.12, torch 2.11).
#   bash bench/gpu_wheels.sh [HOST_PACKAGES_FILE]
# 1. flwr[simulation] and its dependencies at the tested lock's versions, as cp312 Linux wheels;
# 2. without the packages the host already has (HOST_PACKAGES_FILE, default
#    bench/gpu_host_packages.txt: the lent machines' image as read on 2026-11-17) and without uv (runtime dependency
#    installation stays off: FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1);
# 3. Ray repacked without what a Flower simulation never loads (its Java jars, RLlib, Serve,
#    Tune, Train, Data, LLM, the dashboard's web client) and with its binaries stripped: 72 MB
#    -> 29 MB, so that the checkout and the wheels fit a 64 MiB transfer.
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
"$PY" - "$work" "$HOST_PACKAGES" <<'PYEOF'
import base64, csv, hashlib, os, re, shutil, subprocess, sys, zipfile
from pathlib import Path
work, host_file = Path(sys.argv[1]), sys.argv[2]
host = set()
if host_file:
    host = {n.strip().lower().replace("_", "-") for n in re.split(r"[,\n]", Path(host_file).read_text()) if n.strip()}
for wheel in sorted((work / "all").glob("*.whl")):
    name = re.split(r"-\d", wheel.name)[0].lower().replace("_", "-")
    if name in host or name == "uv":
        continue
    if name != "ray":
        shutil.copy(wheel, ".whl")
        continue
    unpacked = work / "ray"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(unpacked)
    for drop in ("jars", "rllib", "dashboard/client", "data", "serve", "tune", "train", "llm"):
        shutil.rmtree(unpacked / "ray" / drop, ignore_errors=True)
    binaries = [p for p in unpacked.rglob("*") if p.is_file() and (p.suffix == ".so" or os.access(p, os.X_OK))]
    subprocess.run(["strip", "--strip-unneeded", *map(str, binaries)], check=False, stderr=subprocess.DEVNULL)
    info = next(unpacked.glob("*.dist-info"))
    rows = []
    for p in sorted(unpacked.rglob("*")):
        rel = p.relative_to(unpacked).as_posix()
        if p.is_file() and rel != f"{info.name}/RECORD":
            digest = base64.urlsafe_b64encode(hashlib.sha256(p.read_bytes()).digest()).rstrip(b"=").decode()
            rows.append((rel, f"sha256={digest}", p.stat().st_size))
    rows.append((f"{info.name}/RECORD", "", ""))
    with open(info / "RECORD", "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with zipfile.ZipFile(Path(".whl") / wheel.name, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for p in sorted(unpacked.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(unpacked).as_posix())
PYEOF
du -sh .whl; ls .whl | wc -l
