"""Run a YAML preset (a set of runs), then tabulate and plot.

Each run runs the app's own ServerApp and ClientApp, on one of two engines: the in-process
engine (the default on one machine: worker processes that import torch and Flower once and run
one experiment after another, ``--parallel N`` of them at once; :mod:`fedvls_flwr.ops.inprocess`)
or ``--engine flwr`` (the default with ``RAY_ADDRESS`` set): a real ``flwr run`` submission to
one SuperLink that this command starts and stops itself, the code path a user's ``flwr run .``
takes. Either way a table is evidence about the app, not about a re-implementation, and with
``deterministic = true`` both give the same numbers. Runs whose folder already holds a
``summary.json`` are skipped, so an interrupted sweep resumes where it stopped.

The preset format: :mod:`fedvls_flwr.experiments.preset`.

With ``--engine flwr``, Ray starts once for the whole sweep: a head on 127.0.0.1 that the sweep
starts (and stops by PID) and every run joins through ``RAY_ADDRESS``, or the cluster the user's ``RAY_ADDRESS`` names
(docs/ray-cluster.md); ``--no-shared-ray`` gives each run its own Ray, as a lone ``flwr run``.

Every run folder gets ``sweep-run.json`` (the run config and federation it was started
with). A planned run whose exact settings already finished in another folder under the
same output directory (e.g. the 60,000-image runs that a scale study shares with a table)
is not run again; a folder whose finished run has other settings than planned is an error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from fedvls_flwr.app.ray_address import check_ray_address, ray_address
from fedvls_flwr.app.results import SUMMARY_FILE, atomic_write_json
from fedvls_flwr.config.args import parse_items, seconds
from fedvls_flwr.config.run_config import ConfigError, RunConfig, parse_run_config
from fedvls_flwr.config.unread import unread_settings
from fedvls_flwr.experiments.preset import (
    FEDERATION_KEYS,
    Preset,
    PresetError,
    _check_keys,
    check_data,
    load_preset,
    split_federation,
)
from fedvls_flwr.experiments.progress import ProgressView, SweepProgress
from fedvls_flwr.ops.app_folder import app_folder
from fedvls_flwr.ops.flower_cli import flower_env
from fedvls_flwr.ops.launch import LocalSuperLink
from fedvls_flwr.ops.processes import PortRangeError, parse_port_range, say_what_is_kept, stop_signal
from fedvls_flwr.ops.ray_cluster import RayClusterError, RayHead, ray_missing

#: The file a sweep writes into each run folder: the settings the run was started with.
RUN_FILE = "sweep-run.json"
#: The in-process engine's log of a run (the ServerApp's output), in its folder.
RUN_LOG = "run.log"
#: Settings that do not change what a run computes (its name and folder, where it ran, how
#: long the server waits): two runs that differ only in these are the same experiment.
NON_IDENTITY_KEYS = frozenset({
    "run-name", "output-dir", "resume", "device", "torch-threads", "eval-batch-size",
    "round-timeout", "min-nodes-timeout", "round-retries", "min-nodes", "tracking",
})


def experiment_identity(run_config: dict[str, Any], num_supernodes: Any) -> dict[str, Any]:
    """What makes two runs the same experiment: every resolved setting that changes the
    computation (defaults filled in) and the number of simulated nodes."""
    cfg = parse_run_config({k: v for k, v in run_config.items() if k not in NON_IDENTITY_KEYS})
    settings = {k: v for k, v in cfg.to_flower().items() if k not in NON_IDENTITY_KEYS}
    return {"config": settings, "num-supernodes": num_supernodes}


def _with_defaults(settings: dict[str, Any]) -> dict[str, Any]:
    """A run's settings with every key it does not record at its default (a run folder that
    lacks a key ran with that key's default), less the settings nothing in the run reads
    (another part's, or FedGF's threshold with a fixed c): they do not change what it computes."""
    defaults = {k: v for k, v in RunConfig().to_flower().items() if k not in NON_IDENTITY_KEYS}
    full = {**defaults, **{k: v for k, v in settings.items() if k not in NON_IDENTITY_KEYS}}
    try:
        unread = unread_settings({**RunConfig().to_flower(), **full})
    except ValueError:  # a part this version does not know: compare everything
        unread = {}
    return {k: v for k, v in full.items() if k not in unread}


def _identity_key(identity: dict[str, Any]) -> str:
    return json.dumps({**identity, "config": _with_defaults(identity["config"])}, sort_keys=True)


def _run_identity(preset: Preset, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """One run of ``preset`` (its ``overrides``): its run config, its federation (the preset's,
    then the run's own) and its experiment identity (:func:`experiment_identity`)."""
    run_config, federation = split_federation(overrides)
    federation = {**preset.federation, **federation}
    return run_config, federation, experiment_identity(run_config, federation.get("num-supernodes"))


def _finished_runs(output_dir: Path) -> dict[str, str]:
    """identity (JSON) -> folder name of every completed run a sweep started under output_dir."""
    found: dict[str, str] = {}
    for run_file in sorted(output_dir.glob(f"*/{RUN_FILE}")):
        try:  # a file that cannot be read makes no twin (its own run's check says what is wrong with it)
            summary = json.loads((run_file.parent / SUMMARY_FILE).read_text())
            started = json.loads(run_file.read_text())
            if summary.get("status") == "completed":
                found.setdefault(_identity_key(started["identity"]), run_file.parent.name)
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            continue
    return found


def _check_same_settings(run_dir: Path, identity: dict[str, Any]) -> None:
    """A folder that already holds a finished run must hold the run planned for it."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
        if not isinstance(summary, dict):
            raise ValueError(f"a JSON {type(summary).__name__}, not an object")
        if not isinstance(summary.get("config") or {}, dict):
            raise ValueError(f"its 'config' is a JSON {type(summary['config']).__name__}, not an object")
    except (OSError, ValueError) as err:  # damaged (a disk that filled up, an edit): said, not a traceback
        raise PresetError(
            f"{run_dir / SUMMARY_FILE} cannot be read ({err}); remove that file and run the sweep again - the run "
            f"continues from its checkpoint (its rounds are kept) and writes a new one - or move {run_dir} away"
        ) from None
    saved = _with_defaults(summary.get("config") or {})
    planned = _with_defaults(identity["config"])
    changed = sorted(k for k in set(saved) | set(planned) if saved.get(k) != planned.get(k))
    if changed:
        raise PresetError(
            f"{run_dir} holds a finished run with other settings than planned for it ({', '.join(changed)}); "
            "move that folder away or choose another --output-dir"
        )


def run_preset(
    preset: Preset, output_dir: Path, *, timeout: float = 3600.0, log: Callable[..., None] = print, report: bool = True,
    port_range: tuple[int, int] | None = None, view: ProgressView | None = None, shared_ray: bool = True,
    engine: str = "inprocess", parallel: int = 1,
) -> dict[str, Any]:
    """Run every not-yet-finished run of ``preset`` under ``output_dir``; returns a status dict.

    ``port_range``: the SuperLink's port comes from this inclusive range (Ray's own ports do not).
    ``view``: where the progress goes (default: plain lines through ``log``, one per 30 s at most).
    ``shared_ray``: every run joins one Ray: the cluster ``RAY_ADDRESS`` names, else a head this
    sweep starts on 127.0.0.1 (and stops by PID at the end), so Ray starts once, not once a run.
    False: each run starts its own Ray, as a lone ``flwr run`` does (unless ``RAY_ADDRESS`` is set).
    """
    view = view or ProgressView(log)
    log = view.message
    output_dir = Path(output_dir).expanduser().resolve()
    plan = plan_sweep(preset, output_dir, report=report, engine=engine)
    todo, planned, statuses, own = plan.todo, plan.planned, plan.statuses, plan.own
    log(f"[sweep] {preset.name}: {len(preset.runs)} runs, {len(statuses)} already finished, {len(todo)} to run")
    if todo and engine == "inprocess":
        _run_in_process(todo, planned, output_dir, statuses, view, timeout=timeout, parallel=parallel)
    elif todo:
        _run_with_flwr(todo, planned, output_dir, statuses, view, timeout=timeout, port_range=port_range,
                       shared_ray=shared_ray)
    paths = {}
    if report:
        from fedvls_flwr.experiments.report import make_report
        from fedvls_flwr.experiments.runs import NoRunsError

        # the preset's own runs, in a folder of the preset's own: presets may share an output folder
        report_dir = sweep_report_dir(preset, output_dir)
        try:
            if not (folders := [d for d in dict.fromkeys(own) if d.is_dir()]):
                raise NoRunsError(f"none of the preset's {len(own)} runs has a folder in {output_dir}")
            notes: list[str] = []
            yaml_file = _yaml_of(preset)
            paths = make_report(folders, out_dir=report_dir, rows=preset.table_rows, cols=preset.table_cols,
                                notes=notes, preset=preset.name, preset_file=None if yaml_file is None else str(yaml_file))
            log(f"[sweep] report: {report_dir}")
            for note in notes:
                log(f"[sweep] note: {note}")
        except NoRunsError as err:  # every run failed: their logs are said above
            log(f"[sweep] no report: {err}")
        if (old := _old_layout_note(report_dir.parent)) is not None:
            log(old)
    return {"statuses": statuses, "report": paths}


@dataclasses.dataclass
class SweepPlan:
    """What a sweep found before its first run: the runs to run (run config with resume=true,
    federation, identity), each one's (name, method, rounds), the statuses of those it skips,
    and the preset's run folders (a twin's where the same run finished under another name)."""

    todo: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]
    planned: list[tuple[str, str, int]]
    statuses: dict[str, str]
    own: list[Path]


def plan_sweep(preset: Preset, output_dir: Path, *, report: bool = True, data: bool = True,
               engine: str = "inprocess") -> SweepPlan:
    """Every check a sweep makes before its first run (a report folder another preset's report
    holds, a finished run folder with other settings, a run folder that cannot be resumed, the
    tracking, room on this machine for each run's clients on the in-process engine, the Ray
    cluster ``RAY_ADDRESS`` names on ``engine`` flwr; with ``data`` the datasets and splits too,
    and ``output_dir`` created), and the plan. ``data=False`` (``--dry-run``) writes nothing and
    loads no dataset."""
    output_dir = Path(output_dir).expanduser().resolve()
    if report:
        check_report_dir(preset, output_dir)  # before any run: not another preset's report overwritten at the end
    finished = _finished_runs(output_dir)
    todo, statuses = [], {}
    own = []
    for overrides in preset.runs:
        name = overrides["run-name"]
        run_config, federation, identity = _run_identity(preset, overrides)
        if (output_dir / name / SUMMARY_FILE).exists():
            _check_same_settings(output_dir / name, identity)
            statuses[name] = "skipped (finished earlier)"
            own.append(output_dir / name)
        elif (twin := finished.get(_identity_key(identity))) is not None:
            statuses[name] = f"skipped (the same run finished as {twin})"
            own.append(output_dir / twin)
        else:
            own.append(output_dir / name)
            # resume=true: a run interrupted mid-way continues from its last checkpoint.
            todo.append(({**run_config, "output-dir": str(output_dir), "resume": True}, federation, identity))
    from fedvls_flwr.app.tracking import check_tracking
    from fedvls_flwr.experiments.check import check_output_dir

    planned = []
    for run_config, _, _ in todo:  # a run folder that cannot be resumed: said now, not mid-sweep
        try:
            cfg = parse_run_config(run_config)
            check_output_dir(cfg, new_ok=True)  # resume=true: continue a run started earlier, else start it
            check_tracking(cfg)
            planned.append((cfg.run_name, cfg.method, cfg.num_server_rounds))
        except ValueError as err:  # ConfigError, RunFolderError (which file, what to do)
            raise PresetError(f"preset {preset.path}: run {run_config['run-name']}: {err}") from None
    if todo and engine == "inprocess":
        check_machine_room([federation for _, federation, _ in todo])
    joined = ray_address()
    if todo and engine == "flwr" and joined is not None and (unreachable := check_ray_address(joined)) is not None:
        raise PresetError(unreachable)  # said before any run starts, not as a Ray traceback in each
    if data:  # the costly check last: what the files say is said without loading a dataset
        output_dir.mkdir(parents=True, exist_ok=True)
        check_data(preset)
    return SweepPlan(todo, planned, statuses, own)


def sweep_report_dir(preset: Preset, output_dir: Path) -> Path:
    """``<output>/report/<preset name>``: each preset's report apart, whichever presets share the folder."""
    return Path(output_dir) / "report" / (re.sub(r"[^A-Za-z0-9._-]+", "-", preset.name).strip("-.") or "preset")


