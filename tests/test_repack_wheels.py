"""The wheels the offline GPU machine installs (bench/repack_wheels.py): Ray repacked must install
its programs as programs. The first version unpacked Ray with ``zipfile.extractall``, which drops
file modes: ``gcs_server`` and ``raylet`` arrived as plain files and the Ray part of the GPU
session would have failed with "Permission denied" (found in a rehearsal of that session here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.repack_wheels import host_packages, pick, project_name, repack_ray

PROGRAM = "ray/core/src/ray/gcs/gcs_server"


def _entry(z: zipfile.ZipFile, name: str, data: bytes, mode: int) -> None:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFREG | mode) << 16
    z.writestr(info, data)


def fake_ray_wheel(folder: Path) -> Path:
    """A small wheel shaped like Ray's: a program, a module, a folder a simulation never loads."""
    wheel = folder / "ray-2.55.1-py3-none-any.whl"
    info = "ray-2.55.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        _entry(z, PROGRAM, b"#!/bin/sh\necho gcs\n", 0o755)
        _entry(z, "ray/__init__.py", b"VERSION = '2.55.1'\n", 0o644)
        _entry(z, "ray/rllib/algorithm.py", b"x = 1\n", 0o644)
        _entry(z, "ray/rllib/tool", b"#!/bin/sh\n", 0o755)
        _entry(z, f"{info}/METADATA", b"Metadata-Version: 2.1\nName: ray\nVersion: 2.55.1\n", 0o644)
        _entry(z, f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\n"
               b"Tag: py3-none-any\n", 0o644)
        _entry(z, f"{info}/RECORD", b"", 0o644)
    return wheel


def test_repacked_ray_keeps_its_programs_and_drops_what_a_simulation_never_loads(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    out = repack_ray(fake_ray_wheel(tmp_path / "in"), tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        names = {m.filename: (m.external_attr >> 16) & 0o777 for m in z.infolist()}
        record = z.read("ray-2.55.1.dist-info/RECORD").decode()
    assert names[PROGRAM] & 0o111, oct(names[PROGRAM])
    assert not names["ray/__init__.py"] & 0o111
    assert not any(n.startswith("ray/rllib/") for n in names)
    assert f"{PROGRAM},sha256=" in record and "ray/__init__.py,sha256=" in record and "rllib" not in record


def test_pip_installs_the_repacked_program_executable(tmp_path: Path) -> None:
    """What the GPU machine does with it: ``pip install --no-index --no-deps`` (bench/gpu_env.sh)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    out = repack_ray(fake_ray_wheel(tmp_path / "in"), tmp_path / "out")
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--disable-pip-version-check", "--target", str(target), str(out)],
                          capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert proc.returncode == 0, proc.stderr[-2000:]
    program = target / PROGRAM
    assert os.access(program, os.X_OK), oct(program.stat().st_mode)
    assert subprocess.run([str(program)], capture_output=True, text=True).stdout == "gcs\n"


def test_a_program_that_loses_its_mode_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check after repacking: a Ray whose programs would install as plain files is not written
    silently (the unpacking that dropped the modes, put back)."""
    import bench.repack_wheels as repack

    def extract_all(wheel: Path, into: Path) -> None:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(into)

    monkeypatch.setattr(repack, "unpack", extract_all)
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    with pytest.raises(RuntimeError, match="lost their executable bit"):
        repack_ray(fake_ray_wheel(tmp_path / "in"), tmp_path / "out")


def test_pick_leaves_out_what_the_host_has_and_uv(tmp_path: Path) -> None:
    downloaded, out = tmp_path / "all", tmp_path / ".whl"
    downloaded.mkdir()
    fake_ray_wheel(downloaded)
    for name in ("flwr-1.41.0-py3-none-any.whl", "Typing_Extensions-4.0-py3-none-any.whl",
                 "uv-0.9-py3-none-manylinux_2_17_x86_64.whl"):
        with zipfile.ZipFile(downloaded / name, "w") as z:
            z.writestr("x.py", "")
    hosts = tmp_path / "host.txt"
    hosts.write_text("# the image's packages\ntyping-extensions, numpy\n")
    assert host_packages(hosts) == {"typing-extensions", "numpy"}
    assert project_name(downloaded / "Typing_Extensions-4.0-py3-none-any.whl") == "typing-extensions"
    written = sorted(p.name for p in pick(downloaded, out, host_packages(hosts)))
    assert written == ["flwr-1.41.0-py3-none-any.whl", "ray-2.55.1-py3-none-any.whl"]
