"""What tracking = "tensorboard" adds to a round: the server's ``log_round`` (the record flattened,
one scalar per number, the event file flushed so a running TensorBoard shows the round now).

    python bench/bench_tracking.py                  # 200 rounds, 10 and 100 classes
    python bench/bench_tracking.py --rounds 500

The records are shaped as the server writes them (``ServerRun.round_record``): FedVLS's four
training-loss terms, per-class accuracy, the local-update diagnostic, 10 clients. Reports the
median and the 95th percentile per round in milliseconds, and the one-off cost of opening
the writer (which, on resume, replays rounds.jsonl's rounds: timed for all of them).
The event files go to a temporary folder on the same disk as ``--dir`` (default: /tmp).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedvls_flwr.app.tracking import TensorBoardTracker, record_metrics  # noqa: E402


def make_record(round_: int, num_classes: int, rng: random.Random) -> dict:
    per_class = [rng.random() for _ in range(num_classes)]
    return {
        "round": round_, "accuracy": sum(per_class) / num_classes, "loss": rng.random() * 2,
        "per_class_accuracy": per_class, "evaluation": "server",
        "train": {"train-loss": rng.random(), "train-cal": rng.random(), "train-dis": rng.random(),
                  "train-logit": rng.random()},
        "drift_diversity": rng.random(), "clients_sampled": 10, "sampled_partitions": list(range(10)),
        "clients_accepted": 10, "clients_failed": 0, "clients_rejected": 0, "attempts": 1, "failures": [],
        "seconds": 10 * rng.random(),
        "local_update": {g: {"local": rng.random(), "global": rng.random(), "clients": 10}
                         for g in ("head", "body", "tail", "vacant")},
    }


def bench(num_classes: int, rounds: int, folder: Path) -> dict:
    rng = random.Random(0)
    records = [make_record(r, num_classes, rng) for r in range(rounds + 1)]
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        tracker = TensorBoardTracker(Path(tmp), {"method": "fedvls"}, replay=[])
        per_round = []
        for record in records:
            t0 = time.perf_counter()
            tracker.log_round(record)
            per_round.append(time.perf_counter() - t0)
        tracker.close()
        t0 = time.perf_counter()  # a resume: every round rewritten, the old file deleted
        TensorBoardTracker(Path(tmp), {"method": "fedvls"}, replay=records).close()
        replay = time.perf_counter() - t0
    per_round.sort()
    return {
        "scalars": len(record_metrics(records[-1])),
        "median_ms": 1e3 * statistics.median(per_round),
        "p95_ms": 1e3 * per_round[int(0.95 * (len(per_round) - 1))],
        "replay_s": replay,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    print(f"| classes | scalars per round | log_round median (ms) | p95 (ms) | resume: replay of {args.rounds} rounds (s) |")
    print("|---:|---:|---:|---:|---:|")
    for num_classes in (10, 100):
        r = bench(num_classes, args.rounds, args.dir)
        print(f"| {num_classes} | {r['scalars']} | {r['median_ms']:.2f} | {r['p95_ms']:.2f} | {r['replay_s']:.2f} |")


if __name__ == "__main__":
    main()