def _yaml_of(preset: Preset) -> Path | None:
    """The preset's YAML, resolved (what a report's manifest records); None for a preset built in code."""
    return None if preset.path is None else Path(preset.path).resolve()


def check_report_dir(preset: Preset, output_dir: Path) -> None:
    """The preset's report folder does not hold another preset's report: two names that make one
    folder name ('table 1', 'table-1'; on a case-insensitive disk, 'T1' and 't1') would write one
    report over the other, and so would two YAMLs of one name (a copied preset, or ``t1.yaml`` in two
    folders) while both exist. Said before any run starts; the report's manifest names its preset
    and its YAML (a folder without one, written by ``fedvls report`` or an earlier version, names
    none; a YAML that was moved away is not another preset)."""
    from fedvls_flwr.experiments.report import read_manifest

    report_dir = sweep_report_dir(preset, output_dir)
    manifest = read_manifest(report_dir) or {}
    other, other_file = manifest.get("preset"), manifest.get("preset_file")
    this_file = _yaml_of(preset)
    if other == preset.name and other_file is not None and this_file is not None and Path(other_file) != this_file \
            and Path(other_file).is_file():
        raise PresetError(
            f"preset {preset.path}: the report folder {report_dir} holds the report of another preset of the same "
            f"name {other!r}, {other_file}, which still exists (two YAMLs with one name, or of one file name in two "
            f"folders, share a report folder); give one of them another name (name: in its YAML), or give this sweep "
            f"another --output-dir")
    if other is not None and other != preset.name:
        raise PresetError(
            f"preset {preset.path}: its name {preset.name!r} makes the report folder {report_dir}, which holds the "
            f"report of preset {other!r} (both names make the folder name {report_dir.name!r}); rename one of them "
            f"(name: in its YAML), give this sweep another --output-dir, or, if {other!r} was this preset's old name, "
            f"remove {report_dir}")


