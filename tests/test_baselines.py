"""The baselines that act beyond the logits - FedProx (weights), MOON (projections, client
state), FedDecorr (representation), FedSAM (the step), carried momentum - against
straightforward references."""

import math

import pytest
import torch
from torch import nn

from fedvls_flwr.algorithms.local_optim import SAMStep
from fedvls_flwr.algorithms.objectives.base import objective_for
from fedvls_flwr.algorithms.parts import ClientState, LocalOptimizerContext
from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.algorithms.training import train_local
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.models import FeatureTap, ProjectionModel, build_model, classifier_of

torch.set_default_dtype(torch.float32)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _linear(seed=0, d=6, c=4):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 5), nn.Tanh(), nn.Linear(5, c)).double()


def test_fedprox_adds_the_gradient_and_value_of_the_proximal_term():
    model = _linear()
    obj = objective_for("fedprox", torch.tensor([3, 1, 0, 2]), {"fedprox-mu": 0.3})
    obj.bind_global(model)
    anchor = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=_gen(1), dtype=p.dtype))
    x, y = torch.randn(7, 6, generator=_gen(2), dtype=torch.float64), torch.tensor([0, 1, 3, 0, 0, 1, 3])
    loss, terms = obj.loss_terms(model(x), y)
    loss.backward()
    extra = obj.after_backward(list(model.parameters()))
    got = [p.grad.clone() for p in model.parameters()]
    # reference: autograd of CE + (mu/2) ||w - w_g||^2
    ref_model = _linear()
    ref_model.load_state_dict(model.state_dict())
    prox = sum(((p - a) ** 2).sum() for p, a in zip(ref_model.parameters(), anchor))
    total = nn.functional.cross_entropy(ref_model(x), y) + 0.15 * prox
    total.backward()
    for g, p in zip(got, ref_model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close((terms + extra)[1], 0.15 * prox.detach())
    torch.testing.assert_close((terms + extra).sum(), total.detach())


def ref_moon(logits, y, z, zg, zp, mu, tau):
    ce = nn.functional.cross_entropy(logits, y)
    con = 0.0
    for i in range(len(y)):
        sg = torch.dot(z[i], zg[i]) / (z[i].norm() * zg[i].norm()) / tau
        sp = torch.dot(z[i], zp[i]) / (z[i].norm() * zp[i].norm()) / tau
        con = con - torch.log(torch.exp(sg) / (torch.exp(sg) + torch.exp(sp)))
    return ce + mu * con / len(y)


def test_moon_contrastive_loss_value_and_gradient_match_the_formula():
    B, D, C = 6, 5, 4
    obj = objective_for("moon", torch.tensor([2, 2, 0, 1]), {"moon-mu": 0.7, "moon-tau": 0.5, "moon-projection-dim": D})
    g = _gen(3)
    logits = torch.randn(B, C, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.randn(B, D, generator=g, dtype=torch.float64, requires_grad=True)
    zg, zp = torch.randn(B, D, generator=g, dtype=torch.float64), torch.randn(B, D, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 3, 0, 1, 1])
    loss, terms = obj(logits, y, torch.cat([zg, zp], dim=1), z)
    ref = ref_moon(logits, y, z, zg, zp, 0.7, 0.5)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    got = torch.autograd.grad(loss, (logits, z))
    want = torch.autograd.grad(ref, (logits, z))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # a first round (no previous model): the projections of the global model only -> term 0
    _, first = obj(logits, y, zg, z)
    assert float(first["con"]) == 0.0


def ref_decorr(h, beta):
    n, d = h.shape
    mean = [sum(h[i, j] for i in range(n)) / n for j in range(d)]
    var = [sum((h[i, j] - mean[j]) ** 2 for i in range(n)) / (n - 1) for j in range(d)]
    z = [[(h[i, j] - mean[j]) / torch.sqrt(var[j] + 1e-8) for j in range(d)] for i in range(n)]
    total = 0.0
    for a in range(d):
        for b in range(d):
            if a != b:
                k = sum(z[i][a] * z[i][b] for i in range(n))
                total = total + k**2
    return beta * total / (d * (d - 1)) / n


def test_feddecorr_value_and_gradient_match_the_formula():
    obj = objective_for("feddecorr", torch.tensor([2, 3, 1]), {"feddecorr-beta": 0.4})
    g = _gen(4)
    h = torch.randn(7, 5, generator=g, dtype=torch.float64, requires_grad=True)
    logits = torch.randn(7, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1, 1, 0, 2])
    _, terms = obj(logits, y, None, h)
    ref = ref_decorr(h, 0.4)
    torch.testing.assert_close(terms["decorr"], ref.detach(), rtol=1e-10, atol=1e-12)
    loss, _ = obj.loss_terms(logits, y, None, h)
    torch.testing.assert_close(torch.autograd.grad(loss, h)[0], torch.autograd.grad(ref, h)[0], rtol=1e-9, atol=1e-12)
    assert float(obj(logits[:1], y[:1], None, h[:1])[1]["decorr"]) == 0.0  # one sample: no correlation


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 1e-2)])
def test_sam_step_matches_the_two_pass_reference(momentum, weight_decay):
    model, ref = _linear(5), _linear(5)
    x, y = torch.randn(9, 6, generator=_gen(5), dtype=torch.float64), torch.randint(0, 4, (9,), generator=_gen(6))
    rho, lr = 0.2, 0.1
    sgd = LocalSGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    sam = SAMStep({"sam-rho": rho}, LocalOptimizerContext(sgd))

    def closure():
        sgd.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach().reshape(1)

    params = list(ref.parameters())
    bufs = [None] * len(params)
    for _ in range(3):
        sam.step(closure)
        # reference: explicit SAM with torch.optim.SGD's update
        g = torch.autograd.grad(nn.functional.cross_entropy(ref(x), y), params)
        norm = math.sqrt(sum(float((gi**2).sum()) for gi in g))
        e = [rho * gi / (norm + 1e-12) for gi in g]
        with torch.no_grad():
            for p, ei in zip(params, e):
                p.add_(ei)
        g2 = torch.autograd.grad(nn.functional.cross_entropy(ref(x), y), params)
        with torch.no_grad():
            for i, (p, ei, gi) in enumerate(zip(params, e, g2)):
                p.sub_(ei)
                d = gi + weight_decay * p
                bufs[i] = d.clone() if bufs[i] is None or momentum == 0 else momentum * bufs[i] + d
                p.sub_(lr * bufs[i])
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _blobs(n=40, seed=0):
    g = _gen(seed)
    y = torch.tensor([0, 1, 2, 0] * (n // 4))
    x = torch.randn(n, 1, 4, 4, generator=g) + y.view(-1, 1, 1, 1).float()
    return x, y


def test_carried_momentum_equals_one_continuous_optimizer():
    """One client whose global model is its own: two 1-epoch rounds with the momentum
    carried are one 2-epoch run with one optimizer; fresh momentum is not."""
    x, y = _blobs()
    base = dict(method="fedavg", local_epochs=1, batch_size=8, lr=0.05, momentum=0.9, device="cpu")
    results = {}
    for mode in ("carry", "fresh"):
        cfg = RunConfig(**base, optimizer_state=mode)
        torch.manual_seed(0)
        model = build_model("mlp", (1, 4, 4), 3)
        gen, state = _gen(7), ClientState()
        for _ in range(2):
            train_local(model, ClientData(x, y, 3, None, None), cfg, device=torch.device("cpu"), generator=gen, state=state)
        results[mode] = [p.detach().clone() for p in model.parameters()]
        assert bool(state.of("local-optimizer")) == (mode == "carry")
    torch.manual_seed(0)
    continuous = build_model("mlp", (1, 4, 4), 3)
    train_local(continuous, ClientData(x, y, 3, None, None), RunConfig(**{**base, "local_epochs": 2}), device=torch.device("cpu"),
                generator=_gen(7))
    for a, b in zip(results["carry"], continuous.parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(results["fresh"], continuous.parameters()))


def test_moon_keeps_its_previous_model_and_uses_it_from_the_second_round():
    x, y = _blobs()
    cfg = RunConfig(method="moon", moon_mu=1.0, moon_projection_dim=8, local_epochs=1, batch_size=8, device="cpu")
    torch.manual_seed(0)
    model = build_run_model(cfg, (1, 4, 4), 3)
    assert isinstance(model, ProjectionModel) and model.classifier.in_features == 8
    state = ClientState()
    first = train_local(model, ClientData(x, y, 3, None, None), cfg, device=torch.device("cpu"), generator=_gen(1), state=state)
    kept = state.of("method")
    assert first.terms["con"] == 0.0 and kept  # no previous model yet; the trained one kept for the next round
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    assert kept.keys() == trained.keys() and all(torch.equal(trained[k], kept[k]) for k in trained)
    second = train_local(model, ClientData(x, y, 3, None, None), cfg, device=torch.device("cpu"), generator=_gen(2), state=state)
    assert second.terms["con"] > 0.0


@pytest.mark.parametrize("name", ["mlp", "logreg", "cnn", "mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32"])
def test_every_model_has_a_classifier_and_a_projection_variant(name):
    shape = (3, 32, 32)
    model = build_model(name, shape, 10).eval()
    tap = FeatureTap(model)
    x = torch.randn(2, *shape)
    logits = model(x)
    tap.remove()
    head = classifier_of(model)
    torch.testing.assert_close(head(tap.features), logits)
    moon = ProjectionModel(build_model(name, shape, 10), 16, 10).eval()
    out, z = moon.project(x)
    assert out.shape == (2, 10) and z.shape == (2, 16)


def test_client_state_round_trips_through_a_flower_record():
    from flwr.app import RecordDict

    from fedvls_flwr.app.client import load_client_state, save_client_state

    record = RecordDict()
    assert load_client_state(record).kept == {}
    state = ClientState({"method": {"w": torch.arange(3.0)}, "local-optimizer": {"count": torch.tensor(3),
                                                                                   "0": torch.ones(2), "2": torch.zeros(1)}})
    save_client_state(record, state)
    back = load_client_state(record)
    assert back.kept.keys() == state.kept.keys()
    for kind, kept in state.kept.items():
        assert back.of(kind).keys() == kept.keys() and all(torch.equal(back.of(kind)[k], v) for k, v in kept.items())
    state.keep("method", {})  # a part that keeps nothing now: its record goes
    save_client_state(record, state)
    assert list(load_client_state(record).kept) == ["local-optimizer"]


def test_a_kind_kept_as_it_came_keeps_its_record_and_a_change_in_place_is_saved():
    """A part that keeps the values its node's state gave it (FedConcat's frozen encoders) leaves
    their record as it is - not encoded again every round; a part that changed them in place, or
    replaced them, has them written anew, and the next round reads what it kept."""
    from flwr.app import RecordDict

    from fedvls_flwr.app import keys
    from fedvls_flwr.app.client import load_client_state, save_client_state

    record = RecordDict()
    save_client_state(record, ClientState({"protocol": {"enc": torch.arange(6.0).reshape(2, 3), "d": torch.ones(2)},
                                           "method": {"c": torch.zeros(3)}}))
    before = {kind: record[keys.CLIENT_STATE + kind] for kind in ("protocol", "method")}

    state = load_client_state(record)
    state.keep("protocol", {k: v.detach().cpu() for k, v in state.of("protocol").items()})  # as it came
    state.of("method")["c"].add_(1.0)  # changed in place
    save_client_state(record, state)
    assert record[keys.CLIENT_STATE + "protocol"] is before["protocol"]
    assert record[keys.CLIENT_STATE + "method"] is not before["method"]
    again = load_client_state(record)
    assert torch.equal(again.of("method")["c"], torch.ones(3))
    assert torch.equal(again.of("protocol")["enc"], torch.arange(6.0).reshape(2, 3))

    # a tensor read before and changed in place after its round was saved: the next read is the record's
    again.of("protocol")["enc"].mul_(0.0)
    assert torch.equal(load_client_state(record).of("protocol")["enc"], torch.arange(6.0).reshape(2, 3))
    # replaced by equal values in new tensors: written anew, and still equal
    state = load_client_state(record)
    state.keep("protocol", {k: v.clone() for k, v in state.of("protocol").items()})
    save_client_state(record, state)
    assert record[keys.CLIENT_STATE + "protocol"] is not before["protocol"]
    assert torch.equal(load_client_state(record).of("protocol")["d"], torch.ones(2))


def test_the_tensors_kept_from_node_states_stay_within_their_bound(monkeypatch):
    """Many nodes' states read in one process: the tensors kept for reuse never pass
    STATE_READS_BYTES (the oldest go), and a state read again after its tensors went is still right."""
    from flwr.app import RecordDict

    import fedvls_flwr.app.client as client

    monkeypatch.setattr(client, "STATE_READS_BYTES", 3 * 4000)
    records = []
    for node in range(6):
        record = RecordDict()
        client.save_client_state(record, ClientState({"method": {"w": torch.full((1000,), float(node))}}))
        records.append(record)
    for record in records:
        client.load_client_state(record)
        assert client._read_bytes <= 3 * 4000
    assert client._read_bytes == sum(entry[1].nbytes for entry in client._READ.values())
    for node, record in enumerate(records):
        assert torch.equal(client.load_client_state(record).of("method")["w"], torch.full((1000,), float(node)))
