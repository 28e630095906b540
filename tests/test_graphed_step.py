"""The client's step as CUDA graphs (fedvls_flwr/algorithms/graphed.py).

On the CPU (``capture=False``: the graphed path's static buffers, every step eager), against
``train_local``'s eager loop over 3 rounds of 4 clients that share one kept trainer:

* every objective and local optimizer (FedGF with a perturbed global point from round 2),
  carried momentum, an augmented BatchNorm conv net with a teacher forward per batch: the same
  weights bit for bit, except FedVLS (its fixed-shape form sums over all C classes with zero
  weights where the eager one sums over the present / vacant ones: float rounding) and FedMR
  (its fixed-shape term is checked step by step: its 1/sqrt(var + 1e-8) makes the trajectory
  amplify any rounding difference, see test_fedmr_fixed_shapes_is_the_same_step);
* the weights are copied into the same tensors every round; the momentum buffers, zeroed in
  place, give the fresh optimizer's steps; the per-client tensors are refreshed; the short last
  batch (and a BatchNorm model's merged last batch) runs eagerly with the same result;
* the cache key changes with every setting that shapes the captured step.

On CUDA (skipped on a CPU, saying so), every part over 3 rounds with ``cuda-graphs = true``
against ``cuda-graphs = false`` on the same GPU, and the augmentation replayed from a graph
against the same draws taken eagerly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from fedvls_flwr.algorithms import graphed
from fedvls_flwr.algorithms.downlink import Received
from fedvls_flwr.algorithms.graphed import clear_trainers, train_graphed, trainer_key
from fedvls_flwr.algorithms.objectives.base import build_objective, objective_for
from fedvls_flwr.algorithms.objectives.fedmr import manifold_reshaping_term, manifold_reshaping_term_fixed
from fedvls_flwr.algorithms.parts import ClientState, ObjectiveContext, RunContext
from fedvls_flwr.algorithms.rounds import build_protocol
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.algorithms.training import round_optimizer, train_local
from fedvls_flwr.config.registry import method_names
from fedvls_flwr.config.run_config import RunConfig, parse_run_config
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.models import ProjectionModel

C = 6
CPU = torch.device("cpu")
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
#: (samples, classes) of the four clients: different label sets, none a multiple of the batch
CLIENTS = ((70, (0, 1, 2)), (45, (1, 3)), (100, (0, 1, 2, 3, 4, 5)), (37, (5, 2)))


def clients(images: bool = False, seed: int = 0) -> list[ClientData]:
    """Four clients: 8x8 grey vectors (pre-normalised, as the MNIST-like sets), or 3x8x8 uint8
    images with a mean and std (augmented, as the CIFAR sets)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, (n, classes) in enumerate(CLIENTS):
        y = torch.tensor(classes)[torch.randint(len(classes), (n,), generator=g)]
        if images:
            x = (torch.randint(0, 200, (n, 3, 8, 8), generator=g) + 8 * y.view(-1, 1, 1, 1)).to(torch.uint8)
            out.append(ClientData(x, y, C, MEAN, STD, partition_id=k))
        else:
            x = torch.randn(n, 1, 8, 8, generator=g) + 0.3 * y.view(-1, 1, 1, 1)
            out.append(ClientData(x, y, C, None, None, partition_id=k))
    return out


def mlp(method: str) -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, C))
    return ProjectionModel(model, 8, C) if method == "moon" else model


def convnet(method: str) -> nn.Module:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, C))
    return ProjectionModel(model, 8, C) if method == "moon" else model


def config(**settings: Any) -> RunConfig:
    base = {"batch-size": 16, "local-epochs": 2, "lr": 0.05, "device": "cpu", "dataset": "digits", "model": "mlp"}
    return parse_run_config({**base, **settings})


Train = Callable[[nn.Module, ClientData, RunConfig, torch.Generator, ClientState, Received], Any]


def eager(model, data, cfg, gen, state, received):
    return train_local(model, data, cfg, device=CPU, generator=gen, state=state, received=received)


def static(model, data, cfg, gen, state, received):
    return train_graphed(model, data, cfg, device=CPU, generator=gen, state=state, received=received, capture=False)


