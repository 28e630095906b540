"""What `--help` tells a newcomer: where the sweep runs, what `fedvls run` exits with, where its
results go and how to resume, which federation keys mean nothing in one process, and that the
sweep's --set repeats and --port-range is for --engine flwr (and said to be ignored otherwise)."""

from __future__ import annotations

import pytest

from fedvls_flwr import cli
from fedvls_flwr.experiments import run, sweep


def help_of(main, capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_fedvls_help_says_the_sweep_runs_in_process_by_default(capsys):
    assert cli.main(["--help"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("sweep"))
    assert "in-process" in line and "--engine flwr" in line


def test_fedvls_run_help_gives_exit_codes_results_resume_and_the_client_resources(capsys):
    text = help_of(run.main, capsys)
    for said in ("Exit status: 0 the run completed; 1 it failed", "2 the input was refused", "130 stopped by Ctrl-C",
                 "Results go to output-dir/run-name", "resume=true with the same run-name continues",
                 "client-resources-num-gpus", "init-args-num-gpus", "torch threads when the run config's torch-threads "
                 "is 0", "--workers N", "at most N client workers"):
        assert said in text, said
    assert "(2 threads each)" not in text


def test_fedvls_sweep_help_says_set_repeats_and_port_range_is_for_flwr(capsys):
    text = help_of(sweep.main, capsys)
    assert "override a run-config key in every run; repeatable" in text
    assert "--engine flwr only: take the SuperLink's port" in text


def test_a_port_range_for_the_in_process_engine_is_said_to_be_ignored(capsys):
    assert sweep.main(["conf/mnist10k-dir0.05.yaml", "--dry-run", "--port-range", "20000-20099",
                       "--engine", "inprocess"]) == 0
    assert "note: --port-range is the SuperLink's port range, for --engine flwr; the in-process engine" in \
        capsys.readouterr().err
