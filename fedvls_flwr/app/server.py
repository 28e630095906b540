"""The server's side of an experiment: initial model, rounds, evaluation, result files.

After every round the global model (``checkpoint.npz``, which records its round; arrays that
stopped changing go once to the frozen file it names, :meth:`RunWriter.save_checkpoint`),
``rounds.jsonl`` and ``state.json`` (the last completed round) are replaced atomically. They
are written on a thread of their own while the next round trains (three fsynced replacements
cost about 20 ms, a third of a FedConcat head round's wall time), at most one round's files at
a time: a killed server loses at most the round in progress and, when it is killed while they
are being written, the files of the round before it; ``resume = true`` continues from the last
round on disk, in the same folder or after the folder was moved (``output-dir`` may change).
Every way out of a run (its end, an error, Ctrl-C) waits for the files being written. A
result file that cannot be written (a full disk) stops the run, at the next round's end at the
latest, with a message naming the file, the last round that is safe and how to continue. With ``tracking`` set, each round's
record also goes to the tracker right after rounds.jsonl (:mod:`fedvls_flwr.app.tracking`);
the log line of each round ends with the run's time left (:mod:`fedvls_flwr.app.time_left`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedvls_flwr.algorithms.batchnorm import feature_map_problem, smallest_batchnorm_map
from fedvls_flwr.algorithms.device import gpu_left_unused, set_deterministic, use_amp
from fedvls_flwr.algorithms.diagnostics import local_update_view
from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.algorithms.training import evaluate, resolve_device
from fedvls_flwr.app.events import ROUND_END, emit
from fedvls_flwr.app.messages import is_simulation, npy_payloads, runs_on_ray, to_array_record
from fedvls_flwr.app.ray_address import (
    check_ray_address,
    ray_address,
    simulation_federation,
    simulation_room_problem,
)
from fedvls_flwr.app.results import (
    CONFIG_FILE,
    FROZEN_FILE_PREFIX,
    RESUMABLE_CHANGES,
    STATE_FILE,
    RunFolderLock,
    RunWriter,
    already_finished,
    atomic_write_json,
    holds_run,
    jsonable,
    missing_run_folder,
    read_resume_point,
    summarize,
)
from fedvls_flwr.app.site_counts import KnownClassCounts, with_mean_vacant
from fedvls_flwr.app.strategy import RoundReport, RunStrategy
from fedvls_flwr.app.time_left import RoundClock, format_duration
from fedvls_flwr.app.tracking import check_tracking, open_tracker
from fedvls_flwr.config.registry import combination_label
from fedvls_flwr.config.run_config import ConfigError, RunConfig, model_name
from fedvls_flwr.config.unmeant import rounds_warning
from fedvls_flwr.data.datasets import DatasetBundle, DatasetNotFoundError, image_format
from fedvls_flwr.data.node_data import dataset_for

#: What the run folder keeps about a protocol with state of its own (FedConcat's clusters).
PROTOCOL_FILE = "protocol.json"

__all__ = ["RESUMABLE_CHANGES", "PROTOCOL_FILE", "ResultsWriteError", "run_dir_for", "run_experiment"]


class ResultsWriteError(RuntimeError):
    """A result file could not be written (e.g. a full disk); says what is safe and how to go on."""


def run_dir_for(cfg: RunConfig) -> Path:
    return cfg.resolved_output_dir() / (cfg.run_name or cfg.default_run_name())


def _resume_point(cfg: RunConfig, run_dir: Path) -> tuple[int, dict | None, list[dict]]:
    """(last completed round, its global arrays, its rounds) of a run folder, or (0, None, [])."""
    if not cfg.resume or not holds_run(run_dir):
        if cfg.resume:
            log(WARNING, "resume = true but %s holds no checkpoint; starting from round 1", run_dir)
        elif holds_run(run_dir):
            raise ConfigError(
                f"run folder {run_dir} already holds a run; set resume=true to continue it "
                "or choose another run-name / output-dir"
            )
        return 0, None, []
    point = read_resume_point(run_dir, cfg.to_flower())
    for note in point.notes:
        log(WARNING, "resume: %s", note)
    return point.round, point.arrays, point.rounds


def _write_failed(err: OSError, cfg: RunConfig, run_dir: Path, saved_round: int, total: int) -> ResultsWriteError:
    """The message for a result file that could not be written after ``saved_round``."""
    path = err.filename or run_dir
    how = (f"free space there, or move the folder {run_dir} to a disk with room, then start the same "
           f"run config with resume=true run-name='{run_dir.name}' (plus output-dir='<the folder it now "
           "lies in>' if you moved it)")
    if saved_round >= total:
        safe = (f"All {total} rounds are complete and safe in {run_dir} (checkpoint.npz, rounds.jsonl); "
                f"only the final files are missing. To write them: {how}.")
    elif saved_round > 0:
        # the frozen file the checkpoint takes its unchanging arrays from belongs to what is safe
        frozen = "".join(f", {p.name}" for p in sorted(run_dir.glob(f"{FROZEN_FILE_PREFIX}*.npz")))
        safe = (f"The results up to round {saved_round} of {total} are complete and safe in {run_dir} "
                f"(checkpoint.npz{frozen}, rounds.jsonl, state.json). To continue after round {saved_round}: {how}.")
    else:
        safe = (f"No round had been completed and saved yet, so nothing computed is lost: {how} "
                "(or just start it again).")
    return ResultsWriteError(f"could not write {path}: {err.strerror or err}. {safe}")


def _flower_run(grid: Grid, run_id: int | None) -> str:
    """How a refused run should name this one, beside its process: the Flower run (``flwr stop``
    ends it); nothing for the in-process engine, whose command line says it all. (The grid's
    class is asked, not the grid: nothing of the grid is used before the config is judged.)"""
    if run_id is None or getattr(type(grid), "every_node_registered", False):
        return ""
    return f"Flower run {run_id}: flwr stop {run_id} ends it"


def engine_of(grid: Grid) -> str:
    """Which engine runs the clients, as summary.json records it: ``inprocess`` (``fedvls run``, a
    sweep's default), ``simulation`` (Flower's Ray simulation, ``flwr run``) or ``deployment``
    (SuperNodes). Deterministic runs compute the same on the first two; a report tells them apart."""
    if getattr(grid, "every_node_registered", False):
        return "inprocess"
    return "simulation" if runs_on_ray(grid) else "deployment"


def run_experiment(grid: Grid, cfg: RunConfig, run_id: int | None = None) -> Path:
    """Run every round of ``cfg`` on ``grid``; returns the run folder. ``run_id``: Flower's id of
    the run (the ServerApp's Context has it), named to a run refused on the same folder."""
    return ServerRun(grid, cfg, run_id).run()


class ServerRun:
    """One experiment on the server: its folder, test set and model, the strategy's rounds,
    and what is saved after each. ``saved_round`` is the last round whose checkpoint, rounds
    and state are all on disk: every message about a failure is built from it. A round's files
    are written by ``saver`` (one thread) while the next round trains; ``saving`` is the
    round being written, whose outcome :meth:`finish_saving` waits for."""

    def __init__(self, grid: Grid, cfg: RunConfig, run_id: int | None = None) -> None:
        self.t_start = time.perf_counter()
        self.grid, self.cfg = grid, cfg
        check_tracking(cfg)  # a missing tracker package: said before the dataset or a round
        if runs_on_ray(grid) and (joined := ray_address()) is not None and (problem := check_ray_address(joined)):
            # Logged, not only raised: Flower 1.41 keeps a ServerApp's exception until its Ray backend's
            # ray.init returns, and ray.init keeps retrying an address nothing answers (docs/ray-cluster.md)
            message = (f"this simulation was started with {problem}. No round will start: stop this run "
                       "(flwr stop <run-id>), fix RAY_ADDRESS in the SuperLink's environment and submit it again")
            log(ERROR, "%s", message)
            raise ConfigError(message)
        if runs_on_ray(grid) and (federation := simulation_federation()) is not None and (
                problem := simulation_room_problem(federation)) is not None:
            # Flower would fail only once round 1 waits for clients ("ActorPool is empty"), with a traceback
            message = f"{problem}. No round will start: submit the run again with client resources that fit"
            log(ERROR, "%s", message)
            raise ConfigError(message)
        self.run_dir = run_dir_for(cfg)
        if cfg.resume and (missing := missing_run_folder(self.run_dir)):
            raise ConfigError(missing)  # (server_app says it before any heavy import; run_experiment's callers here)
        # one run per folder, for the run's life: a second run on it is refused now, naming this one
        self.lock = RunFolderLock(self.run_dir, what=_flower_run(grid, run_id), resume=cfg.resume).acquire()
        self.finished: str | None = None  # resumed with no round left: what run() says instead of running
        try:
            self._open(grid, cfg)
        except BaseException:
            self.lock.release()
            raise

    def _open(self, grid: Grid, cfg: RunConfig) -> None:
        """The folder taken: the resume point, the test set, the model, the result files."""
        if (stale := self.lock.took_over_note()) is not None:
            log(WARNING, "%s", stale)
        self.start_round, saved_arrays, saved_rounds = _resume_point(cfg, self.run_dir)
        self.saved_round = self.start_round
        if cfg.resume and (done := already_finished(self.run_dir, self.start_round, cfg.num_server_rounds, cfg.tracking)):
            with self.results_written():  # a tracker asked for (e.g. added on resume): its files, as any resume writes them
                if (tracker := open_tracker(cfg, self.run_dir, saved_rounds)) is not None:
                    tracker.close()
            self.finished = done
            return  # nothing more is read or written (run() says so)
        self.saving: Future[None] | None = None
        self.saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedvls-round-files")
        self.bundle = server_test_set(cfg)
        if (unmeant := rounds_warning(cfg, None if self.bundle is None else len(self.bundle.train_y))) is not None:
            log(WARNING, "%s", unmeant)
        self.evaluation = "server" if self.bundle is not None else "federated"
        if self.bundle is not None:
            self.input_shape, self.num_classes = tuple(self.bundle.input_shape), self.bundle.num_classes
        else:  # federated evaluation: the model's shape comes from the dataset's format
            fmt = image_format(cfg.dataset)
            self.input_shape, self.num_classes = tuple(fmt.shape), fmt.num_classes
        set_deterministic(cfg.deterministic)
        self.device = server_device(cfg)
        torch.manual_seed(cfg.seed)
        self.model = build_run_model(cfg, self.input_shape, self.num_classes)
        # before any round: a 1x1 map at a BatchNorm layer warns (batch-size 1 there: ConfigError)
        smallest = smallest_batchnorm_map(self.model, self.input_shape)
        note = feature_map_problem(smallest, model_name(cfg), self.input_shape, cfg.batch_size)
        if note:
            log(WARNING, "%s", note)
        with self.results_written():
            self.writer = RunWriter(self.run_dir)
            self.writer.rounds = saved_rounds
            atomic_write_json(self.run_dir / CONFIG_FILE, cfg.to_flower())
            if self.start_round:  # repairs a stale or damaged state.json (see read_resume_point)
                atomic_write_json(self.run_dir / STATE_FILE, {"round": self.start_round})
            # holds the rounds rounds.jsonl keeps (a resumed run's), each once
            self.tracker = open_tracker(cfg, self.run_dir, saved_rounds)
        self.clock = RoundClock(cfg.num_server_rounds)
        self.label = combination_label(cfg.to_flower())
        log(INFO, "%s on %s (%s), %s evaluation, results in %s",
            self.label, cfg.dataset, model_name(cfg), self.evaluation, self.run_dir)
        if runs_on_ray(grid):  # Flower 1.41 warns "default simulated SuperNodes changed from 10 to 2" in every one
            log(INFO, "federation: %d simulated SuperNodes (Flower's warning above is about its default, said in "
                "every simulation; the size is --federation-config \"num-supernodes=N\")", len(list(grid.get_node_ids())))
        self.strategy = RunStrategy(cfg)
        self.strategy.bind_model(self.model)
        self.saved_arrays = None if saved_arrays is None else self.strategy.load_server_state(saved_arrays)
        self.clients: dict[int, list[int]] = {}  # partition id -> class counts, as clients.json keeps them
        self.class_counts = KnownClassCounts(cfg, is_simulation(grid), lambda: len(list(grid.get_node_ids())))

    @contextmanager
    def results_written(self) -> Iterator[None]:
        """A result file that cannot be written stops the run with what is safe and how to go on."""
        try:
            yield
        except OSError as err:
            raise _write_failed(err, self.cfg, self.run_dir, self.saved_round, self.cfg.num_server_rounds) from err

    def evaluate_global(self, arrays: ArrayRecord, server_round: int = 0) -> dict:
        """The accuracy a round reports, of the model the strategy says to evaluate (the server
        optimizer's choice of arrays, FedExP may average the last two, as the protocol builds
        it; none to test in FedConcat's first stage)."""
        state = self.strategy.evaluation_arrays(arrays)
        if self.bundle is None:
            return {**self.strategy.evaluate_federated(self.grid, to_array_record(state), server_round),
                    "evaluation": "federated"}
        model = self.strategy.evaluation_model(state, server_round)
        if model is None:
            return {"accuracy": None, "loss": None, "per_class_accuracy": None, "evaluation": "none"}
        res = evaluate(
            model, self.bundle.test_x, self.bundle.test_y, self.bundle.num_classes, device=self.device,
            batch_size=self.cfg.eval_batch_size, mean=self.bundle.mean, std=self.bundle.std, amp=use_amp(self.cfg, self.device),
        )
        return {
            "accuracy": res.accuracy, "loss": res.loss, "per_class_accuracy": res.per_class_accuracy,
            "evaluation": "server",
        }

    def round_record(self, server_round: int, metrics: dict, report: RoundReport, t_eval: float) -> dict:
        """One line of rounds.jsonl: the evaluation, the clients' training, failures, seconds."""
        record = {
            "round": server_round,
            **self.strategy.round_info(server_round),
            **metrics,
            "train": with_mean_vacant(report.train_metrics, report.clients, self.class_counts.of(report.clients)),
            "drift_diversity": report.drift_diversity,
            **report.server_parts,
            "clients_sampled": report.sampled,
            "sampled_partitions": self.strategy.partitions_of(report.sampled_nodes),
            "clients_accepted": report.accepted,
            "clients_failed": len(report.failed),
            "clients_rejected": len(report.rejected),
            "reply_metrics": sorted(report.reply_metrics),
            "attempts": report.attempts,
            "failures": report.failed + report.rejected,
            "seconds": report.seconds + (time.perf_counter() - t_eval),
            "devices": count_by(report.clients, "device"),
            # accepted training replies per machine (Ray node id in a simulation, host name in deployment)
            "nodes": count_by(report.clients, "ran_on"),
            "peak_gpu_mb": max((c["peak_gpu_mb"] for c in report.clients if "peak_gpu_mb" in c), default=None),
        }
        previous_global = self.writer.rounds[-1]["per_class_accuracy"] if self.writer.rounds else None
        counts = self.class_counts.of(report.clients)
        local = [
            (counts[c["partition_id"]], c["local_per_class_accuracy"])
            for c in report.clients if "local_per_class_accuracy" in c and c.get("partition_id") in counts
        ]
        if local and previous_global is not None:
            record["local_update"] = local_update_view(local, previous_global)
        return record

    def _append_round(self, record: dict) -> None:
        """rounds.jsonl, then the tracker (with the record as rounds.jsonl holds it)."""
        self.writer.append_round(record)
        if self.tracker is not None:
            self.tracker.log_round(self.writer.rounds[-1])

    def save_round(self, server_round: int, record: dict, arrays: ArrayRecord, report: RoundReport) -> None:
        """The round's files, written by ``saver`` from what the round holds now (its record,
        the global arrays' bytes, the server parts' state, copied here): rounds.jsonl first,
        then the checkpoint (which records its round), then the state that points at both. A
        kill or a full disk between two writes leaves a checkpoint whose round rounds.jsonl
        holds (read_resume_point sorts out a stale state.json)."""
        new = self.class_counts.of(report.clients)
        clients = None
        if any(pid not in self.clients for pid in new):
            self.clients.update(new)
            clients = dict(self.clients)
        checkpoint = {**npy_payloads(arrays),
                      **{key: np.array(value, copy=True) for key, value in self.strategy.server_state().items()}}
        self.finish_saving()
        try:
            self.saving = self.saver.submit(self._write_round, server_round, jsonable(record), checkpoint, clients)
        except RuntimeError:  # the interpreter is exiting (Flower ends its simulation's process): no new thread
            with self.results_written():
                self._write_round(server_round, jsonable(record), checkpoint, clients)

    def _write_round(self, server_round: int, record: dict, checkpoint: dict, clients: dict[int, list[int]] | None) -> None:
        if clients is not None:
            self.writer.write_clients(self.num_classes, clients)
        self._append_round(record)
        self.writer.save_checkpoint(checkpoint, server_round)
        atomic_write_json(self.run_dir / STATE_FILE, {"round": server_round})
        self.saved_round = server_round

    def finish_saving(self) -> None:
        """Wait for the round being written; a file it could not write stops the run here (with
        what is safe: ``saved_round`` is the round before it). A Ctrl-C while waiting leaves the
        write to :meth:`settle_saving`, which still reports how it ended."""
        saving = self.saving
        if saving is None:
            return
        try:
            with self.results_written():
                saving.result()
        finally:
            if saving.done():
                self.saving = None

    def settle_saving(self) -> BaseException | None:
        """Wait for the round being written on a way out that already has its reason (an error,
        Ctrl-C); what the write raised, if anything (``saved_round`` is still the round before)."""
        saving, self.saving = self.saving, None
        return None if saving is None else saving.exception()

    def _unwritten_warning(self, err: BaseException) -> None:
        log(WARNING, "round %d's files were not all written either (%s); the run folder holds round %d",
            self.saved_round + 1, err, self.saved_round)

    def on_round_end(self, server_round: int, arrays: ArrayRecord, report: RoundReport) -> None:
        self.finish_saving()  # the round before, written while this one trained (outside its seconds, as before)
        t_eval = time.perf_counter()
        metrics = self.evaluate_global(arrays, server_round)
        record = self.round_record(server_round, metrics, report, t_eval)
        self.save_round(server_round, record, arrays, report)
        self.clock.observe(server_round)
        left = self.clock.steady_left()
        log(
            INFO, "round %d/%d: accuracy %s  loss %s  train-loss %s  clients %d/%d on %s  %.2fs  %s",
            server_round, self.cfg.num_server_rounds, _fmt(metrics["accuracy"]), _fmt(metrics["loss"]),
            f"{report.train_metrics.get('train-loss', float('nan')):.4f}",
            report.accepted, report.sampled, _devices_text(record), record["seconds"],
            f"~{format_duration(left)} left" if left is not None else f"time left: after round {server_round + 1}",
        )
        emit(ROUND_END, round=server_round, accuracy=metrics["accuracy"], seconds=record["seconds"], seconds_left=left)

    def initial_arrays(self) -> ArrayRecord:
        """Round 0: the fresh model, evaluated and recorded; or the checkpoint to resume from."""
        if self.saved_arrays is not None:
            log(INFO, "%s: resuming after round %d of %d", self.label, self.start_round, self.cfg.num_server_rounds)
            return to_array_record(self.saved_arrays)
        model_arrays = {k: v.detach().cpu().numpy() for k, v in self.model.state_dict().items()}
        state = self.strategy.initial_state(self.grid, model_arrays)
        initial = to_array_record(state) if state is not model_arrays else ArrayRecord(
            {k: v.detach().cpu() for k, v in self.model.state_dict().items()})
        round0 = {"round": 0, **self.strategy.round_info(0), **self.evaluate_global(initial), "seconds": 0.0}
        with self.results_written():
            if (about := self.strategy.describe(state)) is not None:
                atomic_write_json(self.run_dir / PROTOCOL_FILE, about)
            self._append_round(round0)
        if self.evaluation == "federated" and not round0.get("eval_nodes"):
            log(WARNING, "no node evaluated the initial model - none answered with a local test "
                "split (node config test-fraction > 0), or their evaluation failed (see the nodes' errors): "
                "unless that changes, this run evaluates nothing and every round reports accuracy n/a")
        return initial

    def check_client_devices(self) -> None:
        """Before round 1, when a GPU is wanted (``device = "cuda"``, or ``"auto"`` and this
        process sees one): ask every node which device it would train on, and stop (cuda) or
        warn (auto) when some would not - Ray gives a simulated client no GPU unless the
        federation asks for one. CPU runs send no extra message."""
        if self.cfg.device == "cpu" or (self.cfg.device == "auto" and not torch.cuda.is_available()):
            return
        devices = self.strategy.client_devices(self.grid)
        problem = gpu_left_unused(self.cfg.device, torch.cuda.is_available(), devices, is_simulation(self.grid))
        if problem is not None and problem.error:
            raise ConfigError(problem.message)
        if problem is not None:
            log(WARNING, "%s", problem.message)

    def run(self) -> Path:
        if self.finished is not None:
            self.lock.release()
            log(INFO, "%s", self.finished)
            return self.run_dir
        try:
            self.check_client_devices()
            initial = self.initial_arrays()
            self.clock.start(self.start_round)
            final = self.strategy.run(
                self.grid, initial, on_round_end=self.on_round_end, start_round=self.start_round + 1
            )
            self.finish_saving()
            with self.results_written():
                self.writer.save_model(npy_payloads(final))
                summary = self.summary(self.writer.rounds, status="completed", resumed_after_round=self.start_round)
                self.writer.write_summary(summary)
        except Exception as err:
            # Never claim more than the checkpoint holds: rounds after saved_round are not on disk
            # as a whole (rounds.jsonl may hold one the checkpoint does not).
            stop: Exception = err
            unwritten = self.settle_saving()
            if isinstance(unwritten, OSError):
                # The round before the failure never reached the disk: the failure's own text
                # (a failed round says the round before it is saved) would claim one round too
                # many; the disk's message names the file and the round that is safe.
                log(WARNING, "%s", err)
                stop = _write_failed(unwritten, self.cfg, self.run_dir, self.saved_round, self.cfg.num_server_rounds)
            elif unwritten is not None:
                self._unwritten_warning(unwritten)
            saved = [r for r in self.writer.rounds if r["round"] <= self.saved_round]
            try:
                self.writer.write_summary(self.summary(saved, status="failed", error=str(stop)))
            except OSError as write_err:
                log(WARNING, "summary.json not written either (%s)", write_err)
            if stop is err:
                raise
            raise stop from err
        finally:
            if (unwritten_at_exit := self.settle_saving()) is not None:  # Ctrl-C: the round being written is still written
                self._unwritten_warning(unwritten_at_exit)
            self.saver.shutdown(wait=True)
            if self.tracker is not None:
                self.tracker.close()
            self.lock.release()
        log(INFO, "%s run done - best accuracy %s (round %s), final %s; %s", self.label,
            _fmt(summary["best_accuracy"]), summary["best_round"], _fmt(summary["final_accuracy"]), self.run_dir)
        return self.run_dir

    def summary(self, rounds: list[dict], **extra: Any) -> dict:
        return {
            "config": self.cfg.to_flower(),
            "run_dir": str(self.run_dir),
            "engine": engine_of(self.grid),
            "model": model_name(self.cfg),
            "evaluation": self.evaluation,
            "num_train_pool": None if self.bundle is None else int(self.bundle.train_y.shape[0]),
            "num_test": None if self.bundle is None else int(self.bundle.test_y.shape[0]),
            **summarize(rounds),
            # what the sites' training replies carried in the whole run (docs/methods.md, "What a site shares"):
            # earlier sessions' rounds, and this session's - a round that failed (not in rounds) included
            "reply_metrics": sorted({name for r in rounds for name in r.get("reply_metrics", ())}
                                    | self.strategy.reply_metric_names),
            "rounds_completed": max((r["round"] for r in rounds), default=0),
            "wall_seconds": time.perf_counter() - self.t_start,
            **extra,
        }


def count_by(clients: list[dict], key: str) -> dict[str, int]:
    """How many of a round's accepted replies said each value of ``key`` (device, node)."""
    return dict(Counter(c[key] for c in clients if key in c))


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _devices_text(record: dict) -> str:
    """``cpu``, ``cuda:0 (NVIDIA H100) x4, peak GPU 812 MiB``: where the round's clients trained."""
    devices: dict[str, int] = record.get("devices") or {}
    text = ", ".join(d if len(devices) == 1 and n == 1 else f"{d} x{n}" for d, n in devices.items()) or "?"
    if len(nodes := record.get("nodes") or {}) > 1:
        text += f" ({len(nodes)} nodes)"
    return text + ("" if record.get("peak_gpu_mb") is None else f", peak GPU {record['peak_gpu_mb']:.0f} MiB")


def server_device(cfg: RunConfig) -> torch.device:
    """Where the ServerApp evaluates (``server-device``; ``auto`` follows ``device = "cpu"``)."""
    if cfg.server_device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run config 'server-device' = 'cuda' but torch sees no CUDA device in the ServerApp's "
                          "process; use server-device='auto' or 'cpu'")
    if cfg.server_device == "cpu" or (cfg.server_device == "auto" and cfg.device == "cpu"):
        return torch.device("cpu")
    return resolve_device("auto")


def server_test_set(cfg: RunConfig) -> DatasetBundle | None:
    """The run dataset (with its test split) when the server has it, per ``evaluation``."""
    if cfg.evaluation == "federated":
        return None
    try:
        return dataset_for(cfg)
    except DatasetNotFoundError as err:
        if cfg.evaluation == "server":
            raise
        log(WARNING, "the server has no %s test set (%s); evaluating on the nodes' "
            "local test splits instead (node config test-fraction)", cfg.dataset, str(err).splitlines()[0])
        return None