def federation(train: Train, cfg: RunConfig, build: Callable[[str], nn.Module], data: list[ClientData],
               rounds: int = 3) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``rounds`` FedAvg rounds (plain means) of every client; the global weights and the last
    round's losses. FedGF's clients get a perturbed global point (c = 0.3) from round 2."""
    torch.manual_seed(0)
    global_state = build(cfg.method).state_dict()
    states = {d.partition_id: ClientState() for d in data}
    losses: list[float] = []
    for r in range(1, rounds + 1):
        trained, losses = [], []
        for d in data:
            model = build(cfg.method)
            model.load_state_dict(global_state)
            received = Received()
            if cfg.local_optimizer == "fedgf" and r > 1:
                g = torch.Generator().manual_seed(r)
                received = Received(arrays={k: v + 0.01 * torch.randn(v.shape, generator=g).to(v.device)
                                            for k, v in global_state.items() if v.dtype.is_floating_point},
                                    values={"c": 0.3})
            result = train(model, d, cfg, torch.Generator().manual_seed(100 * r + d.partition_id),
                           states[d.partition_id], received)
            trained.append(model.state_dict())
            losses.append(result.loss)
        global_state = {k: (sum(t[k].double() for t in trained) / len(trained)).to(v.dtype)
                        for k, v in global_state.items()}
    return global_state, losses


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], exact: bool) -> None:
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


# ----------------------------------------------------------------------------- CPU: static buffers


PARTS = [(m, "sgd") for m in method_names() if m != "fedmr"] + [
    ("fedavg", "sam"), ("fedavg", "fedgf"), ("fedvls", "sam"), ("fedvls", "fedgf")]


@pytest.mark.parametrize("method, optimizer", PARTS, ids=[f"{m}-{o}" for m, o in PARTS])
def test_every_part_on_static_buffers_equals_the_eager_loop(method, optimizer):
    cfg = config(method=method, **{"local-optimizer": optimizer})
    clear_trainers()
    want, want_losses = federation(eager, cfg, mlp, clients())
    got, got_losses = federation(static, cfg, mlp, clients())
    exact = not method.startswith("fedvls")  # FedVLS: masks over C classes instead of indices
    assert_same(want, got, exact)
    # the paper form's unbounded logit term reaches -15 and sums in another order: 1e-5, relative
    assert got_losses == (want_losses if exact else pytest.approx(want_losses, rel=1e-5))
    # one trainer, or one per kind of step: FedVLS with and without its vacant-class term, MOON
    # without (a client's first round) and with its previous model, FedGF without (round 1:
    # FedSAM's step) and with a perturbed point
    kinds = (2 if method.startswith("fedvls") or method == "moon" else 1) * (2 if optimizer == "fedgf" else 1)
    assert 1 <= len(graphed._TRAINERS) <= kinds


def test_carried_momentum_on_static_buffers_equals_the_eager_loop():
    cfg = config(method="fedavg", **{"optimizer-state": "carry"})
    clear_trainers()
    assert_same(federation(eager, cfg, mlp, clients())[0], federation(static, cfg, mlp, clients())[0], exact=True)


@pytest.mark.parametrize("method", ["fedavg", "fedvls", "fedntd", "moon", "fedlmd"])
def test_augmented_batchnorm_net_with_a_teacher_per_batch_equals_the_eager_loop(method):
    """uint8 images with crop + flip + AutoAugment (the CPU generator's draws, as the eager
    loop's), BatchNorm (a last batch under half a batch joins the one before), and the
    teacher's forward pass on every augmented batch."""
    cfg = config(method=method, dataset="cifar10", augment=True, **{"batch-size": 16})
    data = clients(images=True)
    clear_trainers()
    want = federation(eager, cfg, convnet, data)[0]
    got = federation(static, cfg, convnet, data)[0]
    assert_same(want, got, exact=method != "fedvls")


def test_fedmr_fixed_shapes_is_the_same_step():
    """FedMR's fixed-shape term (float64 Gram matrices, no host read-back) against the eager
    one: value and gradient for batches with classes seen 0, 1 and several times, dead units
    included; and one step of a client, weights within float rounding."""
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(16, 40, generator=g).relu()
        h[:, :10] = 0
        y = torch.randint(0, 4, (16,), generator=g)
        y[0] = 5  # a class seen once
        a, b = h.clone().requires_grad_(), h.clone().requires_grad_()
        ra, rb = manifold_reshaping_term(a, y, C), manifold_reshaping_term_fixed(b, y, C)
        torch.testing.assert_close(rb, ra, rtol=1e-6, atol=1e-7)
        ga, = torch.autograd.grad(ra, a)
        gb, = torch.autograd.grad(rb, b)
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-7)
    cfg = config(method="fedmr", **{"local-epochs": 1})
    full = clients()[2]
    d = ClientData(full.x[:16], full.y[:16], C, None, None)  # one full batch: one step
    torch.manual_seed(0)
    model = mlp("fedmr")
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    eager(a, d, cfg, torch.Generator().manual_seed(1), ClientState(), Received())
    static(b, d, cfg, torch.Generator().manual_seed(1), ClientState(), Received())
    assert_same(a.state_dict(), b.state_dict(), exact=False)


