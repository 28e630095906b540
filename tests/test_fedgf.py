"""FedGF (local-optimizer = "fedgf"): the client step and the server companion against the
authors' formulas written out here (hwan-sig/Official-FedGF, fedlab/contrib/algorithm/fedgf.py),
independently of the app's code path."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from fedvls_flwr.algorithms import training
from fedvls_flwr.algorithms.aggregation import Reply, weighted_average
from fedvls_flwr.algorithms.downlink import Received
from fedvls_flwr.algorithms.fedgf import FedGFServer, FedGFStep
from fedvls_flwr.algorithms.local_optim import SAMStep
from fedvls_flwr.algorithms.parts import ClientState, LocalOptimizerContext, RunContext
from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.algorithms.training import train_local
from fedvls_flwr.config.registry import get_part, method_names, owners
from fedvls_flwr.config.run_config import ConfigError, RunConfig, parse_run_config
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.experiments.check import main as check_main

# --------------------------------------------------------------------------- client: hand check

X = np.array([[1.0, -2.0, 0.5], [0.3, 0.8, -1.0], [-1.5, 0.2, 2.0], [0.7, 0.7, 0.7]])
Y = np.array([0, 1, 1, 0])
RHO, LR, MOMENTUM, WD = 0.2, 0.5, 0.9, 0.01


def ce_grad(w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of the batch-mean softmax cross-entropy of z = X w^T + b, written by hand:
    dL/dz = (softmax(z) - onehot(y)) / B, dL/dw = dz^T X, dL/db = sum_i dz_i."""
    z = X @ w.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz = (p - np.eye(2)[Y]) / len(Y)
    return dz.T @ X, dz.sum(axis=0)


def reference(w0, b0, wg, bg, c, steps, form):
    """Two (or more) local steps of the authors' client in float64. ``form = "points"``:
    v = c w_g + (1 - c)(w + e) (their weighted_sum of two models); ``"directions"``: the
    global perturbation w_g - w^t added to the local iterate, v = w + c (w_g - w^t) + (1 - c) e
    (the same point at the first step only)."""
    w, b = w0.copy(), b0.copy()
    buf = None
    for _ in range(steps):
        gw, gb = ce_grad(w, b)
        norm = math.sqrt((gw**2).sum() + (gb**2).sum())
        ew, eb = RHO * gw / (norm + 1e-12), RHO * gb / (norm + 1e-12)
        if form == "points":
            vw, vb = c * wg + (1 - c) * (w + ew), c * bg + (1 - c) * (b + eb)
        else:
            vw, vb = w + c * (wg - w0) + (1 - c) * ew, b + c * (bg - b0) + (1 - c) * eb
        hw, hb = ce_grad(vw, vb)
        dw, db = hw + WD * w, hb + WD * b  # weight decay at w, momentum on top: torch.optim.SGD
        buf = [dw, db] if buf is None else [MOMENTUM * buf[0] + dw, MOMENTUM * buf[1] + db]
        w, b = w - LR * buf[0], b - LR * buf[1]
    return w, b


def _start():
    rng = np.random.default_rng(0)
    w0, b0 = rng.normal(size=(2, 3)), rng.normal(size=2)
    d = rng.normal(size=8)
    d *= 0.3 / np.linalg.norm(d)  # a perturbed global model at distance rho_g = 0.3
    return w0, b0, w0 + d[:6].reshape(2, 3), b0 + d[6:]


def _app_steps(w0, b0, received, steps, cls=FedGFStep):
    model = nn.Linear(3, 2).double()
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w0))
        model.bias.copy_(torch.from_numpy(b0))
    sgd = LocalSGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    step = cls({"sam-rho": RHO}, LocalOptimizerContext(sgd, received if received is not None else Received()))
    x, y = torch.from_numpy(X), torch.from_numpy(Y)

    def closure():
        sgd.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach().reshape(1)

    for _ in range(steps):
        step.step(closure)
    return model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()


