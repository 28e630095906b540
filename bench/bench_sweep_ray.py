"""What one Ray for the whole sweep saves: the same short sweep with a Ray per run, then with
one shared Ray head (``fedvls sweep``'s default), wall time and accuracies.

    python bench/bench_sweep_ray.py                         # 6 digits runs, 2 rounds, 4 clients
    python bench/bench_sweep_ray.py --out docs/results/sweep-shared-ray/bench.md

Both sweeps run the same preset (FedAvg and FedVLS x 3 seeds on digits: 2 rounds of 1 local
epoch, 4 clients) as real ``fedvls sweep`` commands, one after the other, in fresh output
folders; ``RAY_ADDRESS`` is removed from their environment. Reports each sweep's wall time (the
whole command: Ray, SuperLink, every run, the report), the ratio shared / per-run, and checks
that every run's accuracies per round are the same in both (the same seeds, the same results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedvls_flwr.app.results import read_rounds  # noqa: E402

PRESET = """name: bench-sweep-ray
description: six short digits runs for bench/bench_sweep_ray.py
base:
  dataset: digits
  dirichlet-beta: 0.5
  num-server-rounds: {rounds}
  local-epochs: 1
grid:
  method: [fedavg, fedvls]
  seed: [0, 1, 2]
federation:
  num-supernodes: 4
  client-resources-num-cpus: 1
"""


def run_sweep(preset: Path, out: Path, shared: bool) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "fedvls_flwr", "sweep", str(preset), "-o", str(out), "--progress-every", "0",
           "--engine", "flwr"]
    if not shared:
        cmd.append("--no-shared-ray")
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return seconds, res.stdout


def accuracies(out: Path) -> dict[str, list[tuple[int, float]]]:
    return {d.name: [(r["round"], r["accuracy"]) for r in read_rounds(d)]
            for d in sorted(out.iterdir()) if (d / "summary.json").exists()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-ray-") as tmp:
        preset = Path(tmp) / "preset.yaml"
        preset.write_text(PRESET.format(rounds=args.rounds))
        per_run_s, _ = run_sweep(preset, Path(tmp) / "per-run", shared=False)
        shared_s, shared_log = run_sweep(preset, Path(tmp) / "shared", shared=True)
        before, after = accuracies(Path(tmp) / "per-run"), accuracies(Path(tmp) / "shared")
    same = before == after and len(before) == 6
    lines = [
        "# One Ray for a whole sweep (bench/bench_sweep_ray.py)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} "
        f"({os.cpu_count()} CPUs), `python bench/bench_sweep_ray.py --rounds {args.rounds}`: "
        f"6 digits runs (FedAvg, FedVLS x seeds 0-2), {args.rounds} rounds of 1 local epoch, 4 clients, "
        "1 CPU per client; the two sweeps ran one after the other.",
        "",
        "| sweep | wall time (s) |",
        "|---|---|",
        f"| a Ray per run (`--no-shared-ray`) | {per_run_s:.1f} |",
        f"| one Ray for the sweep (default) | {shared_s:.1f} |",
        f"| ratio shared / per run | {shared_s / per_run_s:.2f} |",
        "",
        f"Accuracies per round equal in both sweeps, run by run: {'yes' if same else 'NO'} ({len(before)} runs).",
        "",
        "The shared sweep's Ray line: " + next((f"`{line.strip()}`" for line in shared_log.splitlines()
                                               if "one Ray for the whole sweep" in line), "(not found)"),
    ]
    if not same:
        lines += ["", "per run: " + json.dumps(before), "shared: " + json.dumps(after)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
