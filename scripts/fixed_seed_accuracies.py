"""Fixed-seed mnist10k runs of this checkout; prints every round's accuracy as JSON.

Run it in two checkouts and compare the output to show that a refactoring changed no
result (it was used for the method-registry refactoring: bit-identical)::

    python scripts/fixed_seed_accuracies.py OUT_DIR --data-dir DIR > after.json

DIR must hold MNIST/raw/t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz.
FedVLS, FedNTD and FedLC (the teacher, the fused FedVLS step and the masked FedLC loss),
10 clients, Dirichlet 0.05, 10 rounds x 2 local epochs, seed 0.
"""

import argparse
import json
import tempfile
from pathlib import Path

from fedvls_flwr.launch import PROJECT_DIR, LocalSuperLink

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("out", type=Path)
ap.add_argument("--data-dir", required=True)
args = ap.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
base = {"dataset": "mnist10k", "data-dir": str(Path(args.data_dir).resolve()), "num-server-rounds": 10,
        "local-epochs": 2, "dirichlet-beta": 0.05, "seed": 0, "output-dir": str(args.out.resolve())}
federation = {"num-supernodes": 10, "client-resources-num-cpus": 1}
accuracies = {}
with LocalSuperLink(Path(tempfile.mkdtemp(prefix="fixed-seed-"))) as link:
    for method in ("fedvls", "fedntd", "fedlc"):
        config = {**base, "method": method, "run-name": method}
        outcome = link.wait(link.submit(PROJECT_DIR, run_config=config, federation_config=federation), timeout=1800)
        assert outcome.completed, outcome.log[-3000:]
        lines = (args.out / method / "rounds.jsonl").read_text().splitlines()
        accuracies[method] = [json.loads(line)["accuracy"] for line in lines]
print(json.dumps({"project": str(PROJECT_DIR), "accuracies": accuracies}))