def test_one_trainer_serves_every_client_in_the_same_tensors():
    """3 rounds x 4 clients of different sizes and label sets: one trainer, whose parameters,
    momentum buffers and static inputs keep their storage; its objective holds the last
    client's class-dependent tensors; every round equals the eager loop (fresh optimizer each
    time, the short last batch eager)."""
    cfg = config(method="fedlc")
    clear_trainers()
    data = clients()
    federation(static, cfg, mlp, data, rounds=1)
    (trainer,) = graphed._TRAINERS.values()
    storage = [t.data_ptr() for t in (*trainer.model.parameters(), *trainer.sgd.buffers, trainer.xb, trainer.yb)]
    want, _ = federation(eager, cfg, mlp, data)
    got, _ = federation(static, cfg, mlp, data)
    assert list(graphed._TRAINERS.values()) == [trainer]
    assert [t.data_ptr() for t in (*trainer.model.parameters(), *trainer.sgd.buffers, trainer.xb, trainer.yb)] == storage
    assert_same(want, got, exact=True)
    last = objective_for("fedlc", torch.bincount(data[-1].y, minlength=C))
    assert torch.equal(trainer.objective.margin, last.margin)
    assert torch.equal(trainer.objective.present, last.present)


def test_momentum_reset_in_place_equals_a_fresh_optimizer():
    """After one client has trained (its buffers nonzero) the next client's round equals a
    fresh optimizer's, and a client whose data fit in one short batch never uses the static
    inputs."""
    cfg = config(method="fedavg", momentum=0.9)
    data = clients()
    clear_trainers()
    torch.manual_seed(0)
    start = mlp("fedavg")
    first = copy.deepcopy(start)
    static(first, data[0], cfg, torch.Generator().manual_seed(1), ClientState(), Received())
    (trainer,) = graphed._TRAINERS.values()
    assert any(float(b.abs().sum()) > 0 for b in trainer.sgd.buffers)
    tiny = ClientData(data[1].x[:5], data[1].y[:5], C, None, None)
    for d in (data[2], tiny):
        a, b = copy.deepcopy(start), copy.deepcopy(start)
        eager(a, d, cfg, torch.Generator().manual_seed(2), ClientState(), Received())
        static(b, d, cfg, torch.Generator().manual_seed(2), ClientState(), Received())
        assert_same(a.state_dict(), b.state_dict(), exact=True)


def _key(cfg: RunConfig, data: ClientData, model: nn.Module | None = None, state: ClientState | None = None,
         device: torch.device = CPU, received: Received | None = None) -> tuple:
    """The trainer key of a round (the objective and the optimizer built on the CPU, so that a
    CUDA key is computed without a GPU)."""
    model = model if model is not None else (convnet if data.mean is not None else mlp)(cfg.method)
    counts = torch.bincount(data.y, minlength=data.num_classes)
    objective = build_objective(cfg.to_flower(), ObjectiveContext(counts, fixed_shapes=True))
    objective.load_client_state((state or ClientState()).of("method"))
    received = received if received is not None else Received()
    received.param_names = [n for n, p in model.named_parameters() if p.requires_grad]
    probe = LocalSGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    optimizer = round_optimizer(cfg, probe, received)
    return trainer_key(model, data, cfg, objective, optimizer.graph_signature(), device)


