"""The two warnings of every default run that the user can do nothing about are kept out -
each by its exact cause - and every other warning of Flower and Ray still shows.
(`tests/test_e2e_entry_points.py` checks a whole default run's log.)"""

import ast
import inspect
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from fedvls_flwr.app.known_warnings import RAY_ACCELERATOR_TIP, RAY_WARNING_MODULE
from fedvls_flwr.config.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def flower_log():
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_the_run_strategy_is_a_flower_strategy_and_building_it_logs_nothing(flower_log):
    """The run strategy derives from Flower's Strategy base, not FedAvg: no FedAvg setting, so
    none of FedAvg's warnings about them (e.g. "fraction_evaluate is set to 0.0"); Flower's own
    warnings still reach the log."""
    from flwr.serverapp.strategy import FedAvg, Strategy

    from fedvls_flwr.app.strategy import RunStrategy

    strategy = RunStrategy(RunConfig())
    assert isinstance(strategy, Strategy) and not isinstance(strategy, FedAvg)
    assert flower_log == []
    FedAvg(fraction_train=0.0)  # a warning of the same logger: still said
    assert "fraction_train is set to 0.0. Federated training will be skipped." in flower_log


def test_rays_accelerator_tip_is_hidden_by_its_text_and_rays_other_warnings_still_show():
    import ray._private.worker

    texts = [n.value for n in ast.walk(ast.parse(inspect.getsource(ray._private.worker)))
             if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert any(t.startswith(RAY_ACCELERATOR_TIP) for t in texts)  # the text this Ray warns with, still
    code = (
        "import warnings\n"
        "import client_app  # what Flower loads before it starts Ray\n"
        f"tip = {RAY_ACCELERATOR_TIP!r} + ' if num_gpus=0 or num_gpus=None (default).'\n"
        f"warnings.warn_explicit(tip, FutureWarning, 'worker.py', 2051, module={RAY_WARNING_MODULE!r})\n"
        f"warnings.warn_explicit('another Ray FutureWarning', FutureWarning, 'worker.py', 2060, module={RAY_WARNING_MODULE!r})\n"
        f"warnings.warn_explicit(tip, UserWarning, 'worker.py', 2070, module={RAY_WARNING_MODULE!r})\n"
        "warnings.warn_explicit(tip, FutureWarning, 'other.py', 1, module='ray.other')\n"
    )
    err = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stderr
    lines = [line for line in err.splitlines() if "Warning:" in line]
    assert lines == [
        "worker.py:2060: FutureWarning: another Ray FutureWarning",
        f"worker.py:2070: UserWarning: {RAY_ACCELERATOR_TIP} if num_gpus=0 or num_gpus=None (default).",
        f"other.py:1: FutureWarning: {RAY_ACCELERATOR_TIP} if num_gpus=0 or num_gpus=None (default).",
    ], err
