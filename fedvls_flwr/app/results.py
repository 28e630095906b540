"""Run folder: rounds.jsonl (one line per round), summary.json, the final global model.

Every file is replaced atomically (write a temporary file, fsync, rename), so a crash
leaves the previous complete version, never half a file. A failed write (a full disk)
raises OSError naming the file it was writing.

A run folder has one owner: :class:`RunFolderLock` (``run.lock``), held by the ServerApp
for the run's life on every engine, so a second run on the same folder is refused at once,
naming the run that holds it.

:func:`read_resume_point` reads what ``resume = true`` continues from, and says which
file is damaged and what to do when the folder cannot be resumed as it is.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedvls_flwr.config.settings import ConfigError, edit_distance
from fedvls_flwr.config.unread import unread_settings

if TYPE_CHECKING:
    from fedvls_flwr.config.run_config import RunConfig

ROUNDS_FILE = "rounds.jsonl"
SUMMARY_FILE = "summary.json"
MODEL_FILE = "model_final.npz"
CLIENTS_FILE = "clients.json"
CHECKPOINT_FILE = "checkpoint.npz"
STATE_FILE = "state.json"
CONFIG_FILE = "config.json"
#: Key of the 0-d int64 array in checkpoint.npz that records the round it holds (a checkpoint
#: without it is still read: state.json then says which round it is).
CHECKPOINT_ROUND_KEY = "__fedvls_round__"
#: Arrays that stopped changing (FedConcat's frozen encoders, from the end of its first stage
#: on) are written once, to ``checkpoint-frozen-<digest>.npz`` beside the checkpoint, instead of
#: into every round's checkpoint; the checkpoint names that file's digest (this key, a 0-d
#: string array) and the arrays it takes from it (:data:`CHECKPOINT_FROZEN_KEYS`).
#: :func:`load_checkpoint` puts them together.
CHECKPOINT_FROZEN_DIGEST = "__fedvls_frozen_digest__"
CHECKPOINT_FROZEN_KEYS = "__fedvls_frozen_keys__"
FROZEN_FILE_PREFIX = "checkpoint-frozen-"
#: An array (its .npy bytes) smaller than this stays in the checkpoint, changed or not: only
#: large ones are worth a file of their own.
FROZEN_MIN_BYTES = 64 * 1024
#: Settings that may differ between a run and its resumption (everything else must match).
#: output-dir and run-name: the folder is the run's identity, not its path - a run folder
#: moved elsewhere (e.g. off a full disk) continues there.
RESUMABLE_CHANGES = frozenset({
    "resume", "num-server-rounds", "round-timeout", "min-nodes-timeout", "round-retries", "device", "torch-threads",
    "output-dir", "run-name", "tracking",
})


class RunFolderError(ValueError):
    """A run folder that cannot be resumed as it is; the message names the file and what to do."""


class RunFolderBusy(RunFolderError):
    """Another run holds the run folder (its :class:`RunFolderLock`); the message names it."""


def jsonable(value: Any) -> Any:
    """NaN/inf become null (JSON has neither); numpy scalars become Python numbers. Every dict
    and list is new: what a record held when this was called, whatever is done to it later."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` via a temp file + fsync + rename; an OSError names ``path``."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            try:
                Path(tmp).unlink(missing_ok=True)
            except OSError:
                pass
        if isinstance(err, OSError) and err.errno is not None and err.filename != str(path):
            # write()/fsync() failures name no file; say which one could not be written
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(jsonable(obj), indent=2) + "\n").encode())


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray | bytes]) -> None:
    """The global model as an .npz of its state_dict arrays (loadable without Flower): what
    ``np.savez`` writes. A value may be given already encoded, as the bytes of an ``.npy`` file
    (a Flower ``Array``'s payload): it is stored as it is, not decoded and encoded again (a
    checkpoint a round, and the frozen file beside it)."""
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, value in arrays.items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as entry:
                if isinstance(value, bytes):
                    entry.write(value)
                else:
                    np.lib.format.write_array(entry, np.asanyarray(value), allow_pickle=False)
    atomic_write_bytes(path, buffer.getvalue())


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def save_checkpoint(path: Path, arrays: Mapping[str, np.ndarray | bytes], server_round: int) -> None:
    """The global model after ``server_round``, with the round recorded inside the file."""
    save_arrays(path, {**arrays, CHECKPOINT_ROUND_KEY: np.asarray(server_round, dtype=np.int64)})


