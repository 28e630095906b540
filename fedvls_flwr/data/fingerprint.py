"""What a dataset on a node's disk looks like, as a hash: the files a loader reads (relative path,
size, mtime), so that the node-data cache misses whenever the data change."""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

from fedvls_flwr.data.datasets import spec_of
from fedvls_flwr.data.node_config import FOLDER


def _listing(folder: Path) -> list[str]:
    """Every non-hidden file below ``folder`` (or ``folder`` itself, a file): relative path,
    size, mtime (ns)."""
    if folder.is_file():
        st = folder.stat()
        return [f"{folder.name}\t{st.st_size}\t{st.st_mtime_ns}"]
    if not folder.is_dir():
        return [f"missing {folder}"]
    out = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a link back (a loop): the loader refuses it, the listing stops there
            dirnames[:] = []
            out.append(f"again {os.path.relpath(dirpath, folder)}")
            continue
        seen.add(real)
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fname in filenames:
            if fname.startswith("."):
                continue
            path = os.path.join(dirpath, fname)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append(f"{os.path.relpath(path, folder)}\t{st.st_size}\t{st.st_mtime_ns}")
    out.sort()
    return out


def fingerprint(name: str, data_dir: str, classes: tuple[str, ...] | None = None) -> str:
    h = hashlib.sha256()
    if name == FOLDER:
        # What the folder loader reads: the class folders present, and their contents.
        root = Path(data_dir)
        try:
            folders = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        except OSError:
            folders = ["<unreadable>"]
        h.update(("\n".join(folders) + "\n").encode())
        for name_c in classes or ():
            h.update(f"[{name_c}]\n".encode())
            h.update("\n".join(_listing(root / name_c)).encode())
        return h.hexdigest()
    if name == "digits":
        try:
            h.update(f"scikit-learn {metadata.version('scikit-learn')}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(b"scikit-learn missing\n")
    for folder in spec_of(name).folders(Path(data_dir)):
        h.update(f"[{folder}]\n".encode())
        h.update("\n".join(_listing(folder)).encode())
    return h.hexdigest()
