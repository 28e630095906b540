"""What each part of a run costs: local objectives and local optimizers per training step,
server optimizers per round, against FedAvg.

    python bench/bench_parts.py                 # 1 thread, median of 5
    python bench/bench_parts.py --repeats 3
    python bench/bench_parts.py --write docs/performance.md   # the tables into the page

Local side: the app's own training loop (``fedvls_flwr.algorithms.training.train_local``) on one
client of the paper's MNIST setting - the 784-200-200-10 MLP, batch 64, one thread,
SGD with momentum, 5 local epochs - with the class counts of a Dirichlet-0.05 client
(6 of 10 classes vacant, so every FedVLS term runs) on 1,024 random 28x28 inputs. The
time of a whole round divided by its steps, so the once-per-round teacher forward is
included. MOON is timed in a client's second round (its previous model present).

FedGF is timed from its second round on: the client receives a perturbed global model and
c = 0.3 (its first round, with nothing received, is FedSAM's step). FedConcat's stage 1 is a
cluster model's ordinary training; its stage 2 is timed as a client's head round (3
mini-batches on the head over the K frozen encoders, building the concatenated model included).

Server side: one ``step`` of each server optimizer on the MLP's arrays with 10 clients'
replies (the checked average is computed before and not timed); for FedGF, its server
companion's ``observe`` and ``downlink`` (D, w_g and c) on top of FedAvg's average.

Prints Markdown tables; ``--write PAGE`` also puts them between the page's two markers
(``<!-- bench_parts tables: ... -->`` and ``<!-- end bench_parts tables -->``). Repeats are
interleaved across configurations so a busy machine distorts the comparison less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedvls_flwr.algorithms.aggregation import Reply, weighted_average  # noqa: E402
from fedvls_flwr.algorithms.downlink import Received  # noqa: E402
from fedvls_flwr.algorithms.fedgf import FedGFServer  # noqa: E402
from fedvls_flwr.algorithms.parts import ClientState, RunContext  # noqa: E402
from fedvls_flwr.algorithms.rounds import ClientRound, build_protocol  # noqa: E402
from fedvls_flwr.algorithms.run_model import build_run_model  # noqa: E402
from fedvls_flwr.algorithms.server_optim import build_server_optimizer  # noqa: E402
from fedvls_flwr.algorithms.training import train_local  # noqa: E402
from fedvls_flwr.config.registry import get_part  # noqa: E402
from fedvls_flwr.config.run_config import RunConfig  # noqa: E402
from fedvls_flwr.data.node_data import ClientData  # noqa: E402

CLIENT_COUNTS = [155, 0, 7, 0, 0, 152, 0, 0, 0, 808]  # client 0, seed 0, Dirichlet 0.05, mnist10k
LOCAL = {
    "fedavg": {},
    "fedprox": {"method": "fedprox"},
    "moon": {"method": "moon"},
    "fedrs": {"method": "fedrs"},
    "fedlmd": {"method": "fedlmd"},
    "feddecorr": {"method": "feddecorr"},
    "fedmr": {"method": "fedmr"},
    "fedlc": {"method": "fedlc"},
    "fedntd": {"method": "fedntd"},
    "fedvls": {"method": "fedvls"},
    "fedvls-paper": {"method": "fedvls-paper"},
    "fedavg + sam": {"local_optimizer": "sam"},
    "fedvls + sam": {"method": "fedvls", "local_optimizer": "sam"},
    "fedavg + fedgf": {"local_optimizer": "fedgf"},
    "fedvls + fedgf": {"method": "fedvls", "local_optimizer": "fedgf"},
    "fedavg, momentum carried": {"optimizer_state": "carry"},
    "fedconcat stage 1 (K=2)": {"protocol": "fedconcat"},  # a cluster model's ordinary local training
    "fedconcat stage 2 (K=2)": {"protocol": "fedconcat", "fedconcat_clusters": 2, "stage": 2},
    "fedconcat stage 2 (K=4)": {"protocol": "fedconcat", "fedconcat_clusters": 4, "stage": 2},
}
SERVER = ["fedavg", "fedexp", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedavg + fedgf companion"]


def client_data(n: int = 1024):
    g = torch.Generator().manual_seed(0)
    p = torch.tensor(CLIENT_COUNTS, dtype=torch.float)
    y = torch.multinomial(p, n, replacement=True, generator=g)
    return torch.randn(n, 1, 28, 28, generator=g), y


def head_round_ms(cfg: RunConfig, x, y) -> tuple[float, float]:
    """A FedConcat stage-2 client round (the authors' 3 mini-batches on the head over K frozen
    encoders), the concatenated model's construction included: (ms per step, ms per round)."""
    torch.manual_seed(0)
    model = build_run_model(cfg, (1, 28, 28), 10)
    protocol = build_protocol(cfg.to_flower(), RunContext(cfg))
    protocol.bind_model(model)
    arrays = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    k = cfg.fedconcat_clusters
    state = protocol.aggregate(protocol.encoder_rounds, protocol.initial_state(arrays, {}), {})  # end of stage 1
    sent = {name: torch.from_numpy(np.asarray(v)) for name, v in state.items() if not name.startswith("fedconcat/")}
    start = time.perf_counter()
    res = protocol.client_train(ClientRound(
        arrays=sent, config={"fedconcat-stage": 2}, cfg=cfg, data=ClientData(x, y, 10, None, None),
        model_factory=lambda: build_run_model(cfg, (1, 28, 28), 10), device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(2), state=ClientState())).result  # the encoders come with the message
    seconds = time.perf_counter() - start
    assert len({n.split("/", 1)[0] for n in sent if n.startswith("encoder")}) == k
    return seconds / res.steps * 1e3, seconds * 1e3


