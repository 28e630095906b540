"""The ``fedvls`` command: one entry point for the tools users type.

    fedvls run    --run-config "..."      one experiment in this process (the in-process engine)
    fedvls check  --run-config "..."      a run config, before flwr run spends anything
    fedvls sweep  conf/PRESET.yaml -o DIR  a preset's runs, resumable, then the report
    fedvls report RUNS_DIR                 tables and plots from finished run folders
    fedvls deploy certs|local|...          certificates, the fence, a one-machine deployment
    fedvls config                          [tool.flwr.app.config] as pyproject.toml must hold it
    fedvls wheelhouse -o DIR               every wheel an offline (GPU) host needs, but its torch
    fedvls --version                       this package's version, with flwr's, torch's and Python's

``python -m fedvls_flwr COMMAND`` is the same. Each command's module is imported only when
it runs, so ``fedvls report`` loads neither torch nor Flower.
"""

from __future__ import annotations

import importlib
import sys

from fedvls_flwr.ops.processes import stopped_cleanly_on_termination

#: command -> (module with ``main(argv) -> int``, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("fedvls_flwr.experiments.run", "run one experiment in this process (no SuperLink, no Ray)"),
    "check": ("fedvls_flwr.experiments.check", "check a run config before submitting it"),
    "sweep": ("fedvls_flwr.experiments.sweep", "run a YAML preset's runs (in-process; --engine flwr: flwr runs), "
                                                "resumable, then tabulate"),
    "report": ("fedvls_flwr.experiments.report", "tables and plots from run folders"),
    "deploy": ("fedvls_flwr.deploy.cli", "certificates, fence and a one-machine deployment"),
    "config": ("fedvls_flwr.config.generate", "print or regenerate what derives from the setting declarations"),
    "wheelhouse": ("fedvls_flwr.deploy.wheelhouse", "download the wheels an offline host needs (all but its torch)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return ("usage: fedvls COMMAND [ARGS...]   (or python -m fedvls_flwr COMMAND)\n"
            "       fedvls --version\n\ncommands:\n" + "\n".join(lines))


def version() -> str:
    """This package's version and the versions of what it runs on (read from the installed
    packages' metadata: nothing is imported), for bug reports and for comparing two machines."""
    import platform
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    def of(name: str) -> str:
        try:
            return installed(name)
        except PackageNotFoundError:
            return "not installed"

    return (f"fedvls-flwr {of('fedvls-flwr')} (flwr {of('flwr')}, torch {of('torch')}, "
            f"Python {platform.python_version()})")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("--version", "-V"):
        print(version())
        return 0
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"fedvls: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    with stopped_cleanly_on_termination(f"fedvls {command}"):  # Ctrl-C during the imports too: one line
        module = importlib.import_module(COMMANDS[command][0])
        return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
