"""What the input cases of docs/reliability.md prepare in their fresh folder before the
command runs (``Case.setup``): files with a defect, damaged run folders made by the real
server code on a fake Grid, presets, node-local image folders. See scripts/reliability_cases.py."""

from __future__ import annotations

import gzip
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

DIGITS = ",".join(str(i) for i in range(10))


def write_file(name: str, text: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    return setup


def preset(text: str, name: str) -> Callable[[Path], None]:
    return write_file(f"presets/{name}.yaml", text)


GOOD_PRESET = "name: p\nbase: {dataset: digits, num-server-rounds: 2}\ngrid: {method: [fedavg]}\n"


def damaged_summary(tmp: Path) -> None:
    """``presets/p.yaml`` (GOOD_PRESET) and, in ``out/``, its run's folder with a summary.json cut short."""
    preset(GOOD_PRESET, "p")(tmp)
    write_file("out/digits-fedavg-dir0.05-s0/summary.json", '{"status": "compl')(tmp)


def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def bad_label_mnist(tmp: Path) -> None:
    raw = tmp / "badlabel" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    labels = np.repeat(np.arange(10), 250)
    labels[7] = 12
    write_idx(raw / "t10k-images-idx3-ubyte.gz", np.random.default_rng(0).integers(0, 256, (labels.size, 28, 28)), 2051)
    write_idx(raw / "t10k-labels-idx1-ubyte.gz", labels, 2049)


def run_folder(name: str, rounds: int, damage: Callable[[Path], None] | None = None,
               finished: bool = False) -> Callable[[Path], None]:
    """A digits run of 4 rounds stopped after ``rounds`` (as a killed server leaves it), made by
    the real server code on a fake Grid (tests/test_resume.py), then ``damage``d."""
    def setup(tmp: Path) -> None:
        from fedvls_flwr.app.server import run_experiment
        from fedvls_flwr.config.run_config import RunConfig
        from tests.runs import flower_run_identity
        from tests.test_resume import TrainingGrid

        cfg = RunConfig(dataset="digits", num_server_rounds=4 if finished else rounds,
                        output_dir=str(tmp / "runs"), run_name=name)
        with flower_run_identity():  # Flower's messages need one
            run_dir = run_experiment(TrainingGrid(), cfg)
        if not finished:
            (run_dir / "summary.json").unlink()
            (run_dir / "model_final.npz").unlink()
        if damage is not None:
            damage(run_dir)
    return setup


#: The run config of :func:`fedconcat_run_folder`'s runs (its resume gives the same, with resume=true).
FEDCONCAT = "protocol='fedconcat' fedconcat-assignment='0,1,0,1' fedconcat-encoder-rounds=2"


def fedconcat_run_folder(name: str, rounds: int, damage: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """A digits FedConcat run (:data:`FEDCONCAT`: 2 clusters of 2 sites, 2 encoder rounds, then
    head rounds) stopped after ``rounds`` rounds (> 2: in its second stage), made by the real
    server code on a fake Grid (tests/test_fedconcat.py), then ``damage``d. From round 3 on its
    checkpoint takes the frozen encoders (their 200x200 layers, 160 KB each: above
    ``FROZEN_MIN_BYTES``) from ``checkpoint-frozen-<digest>.npz`` beside it."""
    def setup(tmp: Path) -> None:
        from fedvls_flwr.app.results import FROZEN_FILE_PREFIX
        from fedvls_flwr.app.server import run_experiment
        from fedvls_flwr.config.run_config import RunConfig
        from tests.runs import flower_run_identity
        from tests.test_fedconcat import ConcatGrid

        cfg = RunConfig(dataset="digits", num_server_rounds=rounds, output_dir=str(tmp / "runs"), run_name=name,
                        protocol="fedconcat", fedconcat_assignment="0,1,0,1", fedconcat_encoder_rounds=2)
        with flower_run_identity():  # Flower's messages need one
            run_dir = run_experiment(ConcatGrid(), cfg)
        (run_dir / "summary.json").unlink()
        (run_dir / "model_final.npz").unlink()
        if len(list(run_dir.glob(f"{FROZEN_FILE_PREFIX}*.npz"))) != 1:
            raise RuntimeError(f"{run_dir} holds no frozen file: this case would test nothing")
        if damage is not None:
            damage(run_dir)
    return setup


def frozen_file(run_dir: Path) -> Path:
    from fedvls_flwr.app.results import FROZEN_FILE_PREFIX

    (path,) = run_dir.glob(f"{FROZEN_FILE_PREFIX}*.npz")
    return path


def remove_frozen_file(run_dir: Path) -> None:
    frozen_file(run_dir).unlink()


def truncate_frozen_file(run_dir: Path) -> None:
    path = frozen_file(run_dir)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def tear_line(covered: bool) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        text = (run_dir / "rounds.jsonl").read_text()
        if covered:
            (run_dir / "rounds.jsonl").write_text(text[: len(text) - 40])
        else:
            (run_dir / "rounds.jsonl").write_text(text + '{"round": 3, "accur')
    return damage


def truncate_checkpoint(run_dir: Path) -> None:
    data = (run_dir / "checkpoint.npz").read_bytes()
    (run_dir / "checkpoint.npz").write_bytes(data[: len(data) // 2])


def moved(tmp: Path) -> None:
    run_folder("ok", 2)(tmp / "old")
    (tmp / "new").mkdir()
    os.rename(tmp / "old" / "runs" / "ok", tmp / "new" / "ok")


def runs_for_report(tmp: Path) -> None:
    """A run still going (no summary.json) and a failed one."""
    going = tmp / "runs" / "going"
    going.mkdir(parents=True)
    (going / "rounds.jsonl").write_text('{"round": 0, "accuracy": 0.1}\n')
    failed = tmp / "runs" / "failed"
    failed.mkdir()
    (failed / "rounds.jsonl").write_text('{"round": 0, "accuracy": 0.1}\n{"round": 1, "accuracy": 0.2}\n')
    (failed / "summary.json").write_text('{"status": "failed", "config": {"method": "fedavg", '
                                         '"dataset": "digits", "num-server-rounds": 4}}')


def digit_folder(root: Path, classes: list[int], per_class: int = 3, size: tuple[int, int] | None = None) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    for c in classes:
        (root / str(c)).mkdir(parents=True, exist_ok=True)
        for k, i in enumerate(np.flatnonzero(y == c)[:per_class]):
            img = Image.fromarray(np.rint(x[i].reshape(8, 8) * 255 / 16).astype(np.uint8), mode="L")
            (img.resize(size, Image.Resampling.NEAREST) if size else img).save(root / str(c) / f"{k:04d}.png")


def node_folders(kind: str) -> Callable[[Path], None]:
    """Two sites: ``good`` (classes 0-4) and ``bad``, whose folder has the problem ``kind``."""
    def setup(tmp: Path) -> None:
        digit_folder(tmp / "good", [0, 1, 2, 3, 4])
        bad = tmp / "bad"
        if kind == "one-class":
            digit_folder(bad, [7], per_class=6)
        elif kind == "other-files":
            digit_folder(bad, [5, 6])
            (bad / "5" / "notes.txt").write_text("taken on monday")
            (bad / "README.md").write_text("site b")
        elif kind == "other-size":
            digit_folder(bad, [5, 6], size=(50, 40))
        elif kind == "stray-class":
            digit_folder(bad, [5, 6])
            (bad / "ten").mkdir()
        elif kind == "dangling":
            digit_folder(bad, [5, 6])
            (bad / "5" / "gone.png").symlink_to(tmp / "nowhere.png")
        elif kind == "loop":
            digit_folder(bad, [5, 6])
            (bad / "5" / "again").symlink_to(bad / "5")
        elif kind == "not-an-image":
            digit_folder(bad, [5, 6])
            (bad / "6" / "scan.png").write_bytes(b"this is not a png")
        elif kind == "dir-as-file":
            digit_folder(bad, [5, 6])
            (bad / "6" / "x.png").mkdir()
    return setup


def certificate_folder(missing: str | None = None) -> Callable[[Path], None]:
    """``{tmp}/certs`` as ``deploy certs`` made it (a CA, a server and an operator certificate),
    less the file ``missing``."""
    def setup(tmp: Path) -> None:
        from fedvls_flwr.deploy.certs import make_certificates

        make_certificates(tmp / "certs", ["127.0.0.1"], ["node-0"])
        if missing is not None:
            (tmp / "certs" / missing).unlink()
    return setup


def finished_runs(damage: str | None = None) -> Callable[[Path], None]:
    """``{tmp}/runs`` with a finished FedAvg and a finished FedVLS run (3 rounds each, written as
    the server writes them); ``damage``: the FedVLS run's rounds.jsonl lost its last line
    ("last-line") or is gone ("missing")."""
    import json

    def setup(tmp: Path) -> None:
        for method, accuracies in (("fedavg", [0.1, 0.5, 0.7, 0.8]), ("fedvls", [0.1, 0.4, 0.6, 0.65])):
            run = tmp / "runs" / method
            run.mkdir(parents=True)
            config = {"method": method, "dataset": "digits", "partition": "dirichlet", "dirichlet-beta": 0.05,
                      "seed": 0, "num-server-rounds": 3, "run-name": method}
            rounds = [{"round": r, "accuracy": a} for r, a in enumerate(accuracies)]
            (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
            (run / "summary.json").write_text(json.dumps({
                "config": config, "status": "completed", "rounds_completed": 3, "best_accuracy": max(accuracies),
                "best_round": 3, "final_accuracy": accuracies[-1], "final_round": 3}))
        lost = tmp / "runs" / "fedvls" / "rounds.jsonl"
        if damage == "missing":
            lost.unlink()
        elif damage == "last-line":
            lost.write_text("".join(lost.read_text().splitlines(keepends=True)[:-1]))
    return setup


#: Run-folder locks that a case's setup holds while its command runs (this process ends them).
_HELD: list = []
#: The command a held folder's lock names (a fixed one: the page reads the same on every machine).
HOLDER_COMMAND = "python -m fedvls_flwr run --run-config \"output-dir='<tmp>/runs' run-name='going'\""


def held_run_folder(name: str, rounds: int) -> Callable[[Path], None]:
    """A run folder stopped after ``rounds`` rounds (:func:`run_folder`) that a run holds now: its
    lock taken by this process, naming :data:`HOLDER_COMMAND`."""
    import json
    import socket
    import time

    def setup(tmp: Path) -> None:
        from fedvls_flwr.app.results import LOCK_FILE, RunFolderLock

        run_folder(name, rounds)(tmp)
        run_dir = tmp / "runs" / name
        _HELD.append(RunFolderLock(run_dir).acquire())
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        (run_dir / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                     "started": started, "command": HOLDER_COMMAND}) + "\n")
    return setup


def stale_lock_run_folder(name: str, rounds: int) -> Callable[[Path], None]:
    """A run folder stopped after ``rounds`` rounds whose run was killed while it held the folder:
    its ``run.lock`` names a process that has ended."""
    import json
    import socket
    import subprocess
    import sys

    def setup(tmp: Path) -> None:
        from fedvls_flwr.app.results import LOCK_FILE

        run_folder(name, rounds)(tmp)
        ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                               text=True, check=True)
        (tmp / "runs" / name / LOCK_FILE).write_text(json.dumps({
            "pid": int(ended.stdout), "host": socket.gethostname(), "started": "2026-11-27 10:00:00 UTC",
            "command": HOLDER_COMMAND}) + "\n")
    return setup


def no_ray(tmp: Path) -> None:
    """A ``ray`` package that cannot be imported, for ``PYTHONPATH={tmp}/shadow`` (Ray missing or broken)."""
    write_file("shadow/ray/__init__.py", "raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")(tmp)


def same_seed_on_both_engines(tmp: Path) -> None:
    """``{tmp}/runs``: FedAvg seed 0 finished by the in-process engine, by Flower's simulation and by
    a version that did not record its engine (the same accuracy: the same experiment), and seed 1."""
    finished_runs()(tmp)
    import json
    import shutil

    source = tmp / "runs" / "fedavg"
    for name, engine in (("fedavg-inprocess", "inprocess"), ("fedavg-simulation", "simulation"), ("fedavg-old", None)):
        shutil.copytree(source, tmp / "runs" / name)
        summary = json.loads((tmp / "runs" / name / "summary.json").read_text())
        if engine is not None:
            summary["engine"] = engine
        (tmp / "runs" / name / "summary.json").write_text(json.dumps(summary))
    shutil.rmtree(source)
    shutil.rmtree(tmp / "runs" / "fedvls")
