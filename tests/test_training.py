"""Local training loop: every objective lowers its loss; augment and amp settings behave as documented."""

import logging

import pytest
import torch
from torch import nn

from fedvls_flwr.algorithms import training
from fedvls_flwr.algorithms.objectives.base import objective_for
from fedvls_flwr.algorithms.training import make_teacher, train_local
from fedvls_flwr.config.registry import get_method, method_names
from fedvls_flwr.config.run_config import RunConfig
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.models import FeatureTap

METHODS = method_names()

NUM_CLASSES = 5
PRESENT = (0, 1, 2)  # classes 3 and 4 are vacant on this client (|O| = 2: L_dis is active)


def _problem(n_per_class=(24, 12, 4), seed=0):
    """Separable Gaussian blobs (1, 4, 4) for the present classes, imbalanced."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(NUM_CLASSES, 16, generator=g) * 2.0
    xs, ys = [], []
    for c, n in zip(PRESENT, n_per_class):
        xs.append(centers[c] + 0.5 * torch.randn(n, 16, generator=g))
        ys.append(torch.full((n,), c, dtype=torch.int64))
    return torch.cat(xs).view(-1, 1, 4, 4), torch.cat(ys)


def _mlp(seed=0, method="fedavg"):
    """A small MLP; wrapped as the method's spec says (MOON: a projection head of 8 outputs)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))
    spec = get_method(method)
    wrap = spec.load_model_wrapper()
    return model if wrap is None else wrap(model, spec.own_settings({"moon-projection-dim": 8}), NUM_CLASSES)


def _forward(model, x, objective):
    """(logits, what objective.features names)."""
    if objective.features == "projection":
        return model.project(x)
    if objective.features == "penultimate":
        tap = FeatureTap(model)
        logits = model(x)
        tap.remove()
        return logits, tap.features
    return model(x), None


def _tiny_convnet(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, NUM_CLASSES),
    )


def _full_loss(model, teacher, x, y, cfg):
    """The configured objective on the whole local set (teacher = the received model)."""
    counts = torch.bincount(y, minlength=NUM_CLASSES)
    objective = objective_for(cfg.method, counts, get_method(cfg.method).own_settings(cfg.to_flower()))
    with torch.no_grad():
        t_out = None
        if objective.needs_teacher:
            t_out = teacher(x) if objective.teacher_output == "logits" else teacher.project(x)[1]
        logits, features = _forward(model, x, objective)
        loss, _ = objective(logits, y, t_out, features)
    return float(loss)


def _cfg(**kw):
    base = dict(local_epochs=3, batch_size=8, lr=0.05, momentum=0.9, weight_decay=0.0, device="cpu")
    return RunConfig(**{**base, **kw})


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("method", METHODS)
def test_train_local_lowers_the_loss(method):
    x, y = _problem()
    cfg = _cfg(method=method, moon_projection_dim=8)
    model = _mlp(method=method)
    received = make_teacher(model, "eval")
    before = _full_loss(model, received, x, y, cfg)
    res = train_local(
        model, ClientData(x, y, NUM_CLASSES, None, None), cfg, device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(0),
    )
    after = _full_loss(model, received, x, y, cfg)
    assert after < before - 1e-3, f"{method}: loss {before:.4f} -> {after:.4f}"
    assert res.num_examples == len(y) and res.steps == cfg.local_epochs * 5
    assert res.num_vacant == NUM_CLASSES - len(PRESENT)
    assert all(torch.isfinite(torch.tensor(v)) for v in [res.loss, *res.terms.values()])


@pytest.mark.parametrize("method", ["fedavg", "fedvls", "fedntd"])
def test_augment_is_a_no_op_for_data_stored_normalised(method):
    """mean=None (the MNIST-like sets): augment=true changes nothing, bit for bit."""
    x, y = _problem()
    cfg = _cfg(method=method, local_epochs=2)
    states = []
    for augment in (False, True):
        model = _mlp()
        train_local(
            model, ClientData(x, y, NUM_CLASSES, None, None), cfg.replace(augment=augment), device=torch.device("cpu"),
            generator=torch.Generator().manual_seed(3),
        )
        states.append(_state(model))
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k


