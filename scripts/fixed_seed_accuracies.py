"""Fixed-seed runs of a checkout, one per kind of part; prints what each computed as JSON.

Run it before and after a refactoring and compare the two outputs: equal JSON means the
refactoring changed no result. Each run reports every round's accuracy and training loss and a
SHA-256 of its final model's arrays, so a change in any bit of the weights shows::

    python scripts/fixed_seed_accuracies.py OUT_DIR > after.json
    PYTHONPATH=<old checkout> python <old checkout>/scripts/fixed_seed_accuracies.py OUT_DIR2 \\
        --project <old checkout> > before.json      # the same script, if the old one lacks runs
    python scripts/fixed_seed_accuracies.py OUT_DIR --only fedconcat --engine inprocess

The runs (scikit-learn's digits, 4 clients, Dirichlet 0.05, seed 0, 3 rounds of 2 local
epochs): FedVLS, FedAvg and MOON (the teacher, the fused FedVLS step, the projection head and
the client state that crosses rounds), FedVLS with FedAdam, FedAvg's objective with FedGF's
step (a server companion with state), FedVLS with FedSAM and FedExP, FedConcat with K = 2 across
its stage boundary (4 rounds), and FedAvg with carried momentum and half the clients a round.

``--engine flwr`` (the default) submits each run with ``flwr run`` to a local SuperLink (Ray
simulation); ``--engine inprocess`` runs the same apps on the in-process engine (``fedvls run``)
with the same federation config: a round's clients on as many client workers as it gives room
for, at most ``--workers`` (1: the clients one after another in this process).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

RUNS: dict[str, dict[str, object]] = {
    "fedvls": {"method": "fedvls"},
    "fedavg": {"method": "fedavg"},
    "moon": {"method": "moon"},
    "fedvls-fedadam": {"method": "fedvls", "server-optimizer": "fedadam"},
    "fedgf": {"method": "fedavg", "local-optimizer": "fedgf"},
    "fedvls-sam-fedexp": {"method": "fedvls", "local-optimizer": "sam", "server-optimizer": "fedexp"},
    "fedconcat": {"method": "fedavg", "protocol": "fedconcat", "num-server-rounds": 4, "fedconcat-encoder-rounds": 2},
    "carry-half": {"method": "fedavg", "optimizer-state": "carry", "fraction-train": 0.5},
}
#: Arrays of the final model that are bookkeeping of a protocol, not weights.
NOT_WEIGHTS = ("fedconcat/encoder-rounds",)


def model_digest(path: Path) -> str:
    with np.load(path) as saved:
        h = hashlib.sha256()
        for key in sorted(k for k in saved.files if k not in NOT_WEIGHTS):
            value = np.ascontiguousarray(saved[key])
            h.update(key.encode() + str(value.dtype).encode() + str(value.shape).encode() + value.tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--project", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the app folder to run (default: this checkout)")
    ap.add_argument("--only", action="append", default=[], choices=sorted(RUNS), help="only these runs")
    ap.add_argument("--engine", default="flwr", choices=("flwr", "inprocess"))
    ap.add_argument("--workers", type=int, help="--engine inprocess: at most this many client workers")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = {"dataset": "digits", "num-server-rounds": 3, "local-epochs": 2, "seed": 0,
            "output-dir": str(args.out.resolve())}
    federation = {"num-supernodes": 4, "client-resources-num-cpus": 1}
    runs = {name: {**base, **RUNS[name], "run-name": name} for name in (args.only or RUNS)}
    if args.engine == "inprocess":
        from fedvls_flwr.ops.inprocess import run_in_process

        for config in runs.values():
            run_in_process(config, num_supernodes=federation["num-supernodes"],
                           client_cpus=federation["client-resources-num-cpus"], workers=args.workers)
    else:
        try:
            from fedvls_flwr.ops.launch import LocalSuperLink
        except ImportError:  # a checkout that kept its launcher under app/
            from fedvls_flwr.app.launch import LocalSuperLink  # type: ignore[no-redef]
        with tempfile.TemporaryDirectory(prefix="fixed-seed-") as home, LocalSuperLink(Path(home)) as link:
            for config in runs.values():
                outcome = link.wait(link.submit(args.project, run_config=config, federation_config=federation),
                                    timeout=1800)
                assert outcome.completed, outcome.log[-3000:]
    results = {}
    for name in runs:
        records = [json.loads(line) for line in (args.out / name / "rounds.jsonl").read_text().splitlines()]
        results[name] = {
            "accuracy": [r["accuracy"] for r in records],
            "train_loss": [r.get("train", {}).get("train-loss") for r in records],
            "model_sha256": model_digest(args.out / name / "model_final.npz"),
        }
    json.dump({"config": base, "federation": federation, "runs": results}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
