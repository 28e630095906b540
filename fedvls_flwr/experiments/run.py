"""Run one experiment in this process: the app's ServerApp and ClientApp on the in-process engine.

    fedvls run --run-config "method='fedavg' dataset='mnist10k' data-dir='~/fedvls-data'" \\
        --federation-config "num-supernodes=10"

The same apps, run folder, checkpoints, resume, tracking, progress and refusals as
``flwr run .``, and with ``deterministic = true`` the same rounds bit for bit; without a
SuperLink, a SuperExec or Ray (docs/running.md, "Which engine"). The run config is checked
as ``fedvls check`` checks it, before any round; ``--federation-config`` takes the
simulation's settings that mean something in one process: ``num-supernodes`` (default 10)
and ``client-resources-num-cpus`` (torch threads per client, as Ray's actors get them;
Flower's default 2, unless the run config's ``torch-threads`` sets them).

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

#: Simulation settings the in-process engine reads, with their defaults.
ENGINE_FEDERATION = {"num-supernodes": 10, "client-resources-num-cpus": 2.0}
#: Settings of Flower's Ray simulation with no meaning in one process (accepted, said once).
RAY_ONLY = ("client-resources-num-gpus", "init-args-num-cpus", "init-args-num-gpus", "init-args-logging-level",
            "init-args-log-to-driver")


def engine_federation(federation: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The engine's federation settings out of ``--federation-config``'s, or ConfigError."""
    out = dict(ENGINE_FEDERATION)
    for key, value in federation.items():
        if key in RAY_ONLY:
            notes.append(f"note: --federation-config {key} is a setting of Flower's Ray simulation; the in-process "
                         "engine runs every client in this process (on the GPU when torch sees one: device='cpu' "
                         "keeps them on the CPU) and ignores it")
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
                              "(the torch threads each client gets), e.g. client-resources-num-cpus=1")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedvls run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", action="append", default=[], metavar="STR_OR_TOML",
                        help="as for flwr run: 'key=value ...' or a .toml file (repeatable)")
    parser.add_argument("--federation-config", action="append", default=[], metavar="STR",
                        help="'num-supernodes=10 client-resources-num-cpus=1' (defaults: 10 nodes, 2 threads each)")
    args = parser.parse_args(argv)
    notes: list[str] = []
    try:
        overrides = parse_run_config_args(args.run_config)
        federation = engine_federation(parse_run_config_args(args.federation_config, "--federation-config"), notes)
        check_run_config(overrides, int(federation["num-supernodes"]), this_machine=True, warn=notes)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in notes:
        print(line, file=sys.stderr)
    from fedvls_flwr.app.results import RunFolderBusy
    from fedvls_flwr.ops.inprocess import run_in_process

    try:
        done = run_in_process(overrides, int(federation["num-supernodes"]),
                              client_cpus=float(federation["client-resources-num-cpus"]))
    except RunFolderBusy as err:  # another run took the folder after the check above: nothing was written
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the ServerApp's own message (what is saved, how to go on)
        print(f"error: the run failed: {err}", file=sys.stderr)
        return 1
    print(f"done: {done.run_dir} ({done.seconds:.1f} s, {done.client_seconds:.1f} s of it in the clients)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