def _uint8_images(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g)
    y = torch.tensor([c for c in PRESENT for _ in range(n // len(PRESENT))], dtype=torch.int64)
    return x, y


MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def test_augmented_training_is_reproducible_from_the_generator():
    """uint8 images: the augmentation draws come from the round's generator."""
    x, y = _uint8_images()
    cfg = _cfg(method="fedvls", local_epochs=1)

    def run(seed, augment=True):
        model = _tiny_convnet()
        res = train_local(
            model, ClientData(x, y, NUM_CLASSES, MEAN, STD), cfg.replace(augment=augment), device=torch.device("cpu"),
            generator=torch.Generator().manual_seed(seed),
        )
        assert all(torch.isfinite(torch.tensor(v)) for v in [res.loss, *res.terms.values()])
        return _state(model)

    a, b, c, plain = run(1), run(1), run(2), run(1, augment=False)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())
    assert any(not torch.equal(a[k], plain[k]) for k in a if a[k].is_floating_point())


def test_amp_on_cpu_runs_is_ignored_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(training, "_AMP_CPU_LOGGED", False)
    x, y = _uint8_images()
    states = []
    with caplog.at_level(logging.WARNING, logger=training.__name__):
        for amp in (True, False, True):
            model = _tiny_convnet()
            res = train_local(
                model, ClientData(x, y, NUM_CLASSES, MEAN, STD), _cfg(method="fedvls", local_epochs=1, amp=amp, augment=False),
                device=torch.device("cpu"), generator=torch.Generator().manual_seed(0),
            )
            assert all(torch.isfinite(torch.tensor(v)) for v in [res.loss, *res.terms.values()])
            states.append(_state(model))
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])  # amp ignored: plain float32
    messages = [r.getMessage() for r in caplog.records if "amp" in r.getMessage()]
    assert len(messages) == 1 and "ignored" in messages[0] and "CUDA" in messages[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphed"])
@pytest.mark.parametrize("method", ["fedavg", "fedntd", "fedvls"])
def test_amp_on_cuda_keeps_loss_terms_finite(method, graphs):
    from fedvls_flwr.algorithms.graphed import clear_trainers
    from fedvls_flwr.models import build_model

    clear_trainers()  # the graphed path trains a copy of this model, hook included, made on first use
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (96, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 3, (96,), generator=g)
    torch.manual_seed(0)
    model = build_model("mobilenetv2", (3, 32, 32), 10)
    dtypes = set()
    model.register_forward_hook(lambda m, i, out: dtypes.add(out.dtype))
    cfg = _cfg(method=method, local_epochs=2, batch_size=32, amp=True, device="cuda", cuda_graphs=graphs)
    res = train_local(
        model, ClientData(x, y, 10, MEAN, STD), cfg.replace(augment=True), device=device,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.bfloat16 in dtypes  # the forward pass ran under autocast
    assert all(torch.isfinite(torch.tensor(v)) for v in [res.loss, *res.terms.values()])
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    assert res.num_vacant == 7


@pytest.mark.parametrize("method", ["fedntd", "fedvls", "fedvls-paper"])
@pytest.mark.parametrize("teacher_mode", ["eval", "train"])
def test_teacher_computed_once_per_round_equals_per_batch(method, teacher_mode):
    """The once-per-round teacher cache gives the same losses and the same trained weights
    as running the teacher on every batch (an MLP has no train-mode behaviour, so the
    cache also serves teacher-mode = train)."""
    x, y = _problem()
    cfg = _cfg(method=method, teacher_mode=teacher_mode, **({"paper_logit_weight": 0.01} if method == "fedvls-paper" else {}))
    results, states = [], []
    for cache in (True, False):
        model = _mlp()
        results.append(train_local(model, ClientData(x, y, NUM_CLASSES, None, None), cfg, device=torch.device("cpu"),
                                   generator=torch.Generator().manual_seed(3), cache_teacher=cache))
        states.append(_state(model))
    cached, per_batch = results
    assert cached.steps == per_batch.steps
    assert cached.loss == pytest.approx(per_batch.loss, rel=1e-5, abs=1e-7)
    for name in cached.terms:
        assert cached.terms[name] == pytest.approx(per_batch.terms[name], rel=1e-5, abs=1e-7), name
    assert cached.terms[objective_for(method, torch.bincount(y, minlength=NUM_CLASSES)).term_names[1]] != 0.0
    for key in states[0]:
        torch.testing.assert_close(states[0][key], states[1][key], rtol=1e-5, atol=1e-6)


def test_mode_dependent_models_keep_the_per_batch_teacher_in_train_mode():
    assert not training.mode_dependent(_mlp())
    assert training.mode_dependent(_tiny_convnet())