def _received(wg, bg, c):
    return Received(arrays={"weight": torch.from_numpy(wg), "bias": torch.from_numpy(bg)}, values={"c": c},
                    param_names=["weight", "bias"])


@pytest.mark.parametrize("c", [0.0, 0.3, 1.0])
def test_two_local_steps_mix_points_not_directions(c):
    w0, b0, wg, bg = _start()
    w, b = _app_steps(w0, b0, _received(wg, bg, c), steps=2)
    pw, pb = reference(w0, b0, wg, bg, c, 2, "points")
    np.testing.assert_allclose(w, pw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b, pb, rtol=1e-12, atol=1e-12)
    dw, db = reference(w0, b0, wg, bg, c, 2, "directions")
    gap = max(np.abs(pw - dw).max(), np.abs(pb - db).max())
    if c == 0.0:
        assert gap == 0.0  # nothing of w_g enters: both forms are SAM
    else:
        assert gap > 1e-3  # the two forms are told apart after two steps, and the app is the points form
    # one step: the two forms agree (the local iterate still is w^t)
    one = _app_steps(w0, b0, _received(wg, bg, c), steps=1)
    np.testing.assert_allclose(one[0], reference(w0, b0, wg, bg, c, 1, "directions")[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("received", [Received(), "c0"])
def test_an_empty_downlink_or_c_0_is_the_sam_step_bit_for_bit(received):
    w0, b0, wg, bg = _start()
    if received == "c0":
        received = _received(wg, bg, 0.0)
    got = _app_steps(w0, b0, received, steps=3)
    sam = _app_steps(w0, b0, None, steps=3, cls=SAMStep)
    assert np.array_equal(got[0], sam[0]) and np.array_equal(got[1], sam[1])


def test_a_downlink_that_does_not_fit_the_parameters_is_refused():
    w0, b0, wg, bg = _start()
    sgd = LocalSGD(nn.Linear(3, 2).double().parameters(), lr=0.1)
    bad = Received(arrays={"weight": torch.from_numpy(wg)}, values={"c": 0.3}, param_names=["weight", "bias"])
    with pytest.raises(ValueError, match="lacks"):
        FedGFStep({"sam-rho": 0.1}, LocalOptimizerContext(sgd, bad))
    with pytest.raises(ValueError, match="param_names"):
        FedGFStep({"sam-rho": 0.1}, LocalOptimizerContext(sgd, Received(
            arrays={"weight": torch.from_numpy(wg)}, values={"c": 0.3}, param_names=["weight"])))


# --------------------------------------------------------------------------- whole local rounds


def _digits_like(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([0, 1, 1, 0, 0, 1, 3, 0] * (n // 8))  # class 2 vacant, 3 rare: every FedVLS term runs
    return torch.randn(n, 1, 8, 8, generator=g) + y.view(-1, 1, 1, 1).float(), y


def _round(cfg, received=None, seed=0):
    x, y = _digits_like()
    torch.manual_seed(seed)
    model = build_run_model(cfg, (1, 8, 8), 4)
    train_local(model, ClientData(x, y, 4, None, None), cfg, device=torch.device("cpu"),
                generator=torch.Generator().manual_seed(3), state=ClientState(), received=received)
    return model


def _perturbed(cfg, c):
    torch.manual_seed(0)
    model = build_run_model(cfg, (1, 8, 8), 4)
    g = torch.Generator().manual_seed(9)
    arrays = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}
    return Received(arrays=arrays, values={"c": c})


def test_train_local_with_c_0_or_nothing_received_is_fedsam_bit_for_bit():
    base = dict(method="fedavg", local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-3, device="cpu")
    sam = _round(RunConfig(**base, local_optimizer="sam"))
    cfg = RunConfig(**base, local_optimizer="fedgf")
    for received in (None, Received(), _perturbed(cfg, 0.0)):
        got = _round(cfg, received)
        assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), sam.state_dict().values()))
    mixed = _round(cfg, _perturbed(cfg, 0.3))
    assert not torch.equal(mixed[1].weight, sam[1].weight)


class NaiveFedGF:
    """The authors' client step written plainly, parameter by parameter, on whatever closure
    the objective gives (a reference for the composition test)."""

    def __init__(self, sgd, settings, received):
        self.sgd, self.rho = sgd, settings["sam-rho"]
        self.c = received.values["c"]
        self.wg = [received.arrays[n] for n in received.param_names]

    def load_client_state(self, state):  # a fresh momentum every round (optimizer-state = fresh)
        assert not state

    def client_state(self):
        return {}

    def step(self, closure):
        terms = closure()
        params = self.sgd.params
        w = [p.detach().clone() for p in params]
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params if p.grad is not None))
        with torch.no_grad():
            for p, wg in zip(params, self.wg):
                e = self.rho * p.grad / (norm + 1e-12) if p.grad is not None else torch.zeros_like(p)
                p.copy_(self.c * wg + (1 - self.c) * (p + e))
        closure()
        with torch.no_grad():
            for p, old in zip(params, w):
                p.copy_(old)
        self.sgd.step()
        return terms