def _old_layout_note(report_root: Path) -> str | None:
    """A line naming report files straight in ``<output>/report/`` that no report's manifest lists
    there: an earlier version wrote a sweep's report there (now each preset's is in a folder of its
    own), so they may be stale. Not removed: without a manifest they may be the user's."""
    from fedvls_flwr.experiments.report import report_files_left, some_names

    if not report_root.is_dir() or not (left := report_files_left(report_root)):
        return None
    return (f"[sweep] note: {report_root} also holds {some_names(left)}, not of this report: an earlier version's sweep "
            f"report (each preset's report is now in {report_root}/<preset name>/) or your own files; left as they "
            "are: remove them if they are stale")


def _record_start(output_dir: Path, run_config: dict[str, Any], federation: dict[str, Any],
                  identity: dict[str, Any]) -> str:
    name = run_config["run-name"]
    (output_dir / name).mkdir(exist_ok=True)
    atomic_write_json(output_dir / name / RUN_FILE, {"run_config": run_config, "federation": federation,
                                                    "identity": identity})
    return name


def _taken_meanwhile(output_dir: Path, name: str, statuses: dict[str, str], log: Callable[[str], None]) -> bool:
    """Whether another process (another sweep on the same folder) has taken run ``name`` since
    this sweep planned it: it runs it now (it holds the folder's run.lock), or it finished it
    (summary.json). The first is said as the refusal the run would meet; the second is skipped
    as the plan skips a finished run. Asked in that order: the lock is held until the summary is
    written, so a run is never submitted in between - where, started with resume=true, it took
    the folder the moment the other let go and ran again with no round left, rewriting that
    run's summary.json (wall_seconds 0.1 s, resumed_after_round the last round) and model. (The
    window between this question and the run's start remains: a run finished in it is now left
    alone by the ServerApp, :func:`fedvls_flwr.app.results.already_finished`.)"""
    if _held_by_another(output_dir, name, statuses, log):
        return True
    if (output_dir / name / SUMMARY_FILE).exists():
        statuses[name] = "skipped (finished meanwhile, by another process)"
        log(f"[sweep]     {name}: finished meanwhile by another process (another sweep on {output_dir}?); skipped")
        return True
    return False


