"""Run folder: rounds.jsonl (one line per round), summary.json, the final global model.

Every file is replaced atomically (write a temporary file, fsync, rename), so a crash
leaves the previous complete version, never half a file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROUNDS_FILE = "rounds.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model_final.npz"
CLIENTS_FILE = "clients.json"
CHECKPOINT_FILE = "checkpoint.npz"
STATE_FILE = "state.json"
CONFIG_FILE = "config.json"


def _jsonable(value: Any) -> Any:
    """NaN/inf become null (JSON has neither); numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(_jsonable(obj), indent=2) + "\n").encode())


def save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """The global model as an .npz of its state_dict arrays (loadable without Flower)."""
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / ROUNDS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RunWriter:
    """Owns one run folder; keeps the rounds in memory and rewrites the file atomically."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rounds: list[dict[str, Any]] = []

    def append_round(self, record: dict[str, Any]) -> None:
        self.rounds.append(_jsonable(record))
        text = "".join(json.dumps(r) + "\n" for r in self.rounds)
        atomic_write_bytes(self.run_dir / ROUNDS_FILE, text.encode())

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.run_dir / SUMMARY_FILE, summary)

    def write_clients(self, num_classes: int, class_counts: dict[int, list[int]]) -> None:
        """The partition as the clients saw it: per partition id, samples per class."""
        clients = [{"partition_id": pid, "class_counts": class_counts[pid]} for pid in sorted(class_counts)]
        atomic_write_json(self.run_dir / CLIENTS_FILE, {"num_classes": num_classes, "clients": clients})

    def save_model(self, arrays: dict[str, np.ndarray]) -> None:
        save_arrays(self.run_dir / MODEL_FILE, arrays)

    def save_checkpoint(self, arrays: dict[str, np.ndarray]) -> None:
        save_arrays(self.run_dir / CHECKPOINT_FILE, arrays)


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """best/final accuracy over the evaluated rounds (round 0 = the initial model excluded)."""
    trained = [r for r in rounds if r.get("round", 0) >= 1 and r.get("accuracy") is not None]
    if not trained:
        return {"best_accuracy": None, "best_round": None, "final_accuracy": None, "final_round": None}
    best = max(trained, key=lambda r: r["accuracy"])
    return {
        "best_accuracy": best["accuracy"],
        "best_round": best["round"],
        "final_accuracy": trained[-1]["accuracy"],
        "final_round": trained[-1]["round"],
    }
