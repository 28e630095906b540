"""The Flower ServerApp (thin): validate the run config, run the experiment.

Flower loads it as ``server_app:app`` (pyproject's ``[tool.flwr.app.components]``) from the
top-level ``server_app.py`` of the app folder, which only re-exports it: the installed
package claims no top-level name but its own (an app folder may also name
``fedvls_flwr.app.server_app:app`` directly, docs/contributing.md)."""

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedvls_flwr.app.known_warnings import drop_empty_exit_line
from fedvls_flwr.app.memory import keep_freed_memory
from fedvls_flwr.app.results import check_resume_target
from fedvls_flwr.app.tracking import check_tracking
from fedvls_flwr.config.run_config import parse_run_config  # no torch: a bad value fails before any heavy import

#: The ServerApp Context's record of the run it ran.
RUN_RECORD = "fedvls-run"

drop_empty_exit_line()  # Flower's empty exit line after a run that ended well (app/known_warnings.py)
keep_freed_memory()  # a round's large buffers reused, not faulted in again (app/memory.py)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = parse_run_config(dict(context.run_config))
    check_tracking(cfg)  # e.g. tracking='tensorboard' without the package: said now, not in round 1
    check_resume_target(cfg)  # resume=true of a run folder that does not exist: said now, not a silent new run
    from fedvls_flwr.app.server import run_experiment

    run_dir = run_experiment(grid, cfg, context.run_id)
    # what the ServerApp leaves in its Context: where the run went (read by the in-process engine)
    context.state[RUN_RECORD] = ConfigRecord({"run-dir": str(run_dir)})