def _held_by_another(output_dir: Path, name: str, statuses: dict[str, str], log: Callable[[str], None]) -> bool:
    """Whether another process holds run ``name``'s folder now (its run.lock): said as the refusal
    the run meets - before this sweep starts it, or after its ServerApp was refused (the other
    took the folder between this sweep's question and the run's start; the run itself has ended,
    so the holder is not it)."""
    from fedvls_flwr.app.results import busy_message, lock_holder

    run_dir = output_dir / name
    if (holder := lock_holder(run_dir)) is None:
        return False
    statuses[name] = "failed (its run folder is in use by another process)"
    log(f"[sweep]     {name}: not started: {busy_message(run_dir, holder, resume=True)}")
    return True


def _summary_stamp(output_dir: Path, name: str) -> tuple[int, int, int] | None:
    """Which summary.json run ``name``'s folder holds now (None: none), to tell later whether the
    run wrote one (each write replaces the file: another inode, another time)."""
    try:
        st = (output_dir / name / SUMMARY_FILE).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _finished_by_another(output_dir: Path, name: str, before: tuple[int, int, int] | None, statuses: dict[str, str],
                         log: Callable[[str], None]) -> bool:
    """Whether run ``name``, which came back completed, had been finished by another process by
    the time this sweep submitted it (``before``: its :func:`_summary_stamp` then, after
    :func:`_taken_meanwhile` found none): its ServerApp found every round done and left the
    folder alone (:func:`fedvls_flwr.app.results.already_finished`), so the summary.json there
    is the other's. Said as a run taken meanwhile, not as one this sweep ran."""
    if before is None or _summary_stamp(output_dir, name) != before:
        return False
    statuses[name] = "skipped (finished meanwhile, by another process)"
    log(f"[sweep]     {name}: finished meanwhile by another process (another sweep on {output_dir}?), just before "
        "this one started it: left as it was")
    return True


