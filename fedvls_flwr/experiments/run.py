"""Run one experiment in this process: the app's ServerApp and ClientApp on the in-process engine.

    fedvls run --run-config "method='fedavg' dataset='mnist10k' data-dir='~/fedvls-data'" \\
        --federation-config "num-supernodes=10"

The same apps, run folder, checkpoints, resume, tracking, progress and refusals as
``flwr run .``, and with ``deterministic = true`` the same rounds bit for bit; without a
SuperLink, a SuperExec or Ray (docs/running.md, "Which engine"). The run config is checked
as ``fedvls check`` checks it, before any round; ``--federation-config`` takes the
simulation's settings as Ray reads them: ``num-supernodes`` (default 10),
``client-resources-num-cpus`` and ``client-resources-num-gpus`` (each client's CPUs and share
of a GPU: a round's clients train at once on as many worker processes as the machine holds
of them, each with num-cpus torch threads when the run config's ``torch-threads`` is 0 - its
default, 1, gives every client one thread; Flower's defaults 2 and 0), ``init-args-num-cpus`` /
``init-args-num-gpus`` (the machine's size as Ray would take it). A federation that ``flwr run``
could not start (a GPU share where there is no GPU, more CPUs per client than this machine has)
is refused here too.

Results go to ``output-dir``/``run-name`` (default ``~/fedvls-runs/<dataset>-<method>-...-<time>``);
``resume=true`` with the same ``run-name`` continues a stopped run after its last saved round.
Ctrl-C (or ``kill``) stops it after saying what is kept and the command that continues.

Exit status: 0 the run completed; 1 it failed (the message says why and what is saved);
2 the input was refused before anything ran; 130 stopped by Ctrl-C, 143 by SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fedvls_flwr.config.args import parse_run_config_args
from fedvls_flwr.config.federation_config import SIMULATION_KEYS
from fedvls_flwr.config.run_config import ConfigError, did_you_mean
from fedvls_flwr.experiments.check import check_run_config
from fedvls_flwr.ops.resources import Machine, detect_machine, resource_problem

#: Simulation settings the in-process engine reads, with their defaults (Flower's, but 10 nodes: Flower's is 2).
ENGINE_FEDERATION: dict[str, Any] = {"num-supernodes": 10, "client-resources-num-cpus": 2.0,
                                     "client-resources-num-gpus": 0.0, "init-args-num-cpus": None,
                                     "init-args-num-gpus": None}
#: Settings of Flower's Ray simulation with no meaning without Ray (accepted, said once).
RAY_ONLY = ("init-args-logging-level", "init-args-log-to-driver")


def engine_federation(federation: dict[str, Any], notes: list[str], machine: Machine | None = None) -> dict[str, Any]:
    """The engine's federation settings out of ``--federation-config``'s, or ConfigError: the
    keys and values ``flwr run`` takes, and clients that fit ``machine`` (default: this one, as
    :func:`machine_for` sees it) as they would under Flower's simulation
    (:func:`~fedvls_flwr.ops.resources.resource_problem`, the rule ``fedvls check`` applies)."""
    from fedvls_flwr.config.federation_config import check_federation_config

    out = dict(ENGINE_FEDERATION)
    for key in federation:
        if key not in ENGINE_FEDERATION and key not in RAY_ONLY and key in SIMULATION_KEYS:
            notes.append(f"note: --federation-config {key} is a setting of Flower's simulation runtime; the "
                         "in-process engine ignores it")
        elif key not in out and key not in RAY_ONLY:
            raise ConfigError(f"--federation-config: unknown key '{key}'{did_you_mean(key, [*out, *RAY_ONLY])}; "
                              f"the in-process engine reads {', '.join(ENGINE_FEDERATION)}")
    check_federation_config(federation)  # the types and ranges flwr run takes (integers of CPUs, >= 1 node)
    for key, value in federation.items():
        if key in RAY_ONLY:
            notes.append(f"note: --federation-config {key} is a setting of Ray's logging; the in-process engine "
                         "has no Ray and ignores it")
        elif key in out:
            out[key] = value
    machine = machine or machine_for(out)
    if (problem := resource_problem(float(out["client-resources-num-cpus"]), float(out["client-resources-num-gpus"]),
                                    machine)) is not None:
        raise ConfigError(problem)  # before the data is loaded
    return out


def machine_for(federation: dict[str, Any]) -> Machine:
    """This machine as the engine's federation settings size it (init-args-num-* as Ray takes them)."""
    return detect_machine({k: v for k, v in federation.items() if v is not None})