@pytest.mark.parametrize("method", method_names())
def test_fedgf_composes_with_the_objective(method, monkeypatch, request):
    """Every local objective with local-optimizer = fedgf through train_local with a perturbed
    global model and c = 0.3: the app's step equals the plain reference step on the objective's
    own closure (its teacher, distillation, proximal, contrastive or decorrelation terms
    evaluated at the mixed point), and differs from FedSAM's.

    In float64: FedDecorr's and FedMR's terms standardise features of batches of 8, where a
    nearly constant feature makes the gradient huge, so float32 rounding alone moves the two
    paths apart (2e-4 for FedDecorr; in float64 they agree to 1e-10). FedMR at deco = 4
    drives this tiny MLP's weights from 0.3 to 10 in 12 steps, where even float64's rounding
    grows to 1e-4, so it runs at deco = 0.1 here (its term is checked on its own in
    tests/test_fedmr.py)."""
    torch.set_default_dtype(torch.float64)
    request.addfinalizer(lambda: torch.set_default_dtype(torch.float32))
    cfg = RunConfig(method=method, local_optimizer="fedgf", local_epochs=2, batch_size=8, lr=0.05, momentum=0.9,
                    weight_decay=1e-3, device="cpu", fedmr_deco=0.1)
    received = _perturbed(cfg, 0.3)
    app = _round(cfg, received)
    sam = _round(cfg.replace(local_optimizer="sam"))

    def naive(cfg, sgd, received):  # train_local has set received.param_names
        return NaiveFedGF(sgd, {"sam-rho": cfg.sam_rho}, received)

    monkeypatch.setattr(training, "round_optimizer", naive)
    ref = _round(cfg, received)
    for (name, a), b in zip(app.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-9, msg=name)
    assert next(app.parameters()).dtype == torch.float64
    assert max(float((a - b).abs().max()) for a, b in zip(app.state_dict().values(), sam.state_dict().values())) > 1e-3


# --------------------------------------------------------------------------- server


def _server(**over):
    cfg = RunConfig(local_optimizer="fedgf", **over)
    return FedGFServer(get_part("local-optimizer", "fedgf").own_settings(cfg.to_flower()), RunContext(cfg))