def _outcome_of_another(output_dir: Path, name: str, completed: bool, before: tuple[int, int, int] | None,
                        statuses: dict[str, str], log: Callable[[str], None]) -> bool:
    """Whether a run's outcome was another process's doing, and said so: completed without a
    summary of its own (:func:`_finished_by_another`), or refused because another holds its folder
    (:func:`_held_by_another`) - the window between :func:`_taken_meanwhile` and the run's start."""
    if completed:
        return _finished_by_another(output_dir, name, before, statuses, log)
    return _held_by_another(output_dir, name, statuses, log)


def _said_done(output_dir: Path, name: str, seconds: float, log: Callable[[str], None]) -> None:
    s = json.loads((output_dir / name / SUMMARY_FILE).read_text())
    log(f"[sweep]     {name}: best {100 * s['best_accuracy']:.2f}% (round {s['best_round']}), "
        f"final {100 * s['final_accuracy']:.2f}%, {seconds:.1f}s")


def _run_with_flwr(todo: list, planned: list, output_dir: Path, statuses: dict[str, str], view: ProgressView, *,
                   timeout: float, port_range: tuple[int, int] | None, shared_ray: bool) -> None:
    """Each run a real ``flwr run`` submitted to one SuperLink this sweep starts and stops."""
    log = view.message
    joined = ray_address()
    progress = SweepProgress(output_dir, planned, view)
    try:
        with contextlib.ExitStack() as stack:
            home = output_dir / ".flwr-home"
            env_extra: dict[str, str] = {}
            if joined is not None:
                log(f"[sweep] every run joins the Ray cluster at {joined} (RAY_ADDRESS)")
            elif shared_ray:
                t_ray = time.perf_counter()
                head = stack.enter_context(RayHead(env=flower_env(home)))
                env_extra["RAY_ADDRESS"] = head.address
                log(f"[sweep] one Ray for the whole sweep at {head.address} "
                    f"(started in {time.perf_counter() - t_ray:.1f}s; --no-shared-ray: one per run)")
            link = stack.enter_context(LocalSuperLink(home, port_range=port_range, env_extra=env_extra))
            app = app_folder(output_dir / ".flwr-app")  # the checkout, or (an installed package) a folder naming it
            for i, (run_config, federation, identity) in enumerate(todo, 1):
                log(f"[sweep] ({i}/{len(todo)}) {run_config['run-name']} ...")  # taken meanwhile or not
                if _taken_meanwhile(output_dir, run_config["run-name"], statuses, log):
                    continue
                t0 = time.perf_counter()
                name = _record_start(output_dir, run_config, federation, identity)
                before = _summary_stamp(output_dir, name)
                progress.start(i - 1, output_dir / name)
                run_id = link.submit(app, run_config=run_config, federation_config=federation)
                with progress.following():
                    outcome = link.wait(run_id, timeout=timeout)
                progress.finish(planned[i - 1][1], outcome.status)
                statuses[name] = outcome.status
                if _outcome_of_another(output_dir, name, outcome.completed, before, statuses, log):
                    continue
                if outcome.completed and (output_dir / name / SUMMARY_FILE).exists():
                    _said_done(output_dir, name, time.perf_counter() - t0, log)
                else:
                    (output_dir / f"{name}.failed.log").write_text(outcome.log)
                    log(f"[sweep]     {outcome.status}; log in {name}.failed.log")
    finally:
        progress.close()


def check_machine_room(federations: list[dict[str, Any]], machine: Any = None) -> list[tuple[float, float]]:
    """The runs' distinct (CPUs, GPU share) per client; a PresetError when this machine cannot
    serve one of them at all (a GPU share without a GPU, more CPUs per client than it has)."""
    from fedvls_flwr.ops.resources import detect_machine, resource_problem

    machine = machine or detect_machine()
    asks = sorted({(float(f.get("client-resources-num-cpus", 2.0)), float(f.get("client-resources-num-gpus", 0.0)))
                   for f in federations})
    for cpus, gpus in asks:
        if (problem := resource_problem(cpus, gpus, machine)) is not None:
            raise PresetError(f"{problem} (in --federation-config or the preset's federation; --set "
                              "client-resources-num-cpus=... / client-resources-num-gpus=... sets them for every run)")
    return asks


