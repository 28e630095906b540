"""Fixed-seed runs of this checkout; prints every round's accuracy as JSON.

Run it before and after a refactoring and compare the output to show that it changed no
result (used for the method-registry refactoring and the package move: bit-identical)::

    python scripts/fixed_seed_accuracies.py OUT_DIR > before.json           # digits, 4 clients, 3 rounds
    python scripts/fixed_seed_accuracies.py OUT_DIR --dataset mnist10k --data-dir DIR \\
        --clients 10 --rounds 10 --set local-epochs=2 --methods fedvls,fedntd,fedlc

The defaults are the app's defaults (Dirichlet 0.05, 5 local epochs, seed 0) on scikit-learn's
digits with 4 clients and 3 rounds, for FedVLS, FedAvg and MOON (the teacher, the fused FedVLS
step, the projection head and the client state that crosses rounds).
"""

import argparse
import json
import tempfile
from pathlib import Path

from fedvls_flwr.ops.launch import PROJECT_DIR, LocalSuperLink

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("out", type=Path)
ap.add_argument("--dataset", default="digits")
ap.add_argument("--data-dir", default=None)
ap.add_argument("--clients", type=int, default=4)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--methods", default="fedvls,fedavg,moon")
ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another run-config value (int/float/str)")
args = ap.parse_args()
args.out.mkdir(parents=True, exist_ok=True)


def _value(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


base = {"dataset": args.dataset, "num-server-rounds": args.rounds, "seed": 0, "output-dir": str(args.out.resolve())}
if args.data_dir:
    base["data-dir"] = str(Path(args.data_dir).resolve())
base.update({key: _value(value) for key, value in (item.split("=", 1) for item in args.set)})
federation = {"num-supernodes": args.clients, "client-resources-num-cpus": 1}
accuracies = {}
with LocalSuperLink(Path(tempfile.mkdtemp(prefix="fixed-seed-"))) as link:
    for method in args.methods.split(","):
        config = {**base, "method": method, "run-name": method}
        outcome = link.wait(link.submit(PROJECT_DIR, run_config=config, federation_config=federation), timeout=1800)
        assert outcome.completed, outcome.log[-3000:]
        lines = (args.out / method / "rounds.jsonl").read_text().splitlines()
        accuracies[method] = [json.loads(line)["accuracy"] for line in lines]
print(json.dumps({"config": base, "federation": federation, "accuracies": accuracies}))