def test_server_hand_check():
    """w^{t-1} = 0; clients [3, 0, 0] (n = 1) and [0, 0, 1] (n = 3): w^t = [.75, 0, .75],
    D = (3 + 1) / 2 = 2, w_g = w^t + rho_g (w^{t-1} - w^t) / ||.||, ||w_g - w^t|| = rho_g."""
    server = _server(fedgf_rho_g=0.25, fedgf_c=0.3)
    count = np.array(7, dtype=np.int64)  # an integer buffer: no distance, not sent
    sent = {"w": np.zeros(3, dtype=np.float32), "n": count}
    replies = [Reply("a", {"w": np.array([3, 0, 0], np.float32), "n": count + 5}, 1, {}),
               Reply("b", {"w": np.array([0, 0, 1], np.float32), "n": count + 9}, 3, {})]
    new = weighted_average(replies, sent)
    np.testing.assert_array_equal(new["w"], [0.75, 0, 0.75])
    assert not server.downlink(1, sent)  # round 1: nothing besides the weights
    server.observe(1, sent, new, replies)
    assert server.last_divergence == 2.0
    assert server.report() == {"fedgf_c": 0.0, "fedgf_divergence": 2.0}  # round 1's clients ran FedSAM
    down = server.downlink(2, new)
    server.observe(2, new, new, [Reply("a", dict(new), 1, {})])
    assert server.report() == {"fedgf_c": 0.3, "fedgf_divergence": 0.0}  # the c round 2's clients used
    assert set(down.arrays) == {"w"} and down.arrays["w"].dtype == np.float32 and down.values == {"c": 0.3}
    step = down.arrays["w"].astype(np.float64) - new["w"]
    np.testing.assert_allclose(np.linalg.norm(step), 0.25, rtol=1e-6)
    np.testing.assert_allclose(step, -0.25 * np.array([1, 0, 1]) / math.sqrt(2), rtol=1e-6, atol=1e-7)


def test_server_guards_a_zero_update():
    server = _server()
    w = {"w": np.ones(4, dtype=np.float32)}
    server.observe(1, w, dict(w), [Reply("a", dict(w), 1, {})])
    down = server.downlink(2, w)
    assert np.isfinite(down.arrays["w"]).all() and np.array_equal(down.arrays["w"], w["w"])
    assert server.last_divergence == 0.0


def test_adaptive_c_is_the_mean_of_the_window_of_indicators():
    """D > T_D indicators over the last W rounds (W = 2, T_D = 1): D = .5, 2, 3, 1 (not above),
    5, 5 -> [0], [0,1], [1,1], [1,0], [0,1], [1,1] -> c = 0, .5, 1, .5, .5, 1."""
    server = _server(fedgf_c_mode="adaptive", fedgf_threshold=1.0, fedgf_window=2)
    expected = [0.0, 0.5, 1.0, 0.5, 0.5, 1.0]
    zero = {"w": np.zeros(2, dtype=np.float64)}
    for t, (d, c) in enumerate(zip([0.5, 2.0, 3.0, 1.0, 5.0, 5.0], expected), start=1):
        reply = Reply("a", {"w": np.array([0.6 * d, 0.8 * d])}, 1, {})  # ||w^{t-1} - w_k|| = d
        server.observe(t, zero, {"w": np.array([0.1, 0.0])}, [reply])
        assert server.last_divergence == pytest.approx(d, rel=1e-15)
        assert server.c == c
        down = server.downlink(t + 1, zero)
        assert (down.values == {"c": c}) if c > 0 else not down  # c = 0: nothing to mix, nothing sent