def machine_shares(federations: list[dict[str, Any]], parallel: int, log: Callable[[str], None],
                   machine: Any = None, runs: int | None = None) -> tuple[int, list[Any]]:
    """How many runs go at once and each one's share of the machine. ``--parallel`` above the
    machine's room (every run at least one client worker at its client resources) is capped,
    and said; so is more than ``runs`` (the runs to do: a share nobody uses is wasted). A run
    the machine cannot serve at all is a PresetError before anything starts."""
    from fedvls_flwr.ops.resources import detect_machine, plan_workers, room_for_runs, share_machine

    machine = machine or detect_machine()
    asks = check_machine_room(federations, machine)
    room = min(room_for_runs(machine, cpus, gpus) for cpus, gpus in asks)
    if parallel > room:
        cpus, gpus = max(asks)
        log(f"[sweep] --parallel {parallel}: this machine ({machine.describe()}) has room for {room} run(s) at once "
            f"with at least one client worker each (client-resources-num-cpus={cpus:g}"
            f"{f', client-resources-num-gpus={gpus:g}' if gpus else ''}): running {room} at once")
        parallel = room
    if runs is not None and 0 < runs < parallel:
        log(f"[sweep] --parallel {parallel}: {runs} run(s) to do, so {runs} at once")
        parallel = runs
    shares = share_machine(machine, parallel)
    nodes = max(int(f.get("num-supernodes", 10)) for f in federations)
    sizes = "; ".join(sorted({plan_workers(shares[0], cpus, gpus, nodes).describe() for cpus, gpus in asks}))
    log(f"[sweep] in-process engine: {parallel} run(s) at once, each with {shares[0].describe()}; a run's clients: "
        f"{sizes} (--engine flwr: flwr run)")
    return parallel, shares


def _run_in_process(todo: list, planned: list, output_dir: Path, statuses: dict[str, str], view: ProgressView, *,
                    timeout: float, parallel: int) -> None:
    """Each run on the in-process engine, in ``parallel`` worker processes that pay their
    start-up once, each in its share of the machine; each run's log is its folder's ``run.log``."""
    from fedvls_flwr.ops.run_pool import Job, RunPool

    log = view.message
    parallel, shares = machine_shares([federation for _, federation, _ in todo], parallel, log, runs=len(todo))
    threads = max(1, int(shares[0].cores))
    jobs, started = [], {}
    submitted: dict[str, tuple[int, int, int] | None] = {}  # each run's summary.json when it was submitted
    for run_config, federation, identity in todo:
        name = run_config["run-name"]
        started[name] = (run_config, federation, identity)
        jobs.append(Job(name, run_config, int(federation.get("num-supernodes", 10)),
                        float(federation.get("client-resources-num-cpus", 2.0)), output_dir / name / RUN_LOG, timeout,
                        float(federation.get("client-resources-num-gpus", 0.0))))
    index = {job.key: i for i, job in enumerate(jobs)}
    progress = SweepProgress(output_dir, planned, view) if parallel == 1 else None
    pending, done = list(jobs), 0
    try:
        with RunPool(workers=parallel, threads=threads, shares=shares) as pool:
            while pending or pool.free < parallel:
                while pending and pool.free > 0:
                    job = pending.pop(0)
                    log(f"[sweep] ({index[job.key] + 1}/{len(jobs)}) {job.key} ...")  # taken meanwhile or not
                    if _taken_meanwhile(output_dir, job.key, statuses, log):
                        done += 1
                        continue
                    _record_start(output_dir, *started[job.key])  # the folder appears when its run starts
                    if progress is not None:
                        progress.start(index[job.key], job.log.parent)
                    submitted[job.key] = _summary_stamp(output_dir, job.key)
                    pool.submit(job)
                if progress is not None:
                    progress.poll()
                for outcome in pool.wait(poll=0.5):
                    done += 1
                    statuses[outcome.key] = outcome.status
                    if progress is not None:
                        progress.poll()  # the rounds that ended since the last look
                        progress.finish(planned[index[outcome.key]][1], outcome.status)
                    completed = outcome.status == "completed"
                    if _outcome_of_another(output_dir, outcome.key, completed, submitted[outcome.key], statuses, log):
                        pass
                    elif completed and (output_dir / outcome.key / SUMMARY_FILE).exists():
                        _said_done(output_dir, outcome.key, outcome.seconds, log)
                    else:
                        log(f"[sweep]     {outcome.key}: {outcome.status} ({outcome.error}); log in "
                            f"{outcome.key}/{RUN_LOG}")
                    if parallel > 1:
                        log(f"[sweep] {done}/{len(jobs)} runs done")
    finally:
        if progress is not None:
            progress.close()


