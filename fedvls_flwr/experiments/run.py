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
of them, each with num-cpus torch threads unless the run config's ``torch-threads`` sets
them; Flower's defaults 2 and 0), ``init-args-num-cpus`` / ``init-args-num-gpus`` (the
machine's size as Ray would take it).

Exit status: 0 the run completed; 1 it failed (the message says why and what is saved);
2 the input was refused before anything ran.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fedvls_flwr.config.args import parse_run_config_args
from fedvls_flwr.config.run_config import ConfigError, did_you_mean
from fedvls_flwr.experiments.check import check_run_config

#: Simulation settings the in-process engine reads, with their defaults (Flower's).
ENGINE_FEDERATION: dict[str, Any] = {"num-supernodes": 10, "client-resources-num-cpus": 2.0,
                                     "client-resources-num-gpus": 0.0, "init-args-num-cpus": None,
                                     "init-args-num-gpus": None}
#: Settings of Flower's Ray simulation with no meaning without Ray (accepted, said once).
RAY_ONLY = ("init-args-logging-level", "init-args-log-to-driver")


def engine_federation(federation: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The engine's federation settings out of ``--federation-config``'s, or ConfigError."""
    out = dict(ENGINE_FEDERATION)
    for key, value in federation.items():
        if key in RAY_ONLY:
            notes.append(f"note: --federation-config {key} is a setting of Ray's logging; the in-process engine "
                         "has no Ray and ignores it")
            continue
        if key not in out:
            raise ConfigError(f"--federation-config: unknown key '{key}'{did_you_mean(key, [*out, *RAY_ONLY])}; "
                              f"the in-process engine reads {', '.join(ENGINE_FEDERATION)}")
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if key == "num-supernodes" and (not isinstance(number, int) or number < 1):
            raise ConfigError(f"--federation-config: num-supernodes = {value!r} must be a whole number >= 1 "
                              "(the simulated nodes, one partition each), e.g. num-supernodes=10")
        if key == "client-resources-num-cpus" and (number is None or number <= 0):
            raise ConfigError(f"--federation-config: client-resources-num-cpus = {value!r} must be a number > 0 "
                              "(the CPUs, and torch threads, each client gets), e.g. client-resources-num-cpus=1")
        if key == "client-resources-num-gpus" and (number is None or number < 0):
            raise ConfigError(f"--federation-config: client-resources-num-gpus = {value!r} must be a number >= 0 "
                              "(the share of a GPU each client gets), e.g. client-resources-num-gpus=0.25")
        if key.startswith("init-args-num-") and (not isinstance(number, int) or number < 0):
            raise ConfigError(f"--federation-config: {key} = {value!r} must be a whole number >= 0 "
                              "(what Ray takes as this machine's size)")
        out[key] = value
    return out


def machine_for(federation: dict[str, Any]) -> Any:
    """This machine as the engine's federation settings size it (init-args-num-* as Ray takes them)."""
    from fedvls_flwr.ops.resources import detect_machine

    return detect_machine({k: v for k, v in federation.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedvls run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", action="append", default=[], metavar="STR_OR_TOML",
                        help="as for flwr run: 'key=value ...' or a .toml file (repeatable)")
    parser.add_argument("--federation-config", action="append", default=[], metavar="STR",
                        help="'num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.25' "
                             "(Flower's defaults: 10 nodes, 2 CPUs and no GPU per client): the clients of a round "
                             "train at once on as many worker processes as the machine holds at that size")
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
        machine = machine_for(federation)
        from fedvls_flwr.ops.resources import resource_problem

        if problem := resource_problem(float(federation["client-resources-num-cpus"]),
                                       float(federation["client-resources-num-gpus"]), machine):
            raise ConfigError(f"--federation-config: {problem}")  # before the data is loaded
        check_run_config(overrides, int(federation["num-supernodes"]), this_machine=True, warn=notes)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in notes:
        print(line, file=sys.stderr)
    from fedvls_flwr.ops.inprocess import run_in_process

    machine = machine_for(federation)  # again, with torch loaded: the GPUs torch itself sees

    try:
        done = run_in_process(overrides, int(federation["num-supernodes"]),
                              client_cpus=float(federation["client-resources-num-cpus"]),
                              client_gpus=float(federation["client-resources-num-gpus"]),
                              workers=args.workers, machine=machine)
    except ConfigError as err:  # the machine cannot serve the config (said before any round)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the ServerApp's own message (what is saved, how to go on)
        print(f"error: the run failed: {err}", file=sys.stderr)
        return 1
    print(f"done: {done.run_dir} ({done.seconds:.1f} s; the clients computed {done.client_seconds:.1f} s on "
          f"{done.workers.split(':')[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
