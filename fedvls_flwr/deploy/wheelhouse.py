"""``fedvls wheelhouse``: every wheel an air-gapped host needs, fetched on a machine that has
the internet, for that host's Python version and platform.

    fedvls wheelhouse -o wheelhouse --python-version 3.12            # on a machine with internet
                                                                     # (--with-tests: pytest too)
    pip install --no-index --find-links wheelhouse fedvls-flwr       # on the offline GPU host

torch and torchvision are left out: a GPU host brings the CUDA build of torch that matches
its driver, and pip keeps an installed torch that satisfies the project's range. Add
``--torchvision 0.26.0`` (the release that matches the host's torch) if the host lacks it.
Versions come from the tested lock (``constraints-py311.txt``) where it pins them, so the
host runs what CI ran; ``--no-lock`` takes the newest release in pyproject's ranges instead.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

from fedvls_flwr.config.generate import PROJECT_DIR

LOCK = PROJECT_DIR / "constraints-py311.txt"
#: The host brings these (its own CUDA build).
HOST_PACKAGES = ("torch", "torchvision")
#: Wheel platform tags a current x86_64 Linux accepts (pip matches them exactly when told a platform).
LINUX_X86_64 = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name.lower().replace("_", "-")


def requirements(extras: Sequence[str] = (), pyproject: Path = PROJECT_DIR / "pyproject.toml") -> list[str]:
    """The project's dependencies (and those of ``extras``), less what the host brings."""
    project = tomllib.loads(pyproject.read_text())["project"]
    deps = list(project["dependencies"])
    for extra in extras:
        deps += project["optional-dependencies"][extra]
    return [d for d in deps if _name(d) not in HOST_PACKAGES]


def lock_without_host_packages(lock: Path, dest: Path) -> Path:
    """The lock as a constraints file without torch, torchvision and their CUDA libraries."""
    keep = [
        line for line in lock.read_text().splitlines()
        if line and not line.startswith("#")
        and _name(line.split("==")[0]) not in HOST_PACKAGES
        and not line.lower().startswith(("nvidia-", "cuda-", "triton"))
    ]
    path = dest / "constraints.txt"
    path.write_text("\n".join(keep) + "\n")
    return path


#: Not part of the project's sources: never copied into a wheel build.
_NOT_SOURCES = {".venv", ".git", "build", "outputs", "data", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def build_project_wheel(dest: Path, *pip_args: str) -> Path:
    """The project's own wheel, built from a clean copy of the sources: setuptools keeps a
    ``build/lib`` in the tree it builds, and a module deleted since the last build would
    otherwise ride along in the next wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(PROJECT_DIR, src, ignore=lambda d, names: [
            n for n in names
            if (Path(d) == PROJECT_DIR and n in _NOT_SOURCES) or n == "__pycache__" or n.endswith(".egg-info")
        ])
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *pip_args, "-w", str(dest), str(src)],
                       check=True)
    return max(dest.glob("fedvls_flwr-*.whl"), key=lambda p: p.stat().st_mtime)


def download_commands(
    dest: Path, python_version: str, platforms: Sequence[str], constraints: Path | None, torchvision: str | None,
    extras: Sequence[str] = (),
) -> list[list[str]]:
    """The pip commands for the project's dependencies on the target, and torchvision if asked."""
    pip = [sys.executable, "-m", "pip"]
    target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for platform in platforms:
        target += ["--platform", platform]
    commands = [
        [*pip, "download", "-d", str(dest), *target, *(["-c", str(constraints)] if constraints else []),
         *requirements(extras)],
    ]
    if torchvision:
        commands.append([*pip, "download", "-d", str(dest), *target, "--no-deps", f"torchvision=={torchvision}"])
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedvls wheelhouse", description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("wheelhouse"), help="folder for the wheels (created)")
    ap.add_argument("--python-version", default=f"{sys.version_info[0]}.{sys.version_info[1]}",
                    help="the host's Python, e.g. 3.12 (default: this one)")
    ap.add_argument("--platform", action="append", help=f"wheel platform tag (repeatable; default: {', '.join(LINUX_X86_64)})")
    ap.add_argument("--torchvision", metavar="VERSION", help="also fetch this torchvision (for a host that lacks it)")
    ap.add_argument("--no-lock", action="store_true", help="newest releases in pyproject's ranges, not the tested lock")
    ap.add_argument("--with-tests", action="store_true", help="also the test tools (pytest, ...): for bench/gpu_check.sh")
    args = ap.parse_args(argv)
    if not (PROJECT_DIR / "pyproject.toml").is_file():
        print(f"fedvls wheelhouse: run it from a checkout of the project ({PROJECT_DIR} has no pyproject.toml: "
              "this is an installed copy); git clone the repository, pip install -e . there, and run it again",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    constraints = None if args.no_lock else lock_without_host_packages(LOCK, args.out)
    print("+ the project's wheel", build_project_wheel(args.out).name, flush=True)
    for command in download_commands(args.out, args.python_version, args.platform or LINUX_X86_64, constraints,
                                     args.torchvision, ("test",) if args.with_tests else ()):
        print("+", " ".join(command), flush=True)
        if subprocess.run(command).returncode != 0:
            hint = "" if args.no_lock else " (a pinned version may have no wheel for that Python: try --no-lock)"
            print(f"fedvls wheelhouse: pip failed{hint}", file=sys.stderr)
            return 1
    if constraints is not None:
        constraints.unlink()
    wheels = sorted(args.out.glob("*.whl"))
    print(f"{len(wheels)} wheels in {args.out}; on the host, with its torch installed:\n"
          f"  pip install --no-index --find-links {args.out} fedvls-flwr")
    return 0
