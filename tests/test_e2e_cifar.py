"""A real `flwr run` simulation on CIFAR-10-format data with MobileNetV2 (augmentation on).

The data are a tiny folder in the real CIFAR-10 python format, written here and read by
the project's real loader (torchvision's ``CIFAR10`` class). torchvision checks every
file against the md5 sums of the real release, which generated files cannot match, and
the ServerApp/ClientApps run in processes that Flower starts (a monkeypatch here does
not reach them). So the test, and only the test, puts a ``sitecustomize.py`` on the
``PYTHONPATH`` of the SuperLink it starts (inherited by every process below it; Flower's
Ray backend forwards ``PYTHONPATH`` to its actors): when ``torchvision.datasets.cifar``
is imported it replaces the expected md5 sums with those of the generated files, the same
substitution tests/test_data.py makes in-process. The integrity check itself still runs.
The project code is unchanged; without the environment variable the hook does nothing.
"""

import hashlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedvls_flwr.launch import LocalSuperLink
from fedvls_flwr.results import read_rounds

pytestmark = pytest.mark.e2e

MD5_ENV = "FEDVLS_TEST_CIFAR_MD5"

SITECUSTOMIZE = '''\
"""Test-only (tests/test_e2e_cifar.py): accept generated CIFAR files in Flower's processes."""
import importlib.abc
import importlib.machinery
import json
import os
import sys

_MD5 = os.environ.get("%(env)s")


def _patch(module):
    for cls_name, sums in json.loads(_MD5).items():
        cls = getattr(module, cls_name)
        cls.train_list = [[n, sums[n]] for n, _ in cls.train_list]
        cls.test_list = [[n, sums[n]] for n, _ in cls.test_list]
        cls.meta = {**cls.meta, "md5": sums[cls.meta["filename"]]}


class _CifarHook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision.datasets.cifar":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _MD5:
    sys.meta_path.insert(0, _CifarHook())
''' % {"env": MD5_ENV}


def _pickle(path: Path, obj) -> str:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_tiny_cifar10(root: Path, per_batch: int = 24, n_test: int = 40, seed: int = 0) -> dict[str, str]:
    """Five training batches, a test batch and the meta file; returns {file name: md5}."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    sums = {}

    def batch(n, label):
        labels = [int(v) for v in rng.integers(0, 10, n)]
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        return {"batch_label": label, "labels": labels, "data": data, "filenames": [f"img_{i}.png" for i in range(n)]}

    for i in range(1, 6):
        sums[f"data_batch_{i}"] = _pickle(folder / f"data_batch_{i}", batch(per_batch, f"training batch {i} of 5"))
    sums["test_batch"] = _pickle(folder / "test_batch", batch(n_test, "testing batch 1 of 1"))
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    sums["batches.meta"] = _pickle(
        folder / "batches.meta", {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072}
    )
    return sums


def test_flwr_run_cifar10_mobilenetv2_completes_and_writes_results(tmp_path):
    data_dir, out = tmp_path / "data", tmp_path / "runs"
    sums = write_tiny_cifar10(data_dir)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)

    run_config = {
        "dataset": "cifar10",
        "model": "mobilenetv2",
        "data-dir": str(data_dir),
        "method": "fedvls",
        "partition": "dirichlet",
        "dirichlet-beta": 0.5,
        "num-server-rounds": 1,
        "local-epochs": 1,
        "batch-size": 16,
        "eval-batch-size": 64,
        "lambda-dis": 0.1,
        "augment": True,
        "amp": True,  # accepted on the CPU and ignored there
        "output-dir": str(out),
        "run-name": "e2e-cifar",
    }
    federation = {"num-supernodes": 2, "client-resources-num-cpus": 1}
    env = {"PYTHONPATH": str(shim), MD5_ENV: json.dumps({"CIFAR10": sums})}
    with LocalSuperLink(tmp_path / "flwr-home", env_extra=env) as link:
        run_id = link.submit(run_config=run_config, federation_config=federation)
        outcome = link.wait(run_id, timeout=240)
        processes = list(link.processes)
    assert outcome.completed, f"run ended {outcome.status}\n{outcome.log[-4000:]}"
    assert all(p.poll() is not None for p in processes)

    run_dir = out / "e2e-cifar"
    rounds = read_rounds(run_dir)
    assert [r["round"] for r in rounds] == [0, 1]
    last = rounds[-1]
    assert 0.0 <= last["accuracy"] <= 1.0 and len(last["per_class_accuracy"]) == 10
    assert last["clients_accepted"] == 2 and last["clients_failed"] == 0
    assert {"train-loss", "train-cal", "train-dis", "train-logit"} <= set(last["train"])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["model"] == "mobilenetv2"
    assert summary["config"]["dataset"] == "cifar10" and summary["config"]["augment"] is True
    assert summary["num_train_pool"] == 5 * 24 and summary["num_test"] == 40
    assert (run_dir / "model_final.npz").stat().st_size > 1_000_000  # ~2.3M parameters
    assert "round 1/1: accuracy" in outcome.log