def test_every_setting_that_shapes_the_step_gives_another_graph():
    images = clients(images=True)[0]
    base = config(method="fedvls", dataset="cifar10")
    key = _key(base, images)
    changes = [{"lr": 0.1}, {"momentum": 0.5}, {"weight-decay": 0.0}, {"batch-size": 32}, {"lambda-dis": 0.2},
               {"logit-weight": 0.01}, {"use-dis": False}, {"local-optimizer": "sam"}, {"augment": False},
               {"teacher-mode": "train"}, {"deterministic": True}, {"amp": "true"}, {"method": "fedavg"}]
    for change in changes:
        assert _key(config(**{"method": "fedvls", "dataset": "cifar10", **change}), images) != key, change
    assert _key(base.replace(local_optimizer="sam"), images) != _key(config(method="fedvls", dataset="cifar10", **{
        "local-optimizer": "sam", "sam-rho": 0.2}), images)
    cuda = torch.device("cuda")  # a key is computed without touching the device
    assert _key(base, images, device=cuda) != _key(config(method="fedvls", dataset="cifar10", **{
        "channels-last": "true"}), images, device=cuda)
    assert _key(base, images, device=cuda) != _key(base, images)
    # the network's architecture and the input's shape
    wider = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, C))
    assert _key(base, images, model=wider) != key
    larger = ClientData(torch.zeros(20, 3, 12, 12, dtype=torch.uint8), images.y[:20], C, MEAN, STD)
    assert _key(base, larger) != key
    # another client with the same structure shares the graph; one without two vacant classes does not
    other = ClientData(images.x, (images.y + 1) % 3, C, MEAN, STD)
    assert _key(base, other) == key
    assert _key(base, clients(images=True)[2]) != key  # all classes present: no distillation term
    # MOON's previous model changes what the teacher computes
    moon = config(method="moon", dataset="cifar10")
    kept = ClientState({"method": convnet("moon").state_dict()})
    assert _key(moon, images, state=kept) != _key(moon, images)
    # FedGF: its c is a constant of the captured step, its perturbed point a refreshed tensor
    gf = config(method="fedavg", **{"local-optimizer": "fedgf"})
    vectors = clients()[0]
    model = mlp("fedavg")
    point = {k: v.clone() for k, v in model.state_dict().items()}

    def gf_key(c: float) -> tuple:
        return _key(gf, vectors, model=model, received=Received(arrays=point, values={"c": c}))

    assert gf_key(0.3) == gf_key(0.3) != gf_key(0.6)


# ----------------------------------------------------------------------------- CUDA: graphs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a CUDA device; the static-buffer handling is tested on the CPU")

# Tolerance on CUDA: both sides run the same kernels on the same draws, but (1) FedVLS and FedMR
# use their fixed-shape forms in the graph (masks over all C classes, float64 Gram matrices)
# and their index-based forms eagerly, and (2) kernels that accumulate with atomics (BatchNorm's
# and convolutions' weight gradients, index_add_) sum in a run-dependent order; float32
# rounding differences of 1e-7 grow over the 3 rounds' ~60 SGD steps to about 1e-5 of a weight.
# FedMR's 1/sqrt(var + 1e-8) amplifies them by orders of magnitude within a few steps (a unit
# active for one sample of a class gets a gradient that grows as its activation shrinks), and
# FedDecorr's correlation penalty amplifies them too (on the CPU a 1e-7 relative change of the
# initial weights ends 341 times outside the tolerance after 3 rounds): both are compared over
# each client's first three steps. FedMR's fixed-shape form differs from its index-based form
# by more than the tolerance within those steps (2.7e-2 on a client, measured on the CPU), so on
# CUDA its graph is compared with the same static-buffer path stepped eagerly (the forms the
# CPU tests compare are then the eager loop's, above). Under bfloat16
# autocast such a difference moves a bfloat16 rounding (8 bits of mantissa) now and then, so
# amp is compared ten times more loosely.
CUDA_RTOL, CUDA_ATOL = 1e-3, 1e-4


def _cuda_federation(cfg: RunConfig, build: Callable[[str], nn.Module], data: list[ClientData], rounds: int = 3,
                     static: bool = False):
    """``rounds`` rounds on CUDA through ``train_local`` (the graph, or op by op, as ``cfg``
    says); ``static``: the graphed path's static buffers stepped eagerly instead (no capture)."""
    device = torch.device("cuda")

    def on_cuda(model, d, cfg, gen, state, received):
        received.arrays = {k: v.to(device) for k, v in received.arrays.items()}
        if static:
            return train_graphed(model, d, cfg, device=device, generator=gen, state=state, received=received,
                                 capture=False)
        return train_local(model, d, cfg, device=device, generator=gen, state=state, received=received)

    return federation(on_cuda, cfg, lambda m: build(m), data, rounds)


#: Compared over each client's first three steps on CUDA (see above).
CHAOTIC = ("fedmr", "feddecorr")
CUDA_PARTS = [(m, "sgd", {}) for m in method_names() if m != "fedmr"] + [
    ("fedavg", "sam", {}), ("fedavg", "fedgf", {}), ("fedvls", "sam", {}), ("fedvls", "fedgf", {}),
    ("fedavg", "sgd", {"optimizer-state": "carry"}), ("fedvls", "sgd", {"amp": "true"}),
    ("fedavg", "sgd", {"channels-last": "true"}),
]