class FrozenFileDamaged(ValueError):
    """The frozen file a checkpoint names cannot be read, or lacks an array it takes from it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} is damaged ({why})")
        self.path, self.why = path, why


def load_checkpoint(path: Path) -> tuple[int | None, dict[str, np.ndarray]]:
    """(the round it holds, or None for an older checkpoint without it; the model's arrays),
    those kept in the frozen file it names (:data:`CHECKPOINT_FROZEN_DIGEST`) included.

    Raises FileNotFoundError naming the frozen file when it is gone, :class:`FrozenFileDamaged`
    when it cannot be read or lacks an array the checkpoint takes from it."""
    path = Path(path)
    arrays = load_arrays(path)
    stamp = arrays.pop(CHECKPOINT_ROUND_KEY, None)
    digest, names = arrays.pop(CHECKPOINT_FROZEN_DIGEST, None), arrays.pop(CHECKPOINT_FROZEN_KEYS, None)
    if digest is not None and names is not None:
        frozen_path = path.parent / f"{FROZEN_FILE_PREFIX}{digest.item()}.npz"
        if not frozen_path.exists():
            raise FileNotFoundError(errno.ENOENT, f"{frozen_path.name}, which holds the arrays that stopped "
                                    f"changing ({names.size} of them), is missing", str(frozen_path))
        try:
            frozen = load_arrays(frozen_path)
        except (ValueError, EOFError, zipfile.BadZipFile) as err:  # np.load's ways of meeting a damaged file
            raise FrozenFileDamaged(frozen_path, f"{type(err).__name__}: {err}") from None
        missing = [str(name) for name in names.tolist() if name not in frozen]
        if missing:
            raise FrozenFileDamaged(frozen_path, f"it lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
        arrays.update({str(name): frozen[str(name)] for name in names.tolist()})
    return (None if stamp is None else int(stamp)), arrays


def _frozen_digest(arrays: Mapping[str, bytes]) -> str:
    import hashlib

    h = hashlib.blake2b(digest_size=8)
    for key in sorted(arrays):
        h.update(key.encode() + b"\0" + len(arrays[key]).to_bytes(8, "little"))
        h.update(arrays[key])
    return h.hexdigest()


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / ROUNDS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RunWriter:
    """Owns one run folder; keeps the rounds in memory and rewrites the file atomically.

    The file is replaced whole every round (never torn, never half a line), and the lines of
    the rounds already written are kept encoded: a round costs one record's encoding, not the
    whole run's again (1,000 rounds of FedConcat's head)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._rounds: list[dict[str, Any]] = []
        self._lines: list[bytes] = []
        self._last_checkpoint: dict[str, bytes] = {}  # the large .npy payloads of the last one
        self._frozen: dict[str, bytes] = {}  # what the frozen file the checkpoints name holds
        self._frozen_digest: str | None = None

    @property
    def rounds(self) -> list[dict[str, Any]]:
        return self._rounds

    @rounds.setter
    def rounds(self, rounds: list[dict[str, Any]]) -> None:
        self._rounds = list(rounds)
        self._lines = [(json.dumps(r) + "\n").encode() for r in self._rounds]

    def append_round(self, record: dict[str, Any]) -> None:
        """Add a round; ``self.rounds`` grows only once the file holds it too."""
        record = jsonable(record)
        line = (json.dumps(record) + "\n").encode()
        atomic_write_bytes(self.run_dir / ROUNDS_FILE, b"".join([*self._lines, line]))
        self._rounds = [*self._rounds, record]
        self._lines.append(line)

    def write_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.run_dir / SUMMARY_FILE, summary)

    def write_clients(self, num_classes: int, class_counts: dict[int, list[int]]) -> None:
        """The partition as the clients saw it: per partition id, samples per class."""
        clients = [{"partition_id": pid, "class_counts": class_counts[pid]} for pid in sorted(class_counts)]
        atomic_write_json(self.run_dir / CLIENTS_FILE, {"num_classes": num_classes, "clients": clients})

    def save_model(self, arrays: Mapping[str, np.ndarray | bytes]) -> None:
        save_arrays(self.run_dir / MODEL_FILE, arrays)

    def save_checkpoint(self, arrays: Mapping[str, np.ndarray | bytes], server_round: int | None = None) -> None:
        """The checkpoint; a large array (its .npy bytes) that is the same as in the last
        checkpoint goes, with the others that stopped changing, to a frozen file written once
        (written first, each file atomically; the one no checkpoint names any more is removed
        after), so that a round writes only what changed (FedConcat's head rounds: the head,
        not the K frozen encoders again)."""
        if server_round is None:
            save_arrays(self.run_dir / CHECKPOINT_FILE, arrays)
            return
        large = {k: v for k, v in arrays.items() if isinstance(v, bytes) and len(v) >= FROZEN_MIN_BYTES}
        kept_frozen, digest = self._frozen, self._frozen_digest
        frozen = {k for k, v in large.items() if (kept := kept_frozen.get(k)) is not None and (kept is v or kept == v)}
        settled = {k for k, v in large.items()
                   if k not in frozen and (last := self._last_checkpoint.get(k)) is not None and (last is v or last == v)}
        if settled:  # arrays that stopped changing since the last checkpoint: a new frozen file with them
            kept_frozen = {k: large[k] for k in sorted(frozen | settled)}
            digest = _frozen_digest(kept_frozen)
            save_arrays(self.run_dir / f"{FROZEN_FILE_PREFIX}{digest}.npz", kept_frozen)
            frozen = set(kept_frozen)
        inline: dict[str, np.ndarray | bytes] = {k: v for k, v in arrays.items() if k not in frozen}
        if frozen:
            inline[CHECKPOINT_FROZEN_DIGEST] = np.asarray(digest)
            inline[CHECKPOINT_FROZEN_KEYS] = np.asarray(sorted(frozen))
        save_checkpoint(self.run_dir / CHECKPOINT_FILE, inline, server_round)
        # what this writer knows changes only once both files are written
        self._last_checkpoint, self._frozen, self._frozen_digest = large, kept_frozen, digest
        named = f"{FROZEN_FILE_PREFIX}{digest}.npz" if frozen else None
        for stale in self.run_dir.glob(f"{FROZEN_FILE_PREFIX}*.npz"):  # every frozen file this checkpoint does not name
            if stale.name != named:
                stale.unlink(missing_ok=True)


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
        "replies_per_node": replies_per_node(rounds),
        **stage_costs(rounds),
    }


