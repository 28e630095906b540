"""Flower ServerApp entry point (thin): validate the run config, run the experiment."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedvls_flwr.app.results import check_resume_target
from fedvls_flwr.app.tracking import check_tracking
from fedvls_flwr.config.run_config import parse_run_config  # no torch: a bad value fails before any heavy import

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = parse_run_config(dict(context.run_config))
    check_tracking(cfg)  # e.g. tracking='tensorboard' without the package: said now, not in round 1
    check_resume_target(cfg)  # resume=true of a run folder that does not exist: said now, not a silent new run
    from fedvls_flwr.app.server import run_experiment

    run_experiment(grid, cfg)
