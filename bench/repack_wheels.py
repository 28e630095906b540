"""The wheels an offline GPU machine gets (``bench/gpu_wheels.sh`` downloads them, this picks and
repacks them): every downloaded wheel except the packages the machine's Python already has, and
Ray repacked without what a Flower simulation never loads (its Java jars, RLlib, Serve, Tune,
Train, Data, LLM, the dashboard's web client) with its binaries stripped, so that the checkout
and the wheels fit the device tool's 64 MiB transfer.

    python bench/repack_wheels.py DOWNLOADED_DIR OUT_DIR [--host-packages bench/gpu_host_packages.txt]

A repacked wheel keeps every file's mode: Ray starts ``gcs_server`` and ``raylet`` as programs,
and a wheel whose entries lost their executable bit installs them as plain files (Ray then fails
with "Permission denied" when a simulation starts; ``zipfile.extractall`` drops the modes, which
is how the first version of this step broke the Ray part of the GPU session).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: What a Flower simulation never loads from Ray (folders under ``ray/``).
RAY_UNUSED = ("jars", "rllib", "dashboard/client", "data", "serve", "tune", "train", "llm")


def project_name(wheel: Path) -> str:
    """A wheel's project name, normalised as pip compares them (``Foo_Bar-1.0-...`` -> ``foo-bar``)."""
    return re.split(r"-\d", wheel.name)[0].lower().replace("_", "-")


def host_packages(path: Path | None) -> set[str]:
    """The packages the machine's Python has (names separated by commas or lines; ``#`` comments)."""
    if path is None:
        return set()
    lines = [line for line in Path(path).read_text().splitlines() if not line.lstrip().startswith("#")]
    return {n.strip().lower().replace("_", "-") for n in re.split(r"[,\n]", "\n".join(lines)) if n.strip()}


def _mode(member: zipfile.ZipInfo) -> int:
    return (member.external_attr >> 16) & 0o777


def _executables(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {m.filename for m in z.infolist() if not m.is_dir() and _mode(m) & 0o111}


def unpack(wheel: Path, into: Path) -> None:
    """``wheel``'s files under ``into``, each with the mode the wheel gives it."""
    with zipfile.ZipFile(wheel) as z:
        for member in z.infolist():
            extracted = Path(z.extract(member, into))
            if not member.is_dir() and _mode(member):
                extracted.chmod(_mode(member))


def _record_rows(unpacked: Path, record: str) -> list[tuple[str, str, object]]:
    rows: list[tuple[str, str, object]] = []
    for p in sorted(unpacked.rglob("*")):
        rel = p.relative_to(unpacked).as_posix()
        if p.is_file() and rel != record:
            digest = base64.urlsafe_b64encode(hashlib.sha256(p.read_bytes()).digest()).rstrip(b"=").decode()
            rows.append((rel, f"sha256={digest}", p.stat().st_size))
    rows.append((record, "", ""))
    return rows


def repack_ray(wheel: Path, out_dir: Path, drop: tuple[str, ...] = RAY_UNUSED) -> Path:
    """Ray's ``wheel`` again in ``out_dir`` without the folders ``drop`` names, its binaries
    stripped, its RECORD rewritten; raises RuntimeError when a program it kept lost its mode."""
    with tempfile.TemporaryDirectory(prefix="repack-") as tmp:
        unpacked = Path(tmp)
        unpack(wheel, unpacked)
        for folder in drop:
            shutil.rmtree(unpacked / "ray" / folder, ignore_errors=True)
        binaries = [p for p in unpacked.rglob("*") if p.is_file() and (p.suffix == ".so" or os.access(p, os.X_OK))]
        if binaries and shutil.which("strip"):
            subprocess.run(["strip", "--strip-unneeded", *map(str, binaries)], check=False, stderr=subprocess.DEVNULL)
        info = next(unpacked.glob("*.dist-info"))
        record = f"{info.name}/RECORD"
        with open(info / "RECORD", "w", newline="") as fh:
            csv.writer(fh).writerows(_record_rows(unpacked, record))
        out = Path(out_dir) / wheel.name
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
            for p in sorted(unpacked.rglob("*")):
                if p.is_file():
                    z.write(p, p.relative_to(unpacked).as_posix())  # the file's mode goes into the entry
    kept = {name for name in _executables(wheel) if not any(name.startswith(f"ray/{d}/") for d in drop)}
    if lost := sorted(kept - _executables(out)):
        raise RuntimeError(f"{out.name}: {len(lost)} program(s) lost their executable bit, e.g. {lost[0]}")
    return out


def pick(downloaded: Path, out_dir: Path, host: set[str]) -> list[Path]:
    """Every wheel of ``downloaded`` that the host lacks (and not uv: runtime dependency
    installation stays off) into ``out_dir``, Ray repacked."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for wheel in sorted(Path(downloaded).glob("*.whl")):
        name = project_name(wheel)
        if name in host or name == "uv":
            continue
        if name == "ray":
            written.append(repack_ray(wheel, out_dir))
        else:
            written.append(Path(shutil.copy(wheel, out_dir)))
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("downloaded", type=Path, help="the folder pip downloaded the wheels into")
    ap.add_argument("out", type=Path, help="the folder to write the picked wheels to (.whl)")
    ap.add_argument("--host-packages", type=Path, help="the packages the machine's Python already has")
    args = ap.parse_args()
    written = pick(args.downloaded, args.out, host_packages(args.host_packages))
    print(f"{len(written)} wheels in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