@needs_cuda
@pytest.mark.parametrize("method, optimizer, extra", CUDA_PARTS,
                         ids=[f"{m}-{o}{'-' + '-'.join(e) if e else ''}" for m, o, e in CUDA_PARTS])
def test_graphed_rounds_equal_eager_rounds_on_cuda(method, optimizer, extra):
    """3 rounds of 4 clients, augmented uint8 images on a BatchNorm conv net: the graph path
    (captured after the warm-up steps, replayed for every full batch, the short batches eager)
    against the same loop launched op by op."""
    rounds = 3
    settings = {"method": method, "local-optimizer": optimizer, "dataset": "cifar10", "device": "cuda", **extra}
    data = clients(images=True)
    if method in CHAOTIC:  # (see above): three steps of each client, the graph from the third on
        rounds, settings["local-epochs"] = 1, 1
        data = [ClientData(d.x[:48], d.y[:48], C, MEAN, STD, partition_id=d.partition_id) for d in data]
    clear_trainers()
    want, want_losses = _cuda_federation(config(**settings, **{"cuda-graphs": False}), convnet, data, rounds,
                                         static=method == "fedmr")
    got, got_losses = _cuda_federation(config(**settings, **{"cuda-graphs": True}), convnet, data, rounds)
    assert sum(t.replays for t in graphed._TRAINERS.values()) > 0  # the graph did run
    loose = 10.0 if extra.get("amp") == "true" else 1.0
    for k in want:
        if want[k].is_floating_point():
            torch.testing.assert_close(got[k], want[k], rtol=CUDA_RTOL * loose, atol=CUDA_ATOL * loose,
                                       msg=lambda m, k=k: f"{k}: {m}")
        else:
            assert torch.equal(got[k], want[k]), k
    assert got_losses == pytest.approx(want_losses, rel=1e-3 * loose, abs=1e-4 * loose)


@needs_cuda
def test_graphed_fedmr_steps_equal_eager_steps_on_cuda():
    test_graphed_rounds_equal_eager_rounds_on_cuda("fedmr", "sgd", {})


@needs_cuda
def test_graphed_mlp_rounds_equal_eager_rounds_on_cuda():
    """The MNIST-like path: pre-normalised vectors (no augmentation), the teacher's rows once per round."""
    data = clients()
    for method in ("fedvls", "moon", "fedntd"):
        settings = {"method": method, "device": "cuda"}
        clear_trainers()
        want = _cuda_federation(config(**settings, **{"cuda-graphs": False}), mlp, data)[0]
        got = _cuda_federation(config(**settings, **{"cuda-graphs": True}), mlp, data)[0]
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=CUDA_RTOL, atol=CUDA_ATOL,
                                       msg=lambda m, k=k, method=method: f"{method} {k}: {m}")