def continue_command(overrides: dict[str, Any], federation_args: list[str], run_name: str) -> str:
    """The ``fedvls run`` command that continues the stopped run in folder ``run_name``: its run
    config with ``resume=true`` and that ``run-name`` (a TOML file's keys written out)."""
    from fedvls_flwr.config.settings import toml_value
    from fedvls_flwr.ops.processes import shell_word

    def literal(value: Any) -> str:  # strings as users type them: 'text' (a TOML literal string)
        return f"'{value}'" if isinstance(value, str) and "'" not in value and "\n" not in value else toml_value(value)

    items = {**overrides, "resume": True, "run-name": run_name}
    run_config = " ".join(f"{key}={literal(value)}" for key, value in items.items())
    words = ["fedvls", "run", "--run-config", shell_word(run_config)]
    for text in federation_args:
        words += ["--federation-config", shell_word(text)]
    return " ".join(words)


def kept_after_stop(overrides: dict[str, Any], federation_args: list[str]) -> str:
    """What an interrupted run keeps, and the command that continues it."""
    from fedvls_flwr.app.results import STATE_FILE, RunFolderLock

    run_dir = RunFolderLock.last_taken
    if run_dir is None:
        return "no round had started: nothing to keep; the same command starts the run again"
    try:
        saved = int(json.loads((run_dir / STATE_FILE).read_text())["round"])
    except (OSError, ValueError, KeyError, TypeError):
        saved = 0
    again = continue_command(overrides, federation_args, run_dir.name)
    if saved == 0:
        return f"no round had been saved yet in {run_dir}; to start it again: {again}"
    return f"rounds 1-{saved} are saved in {run_dir}; to continue after round {saved}: {again}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedvls run", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-config", action="append", default=[], metavar="STR_OR_TOML",
                        help="as for flwr run: 'key=value ...' or a .toml file; repeatable, each key once "
                             "(fedvls check --help, docs/configuration.md)")
    parser.add_argument("--federation-config", action="append", default=[], metavar="STR",
                        help="'num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.25' "
                             "(defaults: 10 nodes - Flower's own is 2 -, 2 CPUs and no GPU per client): the clients "
                             "of a round train at once on as many worker processes as the machine holds at that size")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="at most N client workers (default: as many as the federation config gives room for; "
                             "1: the clients one after another)")
    args = parser.parse_args(argv)
    notes: list[str] = []
    try:
        if args.workers is not None and args.workers < 1:
            raise ConfigError(f"--workers {args.workers}: give 1 or more (1: the clients one after another)")
        overrides = parse_run_config_args(args.run_config)
        federation = engine_federation(parse_run_config_args(args.federation_config, "--federation-config"), notes)
        check_run_config(overrides, int(federation["num-supernodes"]), this_machine=True, warn=notes, typed=True)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in notes:
        print(line, file=sys.stderr)
    from fedvls_flwr.app.results import RunFolderBusy
    from fedvls_flwr.ops.inprocess import run_in_process
    from fedvls_flwr.ops.processes import say_what_is_kept, stop_signal

    try:
        done = run_in_process(overrides, int(federation["num-supernodes"]),
                              client_cpus=float(federation["client-resources-num-cpus"]),
                              client_gpus=float(federation["client-resources-num-gpus"]),
                              workers=args.workers, machine=machine_for(federation))
    except (RunFolderBusy, ConfigError) as err:  # another run took the folder after the check above, or the
        print(f"error: {err}", file=sys.stderr)  # machine cannot serve the config: nothing was written
        return 2
    except Exception as err:  # noqa: BLE001 - the ServerApp's own message (what is saved, how to go on)
        print(f"error: the run failed: {err}", file=sys.stderr)
        return 1
    except BaseException as stop:  # Ctrl-C, SIGTERM: the fedvls command's one line says what is kept
        if stop_signal(stop) is not None:
            say_what_is_kept(stop, kept_after_stop(overrides, args.federation_config))
        raise
    print(f"done: {done.run_dir} ({done.seconds:.1f} s, {done.client_seconds:.1f} s of it in the clients, on "
          f"{done.workers.split(':')[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