def kept_after_stop(preset: Preset, output_dir: Path, argv: list[str]) -> str:
    """What a stopped sweep keeps (its finished runs, the last saved round of the one going) and
    the command that continues it (the same one: finished runs are skipped, the others resume).
    Stopped with every run finished (in its report): that the same command writes the report,
    not a run "stopped midway" that there is not."""
    from fedvls_flwr.ops.processes import shell_word

    names = [r["run-name"] for r in preset.runs]
    twins = _finished_runs(output_dir) if output_dir.is_dir() else {}
    finished = 0
    for overrides in preset.runs:  # finished under its own name, or as another preset's same run
        identity = _run_identity(preset, overrides)[2]
        finished += _completed(output_dir / overrides["run-name"]) or _identity_key(identity) in twins
    again = " ".join(["fedvls", "sweep", *map(shell_word, argv)])
    if finished == len(names):  # stopped in its report: no run is midway, the report may be missing or partial
        return (f"all {_runs(len(names))} are finished in {output_dir}; to write its report "
                f"({sweep_report_dir(preset, output_dir)}; the finished runs are skipped): {again}")
    return (f"{finished} of {len(names)} runs are finished in {output_dir}, and a run stopped midway keeps its "
            f"saved rounds; to continue (finished runs are skipped, the others resume): {again}")


def _completed(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / SUMMARY_FILE).read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


def _runs(count: int) -> str:
    return f"{count} run" + ("" if count == 1 else "s")


def output_dir_problem(output_dir: Path) -> str | None:
    """Why a sweep cannot write its runs into ``output_dir`` (said before anything starts), or None."""
    existing = output_dir.expanduser()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir():
        return None
    where = "is a file" if existing == output_dir.expanduser() else f"cannot be created: {existing} is a file"
    return f"{where}; give a folder: a new one, or the one that holds this preset's runs"


def select_runs(preset: Preset, only: dict[str, Any]) -> Preset:
    """The preset restricted to runs whose settings match every ``only`` item."""
    if not only:
        return preset
    defaults = RunConfig().to_flower()
    _check_keys(preset.path, "--only key", only, [*defaults, *FEDERATION_KEYS])
    keep = [r for r in preset.runs if all(r.get(k, defaults.get(k)) == v for k, v in only.items())]
    if not keep:
        raise PresetError(f"--only {only}: no run of preset {preset.name} matches")
    return dataclasses.replace(preset, runs=keep)


