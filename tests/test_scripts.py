"""Every script in bench/ and scripts/ still imports, and every one with a command line prints
its ``--help``: a refactoring that breaks a benchmark or a tool shows here, not on the day a GPU
is lent (bench/gpu_check.py once failed at import for months). In this process: the modules
are imported once and ``main()`` runs with ``--help`` as its command line (argparse exits 0)."""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for folder in ("bench", "scripts") for p in (ROOT / folder).glob("*.py"))


def _has_command_line(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


@pytest.mark.parametrize("path", SCRIPTS, ids=[f"{p.parent.name}/{p.name}" for p in SCRIPTS])
def test_script_imports_and_prints_its_help(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(f"{path.parent.name}.{path.stem}")
    if not _has_command_line(path):
        return  # a module the scripts import: importing it is the check
    assert hasattr(module, "main"), f"{path.name} runs something as a script but has no main()"
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        module.main()
    assert exit_info.value.code in (0, None), f"{path.name} --help exited with {exit_info.value.code}"
    assert "usage:" in out.getvalue(), f"{path.name} --help printed no usage"


def test_every_script_is_covered() -> None:
    """The list above is read from the folders: a new script is checked without being named."""
    names = {p.name for p in SCRIPTS}
    assert {"gpu_check.py", "gpu_step.py", "bench_engine.py", "fixed_seed_accuracies.py"} <= names


@pytest.mark.e2e
def test_the_gpu_step_bench_rehearses_on_the_cpu(tmp_path: Path) -> None:
    """bench/gpu_step.py waits for a lent GPU; its CPU rehearsal runs every path of it (the
    step, the augmentation, a round on the in-process engine with its client processes) so a
    change elsewhere cannot break it unseen - as a workers' change once did (the workers did not
    accept the generated CIFAR files)."""
    import json
    import subprocess

    out = tmp_path / "gpu-step.json"
    proc = subprocess.run([sys.executable, "bench/gpu_step.py", "--cpu", "--quick", "--models", "cnn", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["round"]["round_s"] > 0 and results["round"]["clients_training_s"] > 0, results["round"]


@pytest.mark.e2e
@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "MNIST" / "raw").is_dir(), reason="../shared/data/MNIST absent")
def test_the_head_round_bench_leaves_no_temporary_folder(tmp_path: Path) -> None:
    """bench/head_round_phases.py prints a table, not its run's folder: it removes that folder
    (a /tmp/head-round-phases-* was left by every measurement)."""
    import os
    import subprocess

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "bench/head_round_phases.py", "--head-rounds", "3"], cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp.iterdir()) == []



#: (script, what its main() calls first that the test makes fail, its command line after the script)
WORK_FOLDERS = [
    ("bench/bench_engine.py", "sweep", ["--only", "sweep"]),
    ("bench/bench_deploy.py", "bare_app", []),
    ("bench/bench_clientapp.py", "prepare", []),
    ("scripts/fixed_seed_accuracies.py", "fedvls_flwr.ops.launch.LocalSuperLink", ["{out}"]),
    ("bench/bench_round.py", "LocalSuperLink", ["--variants", "app", "--output-dir", "{out}"]),
    ("bench/gpu_check.py", "write_tiny_cifar10", ["--cpu"]),  # its data folder was kept after an error
    ("bench/bench_gpu_workers.py", "write_tiny_cifar10", ["--cpu"]),
]


@pytest.mark.parametrize(("script", "first", "argv"), WORK_FOLDERS, ids=[w[0] for w in WORK_FOLDERS])
def test_a_bench_removes_its_temporary_folders_when_a_run_fails(
    script: str, first: str, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """These print tables or JSON, never the folders they make with tempfile (runs, a SuperLink's
    home, a data cache): they remove them, on a failure too (/tmp/bench-engine-* were left). The
    run is stubbed: its first step fails."""
    import tempfile

    def fails(*args: object, **kwargs: object) -> None:
        raise SystemExit("a run failed")

    module = importlib.import_module(script.removesuffix(".py").replace("/", "."))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    if "." in first:
        monkeypatch.setattr(first, fails)  # imported by main() from its module
    else:
        monkeypatch.setattr(module, first, fails)
    monkeypatch.setattr(sys, "argv", [script, *(a.replace("{out}", str(tmp_path / "out")) for a in argv)])
    with pytest.raises(SystemExit, match="a run failed"):
        module.main()
    assert sorted(p.name for p in temp.iterdir()) == []


def test_the_gpu_steps_round_gives_its_clients_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/gpu_step.py's round on CUDA: its clients are given the GPU (client-resources-num-gpus).
    Without it the in-process engine plans a worker that sees no GPU and the server refuses the
    run (device = 'cuda' but 4 of 4 clients see no CUDA device) - found by reading the code, as
    the step has never run on a GPU. The plan is asked of this machine's shape with one GPU."""
    import torch

    import fedvls_flwr.ops.inprocess as inprocess
    from bench.gpu_step import engine_round
    from fedvls_flwr.ops.resources import Machine

    asked: dict = {}

    class Planned(Exception):
        pass

    def plan_only(settings, num_supernodes, **kwargs):
        asked["plan"] = inprocess.client_plan(settings, num_supernodes, kwargs.get("client_cpus", 1.0),
                                              kwargs.get("client_gpus", 0.0), machine=Machine(16, ((0, 1.0),)),
                                              workers=kwargs.get("workers"))
        raise Planned

    monkeypatch.setattr(inprocess, "run_in_process", plan_only)
    monkeypatch.setattr("bench.cifar_shim.cifar_env", lambda folder, sums: {})  # it patches this process for good
    with pytest.raises(Planned):
        engine_round(torch.device("cuda"), 8, tmp_path)
    assert asked["plan"].devices == ((0,),), asked["plan"]
