"""Tests of fedvls_flwr.algorithms.objectives against plain, loop-based float64 references of SPEC.md."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from fedvls_flwr.algorithms.objectives.base import MASK_VALUE, Objective, objective_for
from fedvls_flwr.config.registry import method_names, method_settings

METHODS = method_names()
#: Objectives that are a function of the logits alone (MOON and FedDecorr also read the
#: model's representation; they have tests of their own below).
LOGIT_METHODS = tuple(m for m in METHODS if objective_for(m, torch.tensor([1, 1])).features is None)


def params(**changes) -> dict:
    """Objective parameters by snake_case name (``logit_weight`` sets both forms' weight)."""
    out = {}
    for name, value in changes.items():
        keys = ("logit-weight", "paper-logit-weight") if name == "logit_weight" else (name.replace("_", "-"),)
        out.update(dict.fromkeys(keys, value))
    return out


def resolved(method: str, given: dict) -> SimpleNamespace:
    """Every parameter (declared defaults + ``given``) as attributes, for the references;
    ``logit_weight`` is the weight the method's form reads."""
    values = {s.name: s.default for s in method_settings()}
    values.update({key.replace("-", "_"): value for key, value in given.items()})
    if method == "fedvls-paper":
        values["logit_weight"] = values["paper_logit_weight"]
    return SimpleNamespace(**values)

# ----------------------------------------------------------------------------------------
# Loop-based references (python loops over samples and classes, float64, autograd)
# ----------------------------------------------------------------------------------------


def ref_lse(values):
    """log(sum(exp(v))) of a list of scalar tensors, shifted by the max."""
    m = max(float(v.detach()) for v in values)
    total = 0.0
    for v in values:
        total = total + torch.exp(v - m)
    return m + torch.log(total)


def ref_ce_over(row, classes, y):
    """-log softmax_y restricted to ``classes`` (the set the softmax runs over)."""
    return ref_lse([row[c] for c in classes]) - row[y]


def ref_kl(t_row, s_row, classes):
    """KL(softmax(t) || softmax(s)) over ``classes``."""
    lt = ref_lse([t_row[c] for c in classes])
    ls = ref_lse([s_row[c] for c in classes])
    kl = 0.0
    for c in classes:
        log_pt = t_row[c] - lt
        log_ps = s_row[c] - ls
        kl = kl + torch.exp(log_pt) * (log_pt - log_ps)
    return kl


def ref_prior(counts):
    total = sum(counts)
    return [n / total for n in counts]


def ref_fedavg(f, y, counts, params, g=None):
    B, C = f.shape
    loss = 0.0
    for i in range(B):
        loss = loss + ref_ce_over(f[i], range(C), y[i])
    return loss / B


def ref_fedlc(f, y, counts, params, g=None):
    B, C = f.shape
    tau = params.fedlc_tau
    present = [c for c in range(C) if counts[c] > 0]
    loss = 0.0
    for i in range(B):
        z = {c: f[i, c] - tau * counts[c] ** (-0.25) for c in present}
        if params.fedlc_form == "standard":
            denom = present
        else:
            denom = [c for c in present if c != y[i]]
        loss = loss + ref_lse([z[c] for c in denom]) - z[y[i]]
    return loss / B


def ref_fedntd(f, y, counts, params, g):
    B, C = f.shape
    tau, beta = params.fedntd_tau, params.fedntd_beta
    ce = ref_fedavg(f, y, counts, params)
    kl = 0.0
    for i in range(B):
        nt = [c for c in range(C) if c != y[i]]
        kl = kl + ref_kl(g[i] / tau, f[i] / tau, nt)
    return ce + beta * tau**2 * kl / B


def _ref_dis(f, g, counts, params):
    B, C = f.shape
    vacant = [c for c in range(C) if counts[c] == 0]
    if not params.use_dis or len(vacant) < 2:
        return 0.0
    kl = 0.0
    for i in range(B):
        kl = kl + ref_kl(g[i], f[i], vacant)
    return params.lambda_dis * kl / B


def ref_fedvls(f, y, counts, params, g=None):
    """Authors' bounded form (SPEC point 1, 2)."""
    B, C = f.shape
    p = ref_prior(counts)
    cal = 0.0
    for i in range(B):
        row = [f[i, c] + math.log(p[c] + 1e-9) for c in range(C)]
        cal = cal + ref_ce_over(row, range(C), y[i])
    cal = cal / B
    dis = _ref_dis(f, g, counts, params)
    logit = 0.0
    if params.use_logit:
        w = params.logit_weight
        for c in range(C):
            if p[c] == 0:
                continue
            s = torch.zeros((), dtype=torch.float64)
            for i in range(B):
                if y[i] != c:
                    s = s + torch.exp(f[i, c] - math.log(p[c] + 1e-9) + math.log(1.0 / C))
                else:
                    s = s + 1.0  # exp(0): kept in the sum
            logit = logit + p[c] * torch.log(s / B)
        logit = w * logit
    return cal + dis + logit


def ref_fedvls_paper(f, y, counts, params, g=None):
    """Literal eqs. 2-5."""
    B, C = f.shape
    p = ref_prior(counts)
    present = [c for c in range(C) if counts[c] > 0]
    cal = 0.0
    for i in range(B):
        row = {c: f[i, c] + math.log(p[c]) for c in present}
        cal = cal + ref_lse([row[c] for c in present]) - row[y[i]]
    cal = cal / B
    dis = _ref_dis(f, g, counts, params)
    logit = 0.0
    if params.use_logit:
        w = params.logit_weight
        for c in present:
            others = [f[i, c] for i in range(B) if y[i] != c]
            if not others:
                continue
            logit = logit + p[c] * (ref_lse(others) - math.log(B))
        logit = w * logit
    return cal + dis + logit


def ref_fedrs(f, y, counts, params, g=None):
    B, C = f.shape
    top = max(counts)
    if params.fedrs_form == "binary":
        scale = [1.0 if counts[c] > 0 else params.fedrs_alpha for c in range(C)]
    else:
        scale = [params.fedrs_alpha + (1 - params.fedrs_alpha) * counts[c] / top for c in range(C)]
    loss = 0.0
    for i in range(B):
        loss = loss + ref_ce_over([f[i, c] * scale[c] for c in range(C)], range(C), y[i])
    return loss / B


def ref_fedlmd(f, y, counts, params, g):
    B, C = f.shape
    T, beta = params.fedlmd_tau, params.fedlmd_beta
    mean = sum(counts) / C
    ce = ref_fedavg(f, y, counts, params)
    kl = 0.0
    for i in range(B):
        t = [g[i, c] / T - 1000.0 * (counts[c] > mean) - 1000.0 * (c == y[i]) for c in range(C)]
        st = [f[i, c] / T - 1000.0 * (c == y[i]) for c in range(C)]
        kl = kl + ref_kl(t, st, range(C))
    return ce + beta * T**2 * kl / B


REFS = {
    "fedavg": ref_fedavg,
    "fedprox": ref_fedavg,  # at the logits: CE; the proximal term acts on the weights (tested below)
    "fedrs": ref_fedrs,
    "fedlmd": ref_fedlmd,
    "fedlc": ref_fedlc,
    "fedntd": ref_fedntd,
    "fedvls": ref_fedvls,
    "fedvls-paper": ref_fedvls_paper,
}

# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------


def make_case(seed, C=7, B=12, vacant=(), batch_classes=None, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 60, (C,), generator=gen)
    for c in vacant:
        counts[c] = 0
    present = [c for c in range(C) if counts[c] > 0]
    pool = present if batch_classes is None else list(batch_classes)
    idx = torch.randint(0, len(pool), (B,), generator=gen)
    y = torch.tensor([pool[int(k)] for k in idx], dtype=torch.long)
    f = (scale * torch.randn(B, C, generator=gen, dtype=torch.float64)).requires_grad_(True)
    g = scale * torch.randn(B, C, generator=gen, dtype=torch.float64)
    return counts, f, y, g


def run_both(method, params, counts, f, y, g):
    obj = objective_for(method, counts, params)
    loss, terms = obj(f, y, g)
    (grad,) = torch.autograd.grad(loss, f)
    ref = REFS[method](f, y.tolist(), counts.tolist(), resolved(method, params), g)
    (ref_grad,) = torch.autograd.grad(ref, f)
    return obj, loss, terms, grad, ref, ref_grad


def assert_matches(method, params, counts, f, y, g, rtol=1e-9, atol=1e-10):
    obj, loss, terms, grad, ref, ref_grad = run_both(method, params, counts, f, y, g)
    assert loss.dim() == 0 and loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(grad, ref_grad, rtol=rtol, atol=atol)
    # terms: the declared names, detached, summing to the loss
    assert tuple(terms) == obj.term_names
    assert all(not t.requires_grad and t.dim() == 0 for t in terms.values())
    torch.testing.assert_close(sum(terms.values()), loss.detach(), rtol=1e-12, atol=1e-12)
    return obj, loss, terms


PARAM_SETS = [
    params(),
    params(fedlc_form="paper", fedlc_tau=0.1, fedntd_beta=0.3, fedntd_tau=2.0,
                    lambda_dis=0.5, logit_weight=0.3, fedrs_alpha=0.4, fedrs_form="proportional",
                    fedlmd_beta=0.7, fedlmd_tau=2.0, fedprox_mu=0.5),
]
VACANT_SETS = [(), (2,), (0, 3, 5)]

# ----------------------------------------------------------------------------------------
# Value and gradient against the references
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", LOGIT_METHODS)
@pytest.mark.parametrize("vacant", VACANT_SETS, ids=["no-vacant", "one-vacant", "three-vacant"])
@pytest.mark.parametrize("pi", range(len(PARAM_SETS)), ids=["defaults", "custom"])
def test_matches_reference(method, vacant, pi):
    seed = 100 * METHODS.index(method) + 10 * VACANT_SETS.index(vacant) + pi
    counts, f, y, g = make_case(seed=seed, vacant=vacant)
    assert_matches(method, PARAM_SETS[pi], counts, f, y, g)


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_one_class_in_batch(method):
    counts, f, y, g = make_case(seed=11, vacant=(0, 4), batch_classes=[3])
    assert (y == 3).all()
    assert_matches(method, params(), counts, f, y, g)
    assert_matches(method, params(fedlc_form="paper"), counts, f, y, g)


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_client_with_one_class(method):
    C, B = 6, 9
    counts = torch.zeros(C, dtype=torch.long)
    counts[2] = 40
    y = torch.full((B,), 2, dtype=torch.long)
    f = torch.randn(B, C, dtype=torch.float64, requires_grad=True)
    g = torch.randn(B, C, dtype=torch.float64)
    obj = objective_for(method, counts)
    loss, terms = obj(f, y, g)
    (grad,) = torch.autograd.grad(loss, f)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    if method != "fedlc":  # standard fedlc / fedavg / fedntd / fedvls: compare to reference
        assert_matches(method, params(), counts, f, y, g)
    else:
        # the only class left: softmax over one class -> CE = 0, no gradient
        assert float(loss.detach()) == pytest.approx(0.0, abs=1e-12)
        assert float(grad.abs().max()) == 0.0
    # FedLC paper form: the denominator (c != y) is empty -> large negative but finite
    obj_p = objective_for("fedlc", counts, params(fedlc_form="paper"))
    loss_p, _ = obj_p(f, y)
    (grad_p,) = torch.autograd.grad(loss_p, f)
    assert torch.isfinite(loss_p) and float(loss_p.detach()) < -1e8
    assert torch.isfinite(grad_p).all()
    if method == "fedvls-paper":
        assert float(terms["logit"]) == 0.0  # every sample is of class 2: class skipped


def test_fedlc_zero_counts_removed_from_softmax():
    counts = torch.tensor([0, 5, 0, 100, 7])
    f = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([1, 3, 3, 4, 1, 3])
    for form in ("standard", "paper"):
        obj = objective_for("fedlc", counts, params(fedlc_form=form))
        loss, _ = obj(f, y)
        (grad,) = torch.autograd.grad(loss, f)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert float(grad[:, [0, 2]].abs().max()) == 0.0  # vacant logits get no gradient
        # the value does not depend on the vacant logits at all
        f2 = f.detach().clone()
        f2[:, [0, 2]] = 1e4
        torch.testing.assert_close(obj(f2, y)[0], loss.detach())


def test_fedvls_paper_vacant_masked_bounded_not():
    counts = torch.tensor([0, 5, 0, 100, 7])
    y = torch.tensor([1, 3, 3, 4, 1, 3])
    f = torch.randn(6, 5, dtype=torch.float64)
    f2 = f.clone()
    f2[:, [0, 2]] += 50.0
    p = params(use_dis=False, use_logit=False)
    paper = objective_for("fedvls-paper", counts, p)
    bounded = objective_for("fedvls", counts, p)
    torch.testing.assert_close(paper(f2, y)[0], paper(f, y)[0])  # vacant out of the softmax
    assert float(bounded(f2, y)[0]) > float(bounded(f, y)[0]) + 1.0  # log(1e-9) only damps


@pytest.mark.parametrize("method", LOGIT_METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_logits_finite(method, dtype):
    counts, f, y, g = make_case(seed=5, vacant=(1, 4, 6))
    for scale in (1e4, -1e4):
        f = (scale * torch.randn(f.shape, dtype=dtype)).requires_grad_(True)
        g = scale * torch.randn(f.shape, dtype=dtype)
        for form in ("standard", "paper"):
            obj = objective_for(method, counts, params(fedlc_form=form, logit_weight=1.0))
            loss, terms = obj(f, y, g)
            (grad,) = torch.autograd.grad(loss, f)
            assert loss.dtype == dtype
            assert torch.isfinite(loss), (method, form, loss)
            assert torch.isfinite(grad).all(), (method, form)
            assert all(torch.isfinite(t) for t in terms.values())


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_half_precision_upcast(method):
    counts, f, y, g = make_case(seed=3, vacant=(0, 2))
    fb = f.detach().to(torch.bfloat16).requires_grad_(True)
    obj = objective_for(method, counts)
    loss, _ = obj(fb, y, g.to(torch.bfloat16))
    assert loss.dtype == torch.float32
    loss.backward()
    assert fb.grad is not None and fb.grad.dtype == torch.bfloat16 and torch.isfinite(fb.grad.float()).all()


# ----------------------------------------------------------------------------------------
# Semantics: teacher, ablations, defaults, errors
# ----------------------------------------------------------------------------------------


def test_needs_teacher():
    no_vacant = torch.tensor([3, 4, 5, 6])
    one_vacant = torch.tensor([3, 0, 5, 6])
    two_vacant = torch.tensor([3, 0, 0, 6])
    for counts in (no_vacant, one_vacant, two_vacant):
        assert not objective_for("fedavg", counts).needs_teacher
        assert not objective_for("fedlc", counts).needs_teacher
        assert objective_for("fedntd", counts).needs_teacher
    for m in ("fedvls", "fedvls-paper"):
        assert not objective_for(m, no_vacant).needs_teacher
        assert not objective_for(m, one_vacant).needs_teacher
        assert objective_for(m, two_vacant).needs_teacher
        assert not objective_for(m, two_vacant, params(use_dis=False)).needs_teacher
        assert not objective_for(m, two_vacant, params(lambda_dis=0.0)).needs_teacher
    assert not objective_for("fedntd", no_vacant, params(fedntd_beta=0.0)).needs_teacher


@pytest.mark.parametrize("method", ["fedntd", "fedvls", "fedvls-paper"])
def test_missing_teacher_raises(method):
    counts = torch.tensor([3, 0, 0, 6])
    obj = objective_for(method, counts)
    assert obj.needs_teacher
    with pytest.raises(ValueError, match="teacher"):
        obj(torch.randn(4, 4), torch.tensor([0, 3, 3, 0]))


@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_teacher_not_needed_is_ignored(method):
    counts = torch.tensor([3, 0, 4, 6])  # at most one vacant class
    if method in ("fedntd", "fedlmd"):
        pytest.skip(f"{method} always uses the teacher")
    obj = objective_for(method, counts)
    assert not obj.needs_teacher
    f = torch.randn(5, 4)
    y = torch.tensor([0, 2, 3, 3, 0])
    a, _ = obj(f, y)
    b, _ = obj(f, y, torch.randn(5, 4))
    torch.testing.assert_close(a, b)


def test_teacher_gets_no_gradient():
    counts = torch.tensor([3, 0, 0, 6, 0])
    for m in ("fedntd", "fedvls"):
        f = torch.randn(4, 5, requires_grad=True)
        g = torch.randn(4, 5, requires_grad=True)
        loss, _ = objective_for(m, counts)(f, torch.tensor([0, 3, 3, 0]), g)
        loss.backward()
        assert g.grad is None and f.grad is not None


@pytest.mark.parametrize("method", ["fedvls", "fedvls-paper"])
def test_ablation_switches(method):
    counts, f, y, g = make_case(seed=21, vacant=(0, 3, 5))
    full = objective_for(method, counts)
    l_full, t_full = full(f, y, g)
    assert float(t_full["dis"]) > 0 and float(t_full["logit"]) != 0

    no_dis = objective_for(method, counts, params(use_dis=False))
    assert not no_dis.needs_teacher
    l_nd, t_nd = no_dis(f, y, g)
    assert float(t_nd["dis"]) == 0.0
    torch.testing.assert_close(l_nd, l_full - t_full["dis"])
    torch.testing.assert_close(no_dis(f, y)[0], l_nd)  # teacher irrelevant
    assert_matches(method, params(use_dis=False), counts, f, y, g)

    no_logit = objective_for(method, counts, params(use_logit=False))
    l_nl, t_nl = no_logit(f, y, g)
    assert float(t_nl["logit"]) == 0.0
    torch.testing.assert_close(l_nl, l_full - t_full["logit"])
    assert_matches(method, params(use_logit=False), counts, f, y, g)

    cal_only = objective_for(method, counts, params(use_dis=False, use_logit=False))
    l_c, t_c = cal_only(f, y)
    torch.testing.assert_close(l_c, t_full["cal"])
    # no vacant pair: dis is identically zero even when enabled
    counts1, f1, y1, g1 = make_case(seed=22, vacant=(2,))
    _, t1 = objective_for(method, counts1)(f1, y1, g1)
    assert float(t1["dis"]) == 0.0


def test_logit_weight_defaults():
    counts, f, y, g = make_case(seed=8, vacant=(1, 2))
    assert objective_for("fedvls", counts).logit_weight == 0.005
    assert objective_for("fedvls-paper", counts).logit_weight == 1.0
    for m in ("fedvls", "fedvls-paper"):
        assert objective_for(m, counts, params(logit_weight=0.25)).logit_weight == 0.25
        default = objective_for(m, counts)
        _, t_def = default(f, y, g)
        _, t_one = objective_for(m, counts, params(logit_weight=1.0))(f, y, g)
        torch.testing.assert_close(t_def["logit"] / default.logit_weight, t_one["logit"])
        _, t_zero = objective_for(m, counts, params(logit_weight=0.0))(f, y, g)
        assert float(t_zero["logit"]) == 0.0


def test_fedlc_forms_differ():
    counts, f, y, g = make_case(seed=4, vacant=(6,))
    std = objective_for("fedlc", counts, params(fedlc_form="standard"))
    pap = objective_for("fedlc", counts, params(fedlc_form="paper"))
    a, b = std(f.detach(), y)[0], pap(f.detach(), y)[0]
    assert float(a) > float(b) + 1e-3  # removing the label from the denominator lowers the loss
    with pytest.raises(ValueError, match="fedlc-form"):
        objective_for("fedlc", counts, params(fedlc_form="nope"))


def test_fedlc_margin_direction():
    # rare classes get the larger margin subtracted: tau * n^(-1/4)
    counts = torch.tensor([1, 16, 0])
    obj = objective_for("fedlc", counts, params(fedlc_tau=0.5))
    torch.testing.assert_close(obj.margin, torch.tensor([0.5, 0.25, 0.0], dtype=torch.float64))
    assert torch.isfinite(obj.margin).all()


def test_unknown_method():
    with pytest.raises(ValueError) as ei:
        objective_for("fedfoo", torch.tensor([1, 2, 3]))
    msg = str(ei.value)
    assert "fedprox" in msg
    assert all(m in msg for m in METHODS)


def test_bad_inputs():
    with pytest.raises(ValueError):
        objective_for("fedavg", torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError):
        objective_for("fedavg", torch.tensor([1, -1, 3]))
    obj = objective_for("fedavg", torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError):
        obj(torch.randn(4, 5), torch.zeros(4, dtype=torch.long))


def test_interface_and_precompute():
    counts = torch.tensor([10, 0, 30, 0, 60])
    for m in METHODS:
        obj = objective_for(m, counts)
        assert isinstance(obj, Objective) and obj.name == m
        assert isinstance(obj.term_names, tuple) and obj.term_names
    obj = objective_for("fedvls", counts)
    assert obj.vacant_idx.tolist() == [1, 3]
    torch.testing.assert_close(obj.prior, torch.tensor([0.1, 0.0, 0.3, 0.0, 0.6], dtype=torch.float64))
    assert objective_for("fedavg", counts).term_names == ("ce",)
    assert objective_for("fedntd", counts).term_names == ("ce", "ntd")
    assert obj.term_names == ("cal", "dis", "logit")
    assert MASK_VALUE < -1e8 and math.isfinite(MASK_VALUE)


def test_bounded_logit_lower_bound():
    # SPEC: with class c in the batch, L^c >= log(count_c / B) however negative the logits
    counts = torch.tensor([10, 20, 30])
    y = torch.tensor([0, 1, 2, 2])
    f = torch.full((4, 3), -1e4, dtype=torch.float64)
    _, t = objective_for("fedvls", counts, params(logit_weight=1.0))(f, y)
    p = torch.tensor([1 / 6, 2 / 6, 3 / 6], dtype=torch.float64)
    bound = (p * torch.log(torch.tensor([1 / 4, 1 / 4, 2 / 4], dtype=torch.float64))).sum()
    torch.testing.assert_close(t["logit"], bound)
    # the paper form is unbounded: it follows the logits down
    _, tp = objective_for("fedvls-paper", counts)(f, y)
    assert float(tp["logit"]) < -9e3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", LOGIT_METHODS)
def test_cuda_no_host_sync(method):
    dev = torch.device("cuda")
    counts = torch.tensor([10, 0, 30, 0, 60, 0, 5], device=dev)
    obj = objective_for(method, counts)
    f = torch.randn(64, 7, device=dev, requires_grad=True)
    g = torch.randn(64, 7, device=dev)
    y = torch.tensor([0, 2, 4, 6] * 16, device=dev)
    obj(f, y, g)  # warm-up (caches per-dtype buffers)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, terms = obj(f, y, g)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()