def local_round_ms(overrides: dict, x, y, epochs: int) -> tuple[float, float]:
    """(ms per step, ms per client round)."""
    overrides = dict(overrides)
    stage = overrides.pop("stage", 1)
    cfg = RunConfig(**{"method": "fedavg", "local_epochs": epochs, "device": "cpu", **overrides})
    if stage == 2:
        assignment = ",".join(str(i % cfg.fedconcat_clusters) for i in range(cfg.fedconcat_clusters))
        return head_round_ms(cfg.replace(fedconcat_assignment=assignment, num_server_rounds=21), x, y)
    torch.manual_seed(0)
    model = build_run_model(cfg, (1, 28, 28), 10)
    state = ClientState()
    received = Received()
    if cfg.local_optimizer == "fedgf":  # a later round: a perturbed global model and c = 0.3 arrive
        g = torch.Generator().manual_seed(3)
        received = Received({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()},
                            {"c": 0.3})
    if get_part("method", cfg.method).load().teacher_output == "projections":  # MOON: a second round, its previous model there
        train_local(model, ClientData(x, y, 10, None, None), cfg.replace(local_epochs=1), device=torch.device("cpu"),
                    generator=torch.Generator().manual_seed(1), state=state)
    start = time.perf_counter()
    res = train_local(model, ClientData(x, y, 10, None, None), cfg, device=torch.device("cpu"),
                      generator=torch.Generator().manual_seed(2),
                      state=state, received=received)
    seconds = time.perf_counter() - start
    return seconds / res.steps * 1e3, seconds * 1e3


def server_step_ms(name: str, rounds: int = 5) -> float:
    companion = None
    if name.endswith("fedgf companion"):
        cfg = RunConfig(local_optimizer="fedgf")
        companion = FedGFServer(get_part("local-optimizer", "fedgf").own_settings(cfg.to_flower()), RunContext(cfg))
        name = "fedavg"
    cfg = RunConfig(server_optimizer=name, fedavgm_momentum=0.9)
    opt = build_server_optimizer(cfg.to_flower(), RunContext(cfg))
    model = build_run_model(cfg.replace(method="fedavg"), (1, 28, 28), 10)
    w = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    times = []
    for t in range(1, rounds + 1):
        replies = [Reply(str(i), {k: v + 0.01 * rng.standard_normal(v.shape).astype(v.dtype) for k, v in w.items()},
                         100 + i, {}) for i in range(10)]
        avg = weighted_average(replies, w)
        start = time.perf_counter()
        new = opt.step(t, w, avg, replies)
        if companion is not None:
            companion.observe(t, w, new, replies)
            companion.downlink(t + 1, new)
        times.append(time.perf_counter() - start)
        w = new
    return statistics.median(times) * 1e3


BEGIN = "<!-- bench_parts tables: generated by `python bench/bench_parts.py --write docs/performance.md`, do not edit -->"
END = "<!-- end bench_parts tables -->"


def tables(local: dict[str, list[float]], rounds: dict[str, list[float]], server: dict[str, list[float]],
           epochs: int, repeats: int) -> str:
    base = statistics.median(local["fedavg"])
    lines = [f"Local training, MNIST MLP, batch 64, 1 thread, {epochs} epochs of 1,024 samples "
             f"(teacher forward included; FedConcat's stage 2: 3 mini-batches on the head), median of {repeats} (range)",
             "", "| method / local optimizer | ms per step | / FedAvg | ms per client round |", "| --- | --- | --- | --- |"]
    for name, values in local.items():
        m = statistics.median(values)
        lines.append(f"| {name} | {m:.2f} ({min(values):.2f}-{max(values):.2f}) | {m / base:.2f}x | "
                     f"{statistics.median(rounds[name]):.1f} |")
    sbase = statistics.median(server["fedavg"])
    lines += ["", f"Server optimizer step, MLP (199,210 parameters), 10 replies, median of {repeats} (range)", "",
              "| server optimizer | ms per round | - FedAvg (ms) |", "| --- | --- | --- |"]
    for name, values in server.items():
        m = statistics.median(values)
        lines.append(f"| {name} | {m:.2f} ({min(values):.2f}-{max(values):.2f}) | {m - sbase:+.2f} |")
    return "\n".join(lines)


def write_between_markers(page: Path, text: str) -> None:
    content = page.read_text()
    start, end = content.find(BEGIN), content.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"error: {page} lacks the markers {BEGIN!r} ... {END!r}; add them where the tables go")
    page.write_text(content[:start] + BEGIN + "\n" + text + "\n" + content[end:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--write", type=Path, metavar="PAGE", help="also put the tables between PAGE's markers")
    args = ap.parse_args()
    if args.write is not None and not args.write.is_file():
        raise SystemExit(f"error: --write {args.write}: no such file")
    torch.set_num_threads(1)
    x, y = client_data()
    local: dict[str, list[float]] = {k: [] for k in LOCAL}
    rounds: dict[str, list[float]] = {k: [] for k in LOCAL}
    server: dict[str, list[float]] = {k: [] for k in SERVER}
    for _ in range(args.repeats):
        for name, overrides in LOCAL.items():
            per_step, per_round = local_round_ms(overrides, x, y, args.epochs)
            local[name].append(per_step)
            rounds[name].append(per_round)
        for name in SERVER:
            server[name].append(server_step_ms(name))
    text = tables(local, rounds, server, args.epochs, args.repeats)
    print(text)
    if args.write is not None:
        write_between_markers(args.write, text)
        print(f"\nwrote the tables into {args.write}")


if __name__ == "__main__":
    main()