def test_state_round_trip_continues_with_the_same_perturbed_model_and_c():
    rng = np.random.default_rng(1)
    shapes = {"a.weight": (3, 4), "a.bias": (3,), "bn.running_var": (3,), "bn.num_batches_tracked": ()}

    def arrays(scale=1.0):
        return {k: (rng.normal(size=s) * scale).astype(np.float32) if "num" not in k else np.array(4, np.int64)
                for k, s in shapes.items()}

    def observe(server, t, sent, new, replies):
        server.observe(t, sent, new, replies)

    first = _server(fedgf_c_mode="adaptive", fedgf_threshold=2.0, fedgf_window=3)
    w = arrays()
    history = []
    for t in range(1, 4):
        replies = [Reply(str(i), {k: v + a for (k, v), a in zip(w.items(), arrays(0.5).values())}, 10 + i, {})
                   for i in range(3)]
        new = weighted_average(replies, w)
        history.append((t, w, new, replies))
        observe(first, t, w, new, replies)
        w = new
    saved = {k: v.copy() for k, v in first.state().items()}
    second = _server(fedgf_c_mode="adaptive", fedgf_threshold=2.0, fedgf_window=3)
    second.load_state(saved)
    a, b = first.downlink(4, w), second.downlink(4, w)
    assert a.values == b.values and set(a.arrays) == set(b.arrays) == {"a.weight", "a.bias", "bn.running_var"}
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) and a.arrays[k].dtype == b.arrays[k].dtype for k in a.arrays)
    assert second.window == first.window and len(first.window) == 3
    replies = [Reply("x", {k: v + a for (k, v), a in zip(w.items(), arrays(0.5).values())}, 5, {})]
    new = weighted_average(replies, w)
    for server in (first, second):
        server.observe(4, w, new, replies)
    assert first.c == second.c and first.window == second.window
    assert all(np.array_equal(first.downlink(5, new).arrays[k], second.downlink(5, new).arrays[k])
               for k in first.perturbed)
    fresh = _server()
    fresh.load_state({})
    assert not fresh.downlink(1, w) and fresh.state() == {}


# --------------------------------------------------------------------------- settings


def test_settings_are_declared_once_and_validated():
    assert {name for _, name in owners("sam-rho")} == {"sam", "fedgf"}
    cfg = parse_run_config({"local-optimizer": "fedgf"})
    assert (cfg.sam_rho, cfg.fedgf_rho_g, cfg.fedgf_c, cfg.fedgf_c_mode, cfg.fedgf_window) == (0.1, 0.1, 0.3, "fixed", 30)
    assert get_part("local-optimizer", "fedgf").load_server() is FedGFServer


@pytest.mark.parametrize(
    "item, message",
    [
        ("fedgf-c=1.5", "'fedgf-c' = 1.5: must be in [0, 1]"),
        ("fedgf-rho-g=-0.1", "'fedgf-rho-g' = -0.1: must be >= 0"),
        ("fedgf-c-mode='auto'", "'fedgf-c-mode' = 'auto' is not allowed; choose one of: fixed, adaptive"),
        ("fedgf-threshold=-1", "'fedgf-threshold' = -1.0: must be >= 0"),
        ("fedgf-window=0", "'fedgf-window' = 0: must be >= 1"),
        ("fedgf-window=2.5", "'fedgf-window' = 2.5: expected an integer"),
        ("sam-rho=0", "'sam-rho' = 0.0: must be > 0"),
    ],
)
def test_check_names_a_bad_fedgf_setting(item, message, capsys):
    assert check_main(["--run-config", f"local-optimizer='fedgf' {item}", "--no-data"]) == 2
    assert message in capsys.readouterr().err


def test_the_adaptive_mode_needs_its_threshold_set(capsys):
    """T_D has no default: one fit to one setting (1.5 on digits) is below round 1's D on another
    (mnist10k at Dirichlet 0.05), so c jumps to 1 there and training diverges."""
    adaptive = "local-optimizer='fedgf' fedgf-c-mode='adaptive'"
    assert check_main(["--run-config", adaptive, "--no-data"]) == 2
    err = capsys.readouterr().err
    assert "'fedgf-threshold' is unset (0) but fedgf-c-mode = 'adaptive' needs T_D > 0" in err
    assert "fedgf_divergence" in err and "fedgf-c-mode='fixed'" in err
    with pytest.raises(ConfigError, match="fedgf-threshold"):
        parse_run_config({"local-optimizer": "fedgf", "fedgf-c-mode": "adaptive"})  # the ServerApp's validation
    assert check_main(["--run-config", f"{adaptive} fedgf-threshold=1.6", "--no-data"]) == 0
    assert check_main(["--run-config", "local-optimizer='fedgf'", "--no-data"]) == 0  # fixed c needs no T_D