def replies_per_node(rounds: list[dict[str, Any]]) -> dict[str, int]:
    """Accepted training replies per machine over the run (each round's ``nodes``), most first."""
    total: Counter[str] = Counter()
    for r in rounds:
        total.update(r.get("nodes") or {})
    return dict(total.most_common())


def stage_costs(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds and seconds per stage of a protocol in stages (FedConcat); empty otherwise."""
    stages: dict[str, dict[str, float]] = {}
    for r in rounds:
        if r.get("round", 0) >= 1 and "stage" in r:
            entry = stages.setdefault(str(r["stage"]), {"rounds": 0, "seconds": 0.0})
            entry["rounds"] += 1
            entry["seconds"] += float(r.get("seconds") or 0.0)
    return {"stages": stages} if stages else {}


# ---------------------------------------------------------------------------------------
# resume
# ---------------------------------------------------------------------------------------
@dataclass
class ResumePoint:
    """What ``resume = true`` continues from: the last completed round, its global model,
    the rounds 0..round of rounds.jsonl, and what was repaired on the way (to be logged)."""

    round: int
    arrays: dict[str, np.ndarray]
    rounds: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)


def holds_run(run_dir: Path) -> bool:
    """Whether a run folder holds a run that got past its first round (state or checkpoint)."""
    return (Path(run_dir) / STATE_FILE).exists() or (Path(run_dir) / CHECKPOINT_FILE).exists()


def missing_run_folder(run_dir: Path, shown: int = 5) -> str | None:
    """Why ``resume = true`` has nothing to continue in ``run_dir`` when the folder does not exist
    (None when it does): the folder looked for, the runs next to it that come closest to its
    name, and that dropping ``resume`` starts a new run. A folder that exists but holds no
    finished round (a sweep makes a run's folder before submitting it) is resumed from round 1."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        return None
    out, name = run_dir.parent, run_dir.name
    runs = sorted(p.name for p in out.iterdir() if p.is_dir() and holds_run(p)) if out.is_dir() else []
    runs.sort(key=lambda other: edit_distance(name.lower(), other.lower()))
    if runs:
        more = f" (and {len(runs) - shown} more)" if len(runs) > shown else ""
        there = f"the runs in {out}, closest first: {', '.join(runs[:shown])}{more}; set run-name to one of them, or"
    else:
        there = f"{out} holds no run to resume; to start a new run,"
    return (f"run config 'resume' = true but there is no run folder {run_dir} (run-name = {name!r}, "
            f"output-dir {out}); {there} drop resume=true")


def check_resume_target(cfg: RunConfig) -> None:
    """A :class:`ConfigError` when ``resume = true`` names a run folder that does not exist
    (:func:`missing_run_folder`): without it the run would start anew without a word."""
    if cfg.resume and cfg.run_name and (missing := missing_run_folder(cfg.resolved_output_dir() / cfg.run_name)):
        raise ConfigError(missing)


def _read_json_file(path: Path) -> tuple[Any, str | None]:
    """(content, None) or (None, why it cannot be read)."""
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return None, f"unreadable ({type(err).__name__}: {err})"


def _saved_config(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The config the run was started with: config.json, else summary.json's copy."""
    saved, why = _read_json_file(run_dir / CONFIG_FILE)
    if isinstance(saved, dict):
        return saved, None
    why = why or "not a JSON object"
    summary, _ = _read_json_file(run_dir / SUMMARY_FILE)
    if isinstance(summary, dict) and isinstance(summary.get("config"), dict):
        return summary["config"], f"{run_dir / CONFIG_FILE} is {why}; compared the settings with the copy in {SUMMARY_FILE}"
    raise RunFolderError(
        f"resume: {run_dir / CONFIG_FILE} is {why}, so the settings this run was started with "
        "cannot be compared with this run config (and no summary.json holds a copy). Restore "
        "config.json from a copy of the folder, or start a new run (another run-name)."
    )


def _read_rounds_for_resume(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(parsed records, 1-based numbers of lines that are not a JSON object with a round)."""
    records, bad = [], []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return [], []
    except OSError as err:
        raise RunFolderError(f"resume: cannot read {path}: {err}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad.append(number)
            continue
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            bad.append(number)
            continue
        records.append({**record, "_line": number})
    return records, bad


def read_resume_point(run_dir: Path, config: dict[str, Any]) -> ResumePoint:
    """The round to continue after, its model and metrics, from a folder that ``holds_run``.

    The files are written in the order rounds.jsonl, checkpoint.npz (which records its
    round), state.json, each atomically; so the checkpoint's round is the last completed
    one, rounds.jsonl must hold every round up to it, and a later record (a round the
    server was stopped in) is dropped and re-run. What the other files allow is repaired
    (a torn last line of rounds.jsonl after the checkpoint's round; a stale, missing or
    garbage state.json when the checkpoint records its round and rounds.jsonl agrees) and
    reported in ``notes``; anything else raises :class:`RunFolderError` naming the file.
    ``config``: the run config (kebab-case) it is resumed with.
    """
    run_dir = Path(run_dir)
    notes: list[str] = []
    _check_same_settings(run_dir, config, notes)
    state_round, state_why = _state_round(run_dir / STATE_FILE)
    ck_round, arrays = _load_checkpoint_for_resume(run_dir / CHECKPOINT_FILE, state_round)
    records, bad = _read_rounds_for_resume(run_dir / ROUNDS_FILE)
    done = _completed_round(run_dir, ck_round, state_round, state_why, records, notes)
    _check_not_past_the_end(run_dir, config, done)
    kept = _rounds_up_to(run_dir / ROUNDS_FILE, done, records, bad, notes)
    return ResumePoint(done, arrays, kept, notes)


def _check_same_settings(run_dir: Path, config: dict[str, Any], notes: list[str]) -> None:
    """The run config a run is resumed with must be the one it was started with, but for what
    may change (:data:`RESUMABLE_CHANGES`) and the settings nothing in the run reads."""
    saved, note = _saved_config(run_dir)
    if note:
        notes.append(note)
    unread = unread_settings(config)  # settings nothing in this run reads: they cannot make it another run
    changed = sorted(k for k, v in config.items() if saved.get(k) != v and k not in RESUMABLE_CHANGES
                     and k not in unread)
    if changed:
        detail = ", ".join(f"{k}: {saved.get(k, '(unset)')!r} -> {config.get(k, '(unset)')!r}" for k in changed)
        raise RunFolderError(
            f"resume: the run in {run_dir} was started with other settings ({detail}); "
            "resume with the same run config (only num-server-rounds, timeouts, retries, device, "
            "torch-threads, output-dir, run-name and tracking may change), or start a new run-name"
        )


def _state_round(state_path: Path) -> tuple[int | None, str | None]:
    """The round state.json names (None if it names none) and why it names none."""
    state, state_why = _read_json_file(state_path)
    state_round = state.get("round") if isinstance(state, dict) else None
    if not isinstance(state_round, int) or isinstance(state_round, bool) or state_round < 0:
        state_why = state_why or f"not a JSON object with a round number ({str(state)[:80]!r})"
        state_round = None
    return state_round, state_why


def _load_checkpoint_for_resume(checkpoint: Path, state_round: int | None) -> tuple[int | None, dict[str, np.ndarray]]:
    """The checkpoint's round (None if it records none) and its arrays; a missing or damaged
    checkpoint ends the resume, naming what is lost and what is intact."""
    if not checkpoint.exists():
        raise RunFolderError(
            f"resume: {checkpoint} is missing (state.json says round {state_round}); the global model "
            "of the last completed round is gone, so this run cannot continue. Restore checkpoint.npz "
            "from a copy of the folder, or start a new run (another run-name)."
        )
    try:
        return load_checkpoint(checkpoint)
    except FileNotFoundError as err:
        if not Path(str(err.filename)).name.startswith(FROZEN_FILE_PREFIX):
            raise
        raise RunFolderError(
            f"resume: {err.filename} is missing; {checkpoint} takes the arrays that stopped changing "
            "(FedConcat's frozen encoders) from it, so this run cannot continue. Restore that file from a "
            "copy of the folder, or start the run again (another run-name)."
        ) from None
    except FrozenFileDamaged as err:
        raise RunFolderError(
            f"resume: {err.path} is damaged ({err.why}); {checkpoint}, which is intact, takes the arrays that "
            "stopped changing (FedConcat's frozen encoders) from it, so this run cannot continue. Restore that "
            "file from a copy of the folder, or start the run again (another run-name)."
        ) from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
        # np.load: BadZipFile (a truncated .npz), ValueError/EOFError (a damaged member)
        last = "an unknown round" if state_round is None else f"round {state_round}"
        raise RunFolderError(
            f"resume: {checkpoint} is damaged ({type(err).__name__}: {err}); it held the global model "
            f"of {last}, which no other file has, so this run cannot continue from it. The metrics "
            f"up to then in {ROUNDS_FILE} are intact. Restore checkpoint.npz from a copy of the "
            "folder, or start the run again (another run-name)."
        ) from None


def _completed_round(run_dir: Path, ck_round: int | None, state_round: int | None, state_why: str | None,
                     records: list[dict[str, Any]], notes: list[str]) -> int:
    """The last completed round: the checkpoint's (state.json stale by one round, or unreadable,
    is noted), else state.json's; files from different points of the run end the resume."""
    checkpoint, state_path = run_dir / CHECKPOINT_FILE, run_dir / STATE_FILE
    if ck_round is not None:
        done = ck_round
        if state_round is None:
            notes.append(f"{state_path} is {state_why}; {CHECKPOINT_FILE} records round {done} and "
                         f"{ROUNDS_FILE} holds rounds 0..{done}: continuing after round {done}")
        elif state_round == done - 1:
            notes.append(f"{state_path} says round {state_round} but {CHECKPOINT_FILE} holds round {done} "
                         "(the server stopped between writing the two): continuing after round "
                         f"{done}")
        elif state_round != done:
            raise RunFolderError(
                f"resume: {state_path} says round {state_round} but {checkpoint} holds round {done}: "
                "the files come from different points of the run (a partial copy?). Restore the "
                "folder from one consistent copy, or start a new run (another run-name)."
            )
        return done
    if state_round is not None:
        return state_round
    last_round = max((r["round"] for r in records), default=None)
    raise RunFolderError(
        f"resume: {state_path} is {state_why}, and {checkpoint} "
        "does not record its round, so which round it holds cannot be established safely"
        + (f" (rounds.jsonl ends with round {last_round}, but the server may have stopped before that "
           "round's checkpoint). If you know the checkpoint holds round N, write "
           '{"round": N} into state.json' if last_round is not None else ". Restore state.json")
        + "; otherwise start a new run (another run-name)."
    )


def _check_not_past_the_end(run_dir: Path, config: dict[str, Any], done: int) -> None:
    """A run does not go back: resuming with fewer rounds than it completed is refused."""
    asked = config.get("num-server-rounds")
    if isinstance(asked, int) and done > asked:
        raise RunFolderError(
            f"resume: the run in {run_dir} has completed {done} rounds, more than num-server-rounds = {asked}: "
            f"a run does not go back. To train it further, resume with num-server-rounds > {done}; for a "
            f"{asked}-round result start a new run-name (this run's rounds 1..{asked} are in its {ROUNDS_FILE})"
        )


def already_finished(run_dir: Path, done: int, asked: int, tracking: str = "none") -> str | None:
    """What resuming a run that has finished every round asked of it does: nothing but its
    tracker's files (``tracking`` asked: written again from rounds.jsonl, as any resume does) -
    said, with how to train it further; None when there is something to do. A resumed run with
    no round left used to write its final files again, as if it had just run: summary.json took
    this session's 0.1 s for the run's wall_seconds and the last round for resumed_after_round
    (a second sweep on the same folder did it to runs the first had finished meanwhile). A run
    whose summary.json or final model is missing, or says it failed, still writes them."""
    summary, _ = _read_json_file(Path(run_dir) / SUMMARY_FILE)
    if done < asked or not isinstance(summary, dict) or summary.get("status") != "completed" \
            or summary.get("rounds_completed") != done or not (Path(run_dir) / MODEL_FILE).exists():
        return None
    what = ("nothing to do, its files are left as they are" if tracking == "none" else
            f"only its {tracking} files are written again (from {ROUNDS_FILE}), its other files are left as they are")
    return (f"resume: the run in {run_dir} has already finished its {done} rounds ({SUMMARY_FILE}: completed); "
            f"{what}. To train it further, resume with num-server-rounds > {done}")


def _rounds_up_to(rounds_path: Path, done: int, records: list[dict[str, Any]], bad: list[int],
                  notes: list[str]) -> list[dict[str, Any]]:
    """rounds.jsonl's records of rounds 0..done, which must all be there, in order and
    readable; torn or later lines after them are noted (their rounds run again)."""
    kept = [r for r in records if r["round"] <= done]
    got = [r["round"] for r in kept]
    if got != list(range(done + 1)):
        missing = sorted(set(range(done + 1)) - set(got))
        what = (f"lines {bad} cannot be read" if bad else "no line is damaged") + (
            f", round(s) {missing} are missing" if missing else f", the rounds are out of order or repeated ({got})")
        raise RunFolderError(
            f"resume: {rounds_path} does not hold rounds 0..{done} that {CHECKPOINT_FILE} covers ({what}); "
            "the metrics of those rounds are lost. Restore rounds.jsonl from a copy of the folder, or "
            "start the run again (another run-name)."
        )
    last_kept_line = kept[-1]["_line"]
    damaged_before = [n for n in bad if n < last_kept_line]
    if damaged_before:
        raise RunFolderError(
            f"resume: {rounds_path} line(s) {damaged_before} cannot be read, between rounds the "
            f"checkpoint covers; restore rounds.jsonl from a copy, or start the run again."
        )
    if bad:
        notes.append(f"dropped {len(bad)} torn line(s) of {rounds_path} after round {done}'s (line(s) {bad}): "
                     f"a round {CHECKPOINT_FILE} does not hold, which is run again")
    later = [r["round"] for r in records if r["round"] > done]
    if later:
        notes.append(f"{ROUNDS_FILE} round(s) {later} came after the checkpoint's round {done} and are run again")
    return [{k: v for k, v in r.items() if k != "_line"} for r in kept]


# ---------------------------------------------------------------------------------------
# one run per run folder
# ---------------------------------------------------------------------------------------
LOCK_FILE = "run.lock"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run folder, as its lock file says: enough to find the process and stop it."""

    pid: int
    host: str
    started: str  # UTC, "2026-11-27 17:40:03 UTC"
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, started {self.started}, command: {self.command}"

    def on_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def gone(self) -> bool:
        """Whether the holder is known to have ended: a process of this host that no longer runs.
        A holder on another host cannot be seen from here: never called gone."""
        return self.on_this_host() and not _pid_alive(self.pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:  # a zombie (ended, not yet reaped by its parent) holds nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _this_command() -> str:
    """This process's command line, arguments holding spaces in double quotes (cut to 300 characters)."""
    try:
        args = [a.decode(errors="replace") for a in Path("/proc/self/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        args = [sys.executable, *sys.argv]
    text = " ".join(f'"{a}"' if not a or any(c.isspace() for c in a) else a for a in args) or "?"
    return text if len(text) <= 300 else text[:297] + "..."


def read_lock_holder(run_dir: Path) -> LockHolder | None:
    """What ``run.lock`` of ``run_dir`` says (None: no lock file, or one that names nobody)."""
    try:
        data = json.loads((Path(run_dir) / LOCK_FILE).read_text())
        return LockHolder(int(data["pid"]), str(data["host"]), str(data["started"]), str(data["command"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _flock(fd: int) -> bool | None:
    """Try to lock ``fd`` exclusively: True taken, False held by another process, None when the
    filesystem cannot lock (some network or FUSE filesystems)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return None
        raise


def lock_holder(run_dir: Path) -> LockHolder | None:
    """The run that holds ``run_dir`` now, without taking it (``fedvls check``, a sweep's plan);
    None when the folder is free or its lock was left by a run that ended."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        taken = _flock(fd)
        if taken:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        holder = read_lock_holder(run_dir)
        if taken is None and (holder is None or holder.gone()):
            return None
        return holder or LockHolder(0, "?", "?", "? (run.lock names nobody)")
    finally:
        os.close(fd)


def busy_message(run_dir: Path, holder: LockHolder | None, resume: bool = False, unlockable: bool = False) -> str:
    """The refusal of a run whose folder ``holder`` holds: who it is and what to do."""
    path = Path(run_dir) / LOCK_FILE
    who = holder.describe() if holder is not None else "a process that has not yet written its name"
    if holder is not None and not holder.on_this_host():
        fix = (f"wait for it to end, or stop it on {holder.host} (kill {holder.pid}); if that run is no "
               f"longer going (its machine stopped), delete {path}")
    elif holder is not None:
        fix = f"wait for it to end, or stop it (kill {holder.pid}: what it saved is kept)"
    else:
        fix = "wait for it to end"
    if unlockable:
        fix += " (this filesystem cannot lock files: the lock file's content decides)"
    if resume:
        return (f"resume: the run in {run_dir} is still going ({who}); resume it once it has stopped: {fix}. "
                "One run folder, one run")
    return (f"run folder {run_dir} is in use by another run ({who}); {fix}; or give this run another "
            "run-name / output-dir. One run folder, one run")


class RunFolderLock:
    """One run per run folder, for the run's life: ``run.lock`` in the folder, locked with
    ``flock`` and naming its holder (pid, host, start time, command).

    ``flock`` is released by the kernel when the process ends, however it ends (SIGKILL, a
    crash): a lock file left behind is recognised as stale because it can be locked again, and
    taken over with a note (``took_over``) naming the run that left it. On a shared filesystem
    (NFS) ``flock`` is a lock the server keeps for every host that mounts it, so a run on another
    host is refused too. Where the filesystem cannot lock at all, the file's own content
    decides: a holder on this host that no longer runs is taken over; one on another host is
    refused, with how to clear it if that run is gone (its host cannot be asked from here).

    ``RunFolderLock.last_taken``: the run folder this process locked last (what an interrupted
    ``fedvls run`` names as kept).
    """

    last_taken: Path | None = None

    def __init__(self, run_dir: Path, what: str = "", resume: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.what = what  # e.g. "Flower run 123": said with the command to whoever is refused
        self.resume = resume  # the refusal then says that the run to resume is still going
        self.took_over: LockHolder | None = None
        self._fd: int | None = None
        self._made_folder = False

    def acquire(self) -> RunFolderLock:
        """Take the folder, or raise :class:`RunFolderBusy` naming the run that holds it."""
        self._made_folder = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        refused = 0
        for _ in range(40):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            taken = _flock(fd)
            if taken is False:
                os.close(fd)
                refused += 1
                if refused < 10:  # a probe (lock_holder) holds it for microseconds; a run, for its life
                    time.sleep(0.05)
                    continue
                raise RunFolderBusy(busy_message(self.run_dir, read_lock_holder(self.run_dir), self.resume))
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # released and removed by its holder after we opened it: open the new one
                os.close(fd)
                continue
            previous = read_lock_holder(self.run_dir)
            if taken is None and previous is not None and not previous.gone() and previous.pid != os.getpid():
                os.close(fd)
                raise RunFolderBusy(busy_message(self.run_dir, previous, self.resume, unlockable=True))
            self.took_over = previous if previous is not None and previous.pid != os.getpid() else None
            started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
            command = _this_command() + (f" ({self.what})" if self.what else "")
            record = {"pid": os.getpid(), "host": socket.gethostname(), "started": started, "command": command}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
            os.fsync(fd)
            self._fd = fd
            RunFolderLock.last_taken = self.run_dir
            return self
        raise RunFolderBusy(f"run folder {self.run_dir}: {self.path} keeps being replaced by other runs; "
                            "stop them first")

    def took_over_note(self) -> str | None:
        """What to log when the lock was left by a run that ended without releasing it."""
        if self.took_over is None:
            return None
        return (f"run folder {self.run_dir}: took over the lock left by a run that no longer runs "
                f"({self.took_over.describe()}); it was stopped without releasing the folder (killed?)")

    def release(self) -> None:
        """Remove the lock file and let go (the file goes first: whoever opened it meanwhile sees
        it replaced and starts over)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
            if self._made_folder:  # a run that stopped before writing anything leaves no empty folder
                self.run_dir.rmdir()
        except OSError:  # not empty: the run's files stay
            pass
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunFolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