@needs_cuda
def test_augmentation_replayed_from_a_graph_draws_what_it_draws_eagerly():
    """The GPU generator registered with the graph: each replay draws new numbers, the same
    ones an eager call from the same seed draws (the same images for the same seed)."""
    from fedvls_flwr.data.augment import make_batch_transform

    device = torch.device("cuda")
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, device=device)
    gen = torch.Generator(device=device).manual_seed(7)
    transform = make_batch_transform(MEAN, STD, train=True, augment=True, generator=gen)
    eager_out = [transform(x) for _ in range(3)]
    gen.manual_seed(7)
    transform(x)  # warm-up (tables, kernels) outside the capture
    graph = torch.cuda.CUDAGraph()
    graph.register_generator_state(gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        transform(x)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = transform(x)
    gen.manual_seed(7)
    replayed = []
    for _ in range(3):
        graph.replay()
        replayed.append(out.clone())
    for a, b in zip(eager_out, replayed):
        assert torch.equal(a, b)
    assert not torch.equal(replayed[0], replayed[1])


@needs_cuda
def test_fedconcat_rounds_graphed_equal_eager_on_cuda():
    """FedConcat on CUDA: a stage-1 round (the cluster model's ordinary, graphed training) and
    two head rounds (the frozen encoders' features computed once), with and without graphs."""
    from fedvls_flwr.algorithms.fedconcat import HEAD_BIAS, HEAD_WEIGHT
    from fedvls_flwr.algorithms.rounds import ClientRound

    device = torch.device("cuda")
    data = clients(images=True)
    results = []
    for graphs in (False, True):
        clear_trainers()
        cfg = config(protocol="fedconcat", dataset="cifar10", device="cuda", augment=False,
                     **{"cuda-graphs": graphs, "num-server-rounds": 3, "fedconcat-encoder-rounds": 1,
                        "fedconcat-clusters": 2, "fedconcat-assignment": "0,1,0,1"})
        protocol = build_protocol(cfg.to_flower(), RunContext(cfg))
        torch.manual_seed(0)
        start = convnet("fedavg").state_dict()
        kept = [ClientState() for _ in data]  # each node's state, handed to the protocol as the ClientApp does

        def client_train(step: ClientRound, state: ClientState, protocol=protocol) -> dict[str, torch.Tensor]:
            protocol.load_client_state(state.of("protocol"))
            weights = protocol.client_train(step).weights
            state.keep("protocol", protocol.client_state())
            return weights

        encoders = {}
        for k, d in enumerate(data):  # stage 1: each client trains its cluster's model
            step = ClientRound(start, {"fedconcat-stage": 1}, cfg, d, lambda: convnet("fedavg"), device,
                               torch.Generator().manual_seed(k), kept[k])
            encoders[k % 2] = client_train(step, kept[k])
        head = {HEAD_WEIGHT: torch.zeros(C, 16), HEAD_BIAS: torch.zeros(C)}
        sent = {**{f"encoder{c}/{n}": v for c, e in encoders.items() for n, v in e.items()}, **head}
        for r in (2, 3):
            heads = []
            for k, d in enumerate(data):
                arrays = sent if r == 2 else head
                step = ClientRound(arrays, {"fedconcat-stage": 2}, cfg, d, lambda: convnet("fedavg"), device,
                                   torch.Generator().manual_seed(10 * r + k), kept[k])
                heads.append(client_train(step, kept[k]))
            head = {n: torch.stack([h[n] for h in heads]).mean(0) for n in head}
        results.append((encoders, head))
    (enc_a, head_a), (enc_b, head_b) = results
    for c in enc_a:
        for n in enc_a[c]:
            if enc_a[c][n].is_floating_point():
                torch.testing.assert_close(enc_b[c][n], enc_a[c][n], rtol=CUDA_RTOL, atol=CUDA_ATOL)
    for n in head_a:
        torch.testing.assert_close(head_b[n], head_a[n], rtol=CUDA_RTOL, atol=CUDA_ATOL)


@needs_cuda
def test_graphed_rounds_capture_under_deterministic_algorithms_on_cuda():
    """``deterministic = true`` with the graphs (the GPU runs that promise bit-for-bit results):
    an op whose deterministic kernel reads a value back to the host would break the capture and
    leave the trainer stepping eagerly (logged); this says whether torch's deterministic mode and
    the captured step go together, and that the results still equal the op-by-op step's."""
    from fedvls_flwr.algorithms.device import set_deterministic

    settings = {"method": "fedvls", "dataset": "cifar10", "device": "cuda", "deterministic": True}
    data = clients(images=True)
    set_deterministic(True)
    try:
        clear_trainers()
        before = graphed.capture_counts()
        want, _ = _cuda_federation(config(**settings, **{"cuda-graphs": False}), convnet, data, 1)
        got, _ = _cuda_federation(config(**settings, **{"cuda-graphs": True}), convnet, data, 1)
        after = graphed.capture_counts()
    finally:
        set_deterministic(False)  # torch's settings put back
    assert after["failed"] == before["failed"], "a capture failed under torch's deterministic algorithms"
    assert after["captured"] > before["captured"]
    for k in want:
        if want[k].is_floating_point():
            torch.testing.assert_close(got[k], want[k], rtol=CUDA_RTOL, atol=CUDA_ATOL, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("method", ["feddecorr", "fedmr"])
def test_a_kept_trainer_holds_no_step_graph_between_rounds(method):
    """An objective that reads the penultimate features: the trainer kept for the next client
    holds no tensor of the last step (which would keep its autograd graph alive; on CUDA the
    next capture then warns that an AccumulateGrad node's stream does not match)."""
    cfg = config(method=method)
    clear_trainers()
    federation(static, cfg, mlp, clients(), rounds=1)
    (trainer,) = graphed._TRAINERS.values()
    assert trainer.tap is not None and trainer.tap.features is None
