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


def test_flowers_empty_exit_line_is_dropped_and_every_other_line_kept(flower_log):
    """Flower's exit message of a run that ended well is an empty INFO line (flwr_exit, code 0);
    a failed run's has text. Only the empty one is dropped, in the ServerApp's process."""
    import fedvls_flwr.app.server_app  # noqa: F401 - installs the filter, as Flower's loading of the app does

    logger = logging.getLogger("flwr")
    logger.setLevel(logging.DEBUG)
    logger.info("")
    logger.error("Exit Code: 700\nSimulation failed")
    logger.info("round 1/3: accuracy 0.5")
    logger.warning("")
    assert flower_log == ["Exit Code: 700\nSimulation failed", "round 1/3: accuracy 0.5", ""]


def test_outside_a_ray_actor_nothing_is_quietened(flower_log):
    from fedvls_flwr.app.known_warnings import ACTOR_TERMINATION, in_ray_actor, quiet_in_ray_actors
    from fedvls_flwr.data import node_data

    said = list(node_data._SAID)
    quiet_in_ray_actors()
    assert not in_ray_actor() and node_data._SAID == said
    logging.getLogger("flwr").warning(ACTOR_TERMINATION, "ClientAppActor")
    assert flower_log == ["Manually terminating ClientAppActor"]


@pytest.mark.e2e
def test_in_a_ray_actor_flowers_termination_warning_and_the_node_data_lines_are_quiet(tmp_path):
    """In a real Ray actor (a local Ray in a child process): after the ClientApp module is
    imported there, Flower's "Manually terminating" warning is dropped and the node-data lines
    go to DEBUG (Ray holds similar lines back and prints them after the run's last line)."""
    script = tmp_path / "actor.py"
    script.write_text(
        "import logging, sys, ray\n"
        "ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=sys.argv[1])\n"
        "@ray.remote\n"
        "class Actor:\n"
        "    def look(self):\n"
        "        import fedvls_flwr.app.client_app\n"
        "        from fedvls_flwr.app.known_warnings import ACTOR_TERMINATION, in_ray_actor\n"
        "        from fedvls_flwr.data import node_data\n"
        "        kept = []\n"
        "        class Keep(logging.Handler):\n"
        "            def emit(self, record): kept.append(record.getMessage())\n"
        "        logging.getLogger('flwr').addHandler(Keep())\n"
        "        logging.getLogger('flwr').warning(ACTOR_TERMINATION, 'ClientAppActor')\n"
        "        logging.getLogger('flwr').warning('something else')\n"
        "        return in_ray_actor(), bool(node_data._SAID), kept\n"
        "print(ray.get(Actor.remote().look.remote()))\n"
        "ray.shutdown()\n")
    from fedvls_flwr.ops.ray_cluster import short_temp_dir

    temp = short_temp_dir()  # Ray's sockets need a short path
    env = {**__import__("os").environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        done = subprocess.run([sys.executable, str(script), str(temp)], capture_output=True, text=True, timeout=300,
                              env=env, cwd=ROOT)
    finally:
        __import__("shutil").rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "(True, True, ['something else'])"