def _seeds(text: str) -> list[int]:
    """``--seeds 0,1,2``: distinct integers (a seed twice would run one experiment twice)."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise PresetError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if (twice := next((s for s in seeds if seeds.count(s) > 1), None)) is not None:
        raise PresetError(f"--seeds {text!r}: seed {twice} is given twice (one seed, one run); give each once")
    return seeds


def _seconds_or_zero(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 30)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text}: give a number of seconds >= 0 (0: a line every round)")
    return value


def _parse_sets(items: list[str], option: str = "--set") -> dict[str, Any]:
    """``KEY=VALUE`` items (several per argument allowed, YAML values); an item without a
    value or without ``=`` is an error naming it (fedvls_flwr.config.args)."""
    def value(key: str, text: str) -> Any:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise PresetError(f"{option} {key}={text}: the value is not valid YAML ({err})") from None

    return parse_items(items, option, value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fedvls sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", help="a YAML preset, e.g. conf/table1-mnist10k.yaml")
    parser.add_argument("--output-dir", "-o",
                        help="where runs go, and the report of this preset's runs (default: ~/fedvls-runs/<preset name>)")
    parser.add_argument("--seeds", help="comma-separated seeds, replacing the preset's")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a run-config key in every run; repeatable, and one --set may hold several "
                             "items ('lr=0.05 local-epochs=1'); each key once")
    parser.add_argument("--timeout", type=seconds, default=3600.0, metavar="SECONDS",
                        help="seconds per run before it is stopped (default: %(default)g)")
    parser.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                        help="run only the preset's runs with this setting (repeatable: all must match)")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the runs, check what the sweep would check before its first run (the output "
                             "folder, the report folder, finished and interrupted runs, the machine's room, "
                             "RAY_ADDRESS; not the datasets) and exit; writes nothing")
    parser.add_argument("--progress-every", type=_seconds_or_zero, default=30.0, metavar="SECONDS",
                        help="when stdout is not a terminal: a progress line per round, at most one per SECONDS "
                             "(0: every round); in a terminal the progress is one live line")
    parser.add_argument("--port-range", metavar="LO-HI",
                        help="--engine flwr only: take the SuperLink's port from LO-HI (shared hosts, firewalls); "
                             "Ray picks its own internal ports")
    parser.add_argument("--engine", choices=("inprocess", "flwr"),
                        help="inprocess (the default on one machine): every run in worker processes that start "
                             "once; flwr (the default when RAY_ADDRESS is set): every run a real flwr run on a "
                             "local SuperLink and Ray (docs/running.md, 'Which engine')")
    parser.add_argument("--parallel", type=int, default=1, metavar="N",
                        help="in-process engine: N runs at once, each with 1/N of the machine's cores and GPUs, "
                             "capped at the machine's room (default 1: one run at a time, its clients training "
                             "at once on every core and GPU its federation config gives room for)")
    parser.add_argument("--no-shared-ray", action="store_true",
                        help="let each run start (and stop) its own Ray, instead of one Ray head on 127.0.0.1 "
                             "that every run of the sweep joins; with RAY_ADDRESS set, every run joins that "
                             "cluster either way (docs/ray-cluster.md)")
    args = parser.parse_args(argv)
    engine = args.engine or ("flwr" if ray_address() is not None else "inprocess")
    if args.parallel < 1:
        parser.error(f"--parallel {args.parallel}: give the number of runs at once, 1 or more")
    if args.port_range and engine != "flwr":
        print("note: --port-range is the SuperLink's port range, for --engine flwr; the in-process engine (the "
              "default without RAY_ADDRESS) opens no port and ignores it", file=sys.stderr)
    if args.parallel > 1 and engine != "inprocess":
        parser.error("--parallel runs several runs at once on the in-process engine; with --engine flwr "
                     "(or RAY_ADDRESS set) the runs share one SuperLink and run one after another")
    try:
        port_range = parse_port_range(args.port_range)
        seeds = None if args.seeds is None else _seeds(args.seeds)
        preset = load_preset(args.preset, sets=_parse_sets(args.set), seeds=seeds)
        preset = select_runs(preset, _parse_sets(args.only, "--only"))
    except (PresetError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # '~' expanded here too: bash leaves it as typed in --output-dir=~/runs or -o '~/runs'
    output_dir = Path(args.output_dir or Path("~/fedvls-runs") / preset.name).expanduser()
    if args.dry_run:
        for overrides in preset.runs:
            print(overrides["run-name"], json.dumps(overrides))
    if problem := output_dir_problem(output_dir):
        print(f"error: --output-dir {output_dir}: {problem}", file=sys.stderr)
        return 2
    if engine == "flwr" and (missing := ray_missing()) is not None:
        why = "--engine flwr" if args.engine else "RAY_ADDRESS is set, so the sweep runs on --engine flwr"
        print(f"error: {why}: every run is a flwr run in Flower's Ray simulation, but {missing}. Install it "
              "(pip install \"flwr[simulation]\"; scripts/setup.sh does), or run the sweep in-process: "
              "--engine inprocess", file=sys.stderr)
        return 2
    if args.dry_run:  # what the sweep would find before its first run, without loading a dataset
        try:
            plan = plan_sweep(preset, output_dir, data=False, engine=engine)
        except (PresetError, ConfigError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        from fedvls_flwr.app.results import holds_run

        stopped = sum(holds_run(output_dir.resolve() / config["run-name"]) for config, _, _ in plan.todo)
        print(f"dry run: {_runs(len(preset.runs))} in {output_dir}: {len(plan.statuses)} finished (skipped), {stopped} "
              f"stopped midway (they continue from their last checkpoint), {len(plan.todo) - stopped} new; the "
              "datasets and splits are checked when the sweep starts", file=sys.stderr)
        return 0
    try:
        result = run_preset(preset, output_dir, timeout=args.timeout, port_range=port_range,
                            view=ProgressView.for_terminal(every=args.progress_every), shared_ray=not args.no_shared_ray,
                            engine=engine, parallel=args.parallel)
    except (PresetError, ConfigError, FileNotFoundError, PortRangeError, RayClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. a full disk: the path is in the message; finished runs are kept
        fix = ("free space (or choose another --output-dir after moving the folder)" if err.errno in
               (errno.ENOSPC, errno.EDQUOT) else "fix that")
        print(f"error: {err}. Runs that finished are kept; {fix} and run the same command again to continue.",
              file=sys.stderr)
        return 2
    except BaseException as stop:  # Ctrl-C, SIGTERM: the command's one line says what is kept
        if stop_signal(stop) is not None:
            say_what_is_kept(stop, kept_after_stop(preset, output_dir, sys.argv[1:] if argv is None else argv))
        raise
    failed = [name for name, status in result["statuses"].items() if "failed" in status or "timeout" in status]
    return 1 if failed else 0


if __name__ == "__main__":
    from fedvls_flwr.ops.processes import stopped_cleanly_on_termination

    with stopped_cleanly_on_termination("fedvls sweep"):
        raise SystemExit(main())
