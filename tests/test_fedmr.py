"""FedMR checked against its authors' ``MR_loss`` (krumpguo/FedVLS clientmr.py, the same in
MediaBrain-SJTU/FedMR): an independent loop over classes in float64 written from that code,
compared with the app's vectorised term in value and gradient; the hand checks; and
deco = 0 trains exactly as FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedvls_flwr.algorithms.aggregation import Reply, weighted_average
from fedvls_flwr.algorithms.objectives.base import objective_for
from fedvls_flwr.algorithms.objectives.fedmr import manifold_reshaping_term
from fedvls_flwr.algorithms.training import train_local
from fedvls_flwr.config.run_config import ConfigError, RunConfig, parse_run_config
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.models import FeatureTap, build_model


def reference_mr(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The authors' loop: classes seen once are skipped; per class, centre, divide by
    sqrt(1e-8 + unbiased var), Gram Z^T Z, mean of the squared off-diagonal entries; the
    sum over classes divided by the number of samples of the counted classes; 0 if none."""
    loss, n_count = h.new_zeros(()), 0
    labels, counts = y.unique(return_counts=True)
    for label, count in zip(labels.tolist(), counts.tolist()):
        if count <= 1:
            continue
        x = h[y == label]
        x = x - x.mean(dim=0, keepdim=True)
        x = x / torch.sqrt(1e-8 + x.var(dim=0, keepdim=True))
        g = x.T @ x
        d = g.shape[0]
        off = [g[i, j] ** 2 for i in range(d) for j in range(d) if i != j]
        loss = loss + torch.stack(off).mean()
        n_count += x.shape[0]
    return loss / n_count if n_count else h.new_zeros(())


@pytest.mark.parametrize("labels", [
    [0, 0, 1, 1, 1, 2, 3, 3, 3, 3],      # a class seen once (2) is skipped
    [4, 4, 4, 4, 4, 4],                  # one class
    [0, 1, 2, 3, 4, 5],                  # every class once: R = 0, no gradient, no NaN
])
def test_value_and_gradient_match_the_authors_loop(labels):
    g = torch.Generator().manual_seed(len(labels))
    y = torch.tensor(labels)
    h = torch.randn(len(labels), 7, generator=g, dtype=torch.float64).requires_grad_(True)
    mine = manifold_reshaping_term(h, y, 10)
    ref = reference_mr(h, y)
    torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-12)
    (gm,) = torch.autograd.grad(mine, h, allow_unused=True) if mine.requires_grad else (torch.zeros_like(h),)
    (gr,) = torch.autograd.grad(ref, h, allow_unused=True) if ref.requires_grad else (torch.zeros_like(h),)
    gm = torch.zeros_like(h) if gm is None else gm
    gr = torch.zeros_like(h) if gr is None else gr
    assert torch.isfinite(gm).all()
    torch.testing.assert_close(gm, gr, rtol=1e-8, atol=1e-10)


def test_the_hand_check_and_its_invariances():
    h = torch.tensor([[1.0, 0, 1], [2, 1, 3], [3, 2, 2], [9, 9, 9]], dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1])
    expected = (2 / 3) * (1 + 1e-8) ** -2  # not 0.5: divided by the counted samples (3), not the batch (4)
    assert manifold_reshaping_term(h, y, 2).item() == pytest.approx(expected, rel=1e-12)
    scaled = h * torch.tensor([2.0, 0.5, 7.0], dtype=torch.float64) + torch.tensor([1.0, -3.0, 0.25], dtype=torch.float64)
    assert manifold_reshaping_term(scaled, y, 2).item() == pytest.approx(expected, rel=1e-6)
    constant = h.clone()
    constant[:3, 2] = 5.0  # a feature constant within its class contributes nothing
    ref = reference_mr(constant, y)
    assert manifold_reshaping_term(constant, y, 2).item() == pytest.approx(ref.item(), rel=1e-9)


def test_the_classifier_gets_no_gradient_from_the_term():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    tap = FeatureTap(model)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 3, (32,))
    model(x)
    manifold_reshaping_term(tap.features, y, 10).backward()
    assert model[5].weight.grad is None and model[5].bias.grad is None
    assert model[1].weight.grad is not None and model[1].weight.grad.abs().sum() > 0


def test_terms_sum_to_the_loss_and_deco_weights_the_term():
    torch.manual_seed(1)
    logits, feats, y = torch.randn(16, 10), torch.randn(16, 12), torch.randint(0, 4, (16,))
    counts = torch.bincount(y, minlength=10)
    loss, terms = objective_for("fedmr", counts, {"fedmr-deco": 4.0})(logits, y, features=feats)
    assert terms["deco"].item() == pytest.approx(4.0 * manifold_reshaping_term(feats, y, 10).item(), rel=1e-6)
    assert loss.item() == pytest.approx((terms["ce"] + terms["deco"]).item(), rel=1e-6)


@pytest.mark.parametrize("method, params", [("fedmr", {"fedmr-deco": 4.0}), ("feddecorr", {})])
def test_under_mixed_precision_the_feature_term_stays_in_float32(method, params):
    """With ``amp`` the model runs under bfloat16 autocast; the loss must not (the authors
    compute their terms in float32): the model's bfloat16 outputs give the same loss as in
    float32 (autocast would put the Gram matrices' products in bfloat16: about 1e-3 off).
    CPU autocast stands in for CUDA's here: both cast matrix products to bfloat16."""
    torch.manual_seed(2)
    logits = torch.randn(64, 10).bfloat16()
    feats, y = (torch.rand(64, 200) * 3).bfloat16(), torch.randint(0, 3, (64,))
    obj = objective_for(method, torch.bincount(y, minlength=10), params)
    exact, _ = obj.loss_terms(logits.float(), y, None, feats.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, _ = obj.loss_terms(logits, y, None, feats)
    assert mixed.dtype == torch.float32
    assert mixed.item() == pytest.approx(exact.item(), rel=1e-5)


def _train(method, data_seed=3, **kw):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10)
    g = torch.Generator().manual_seed(data_seed)
    x, y = torch.randn(90, 1, 8, 8, generator=g), torch.randint(0, 4, (90,), generator=g)
    cfg = RunConfig(method=method, local_epochs=2, batch_size=16, augment=False, **kw)
    train_local(model, ClientData(x, y, 10, None, None), cfg, device=torch.device("cpu"),
                generator=torch.Generator().manual_seed(5))
    return model.state_dict()


def test_deco_zero_is_fedavg_bit_for_bit_and_deco_four_is_not():
    fedavg, zero, four = _train("fedavg"), _train("fedmr", fedmr_deco=0.0), _train("fedmr")
    assert all(torch.equal(fedavg[k], zero[k]) for k in fedavg)
    assert not all(torch.equal(fedavg[k], four[k]) for k in fedavg)
    sam = _train("fedmr", local_optimizer="sam")  # composes with the local optimizers like the others
    assert all(torch.isfinite(v).all() for v in sam.values())


def test_one_server_step_is_sample_weighted_fedavg():
    a, b = _train("fedmr"), _train("fedmr", data_seed=4)  # two sites with different data
    assert not all(torch.equal(a[k], b[k]) for k in a)  # else any weighting passes
    replies = [Reply("1", {k: v.numpy() for k, v in a.items()}, 30.0, {}),
               Reply("2", {k: v.numpy() for k, v in b.items()}, 90.0, {})]
    out = weighted_average(replies, {k: v.numpy() for k, v in a.items()})
    for k in a:
        np.testing.assert_allclose(out[k], 0.25 * a[k].numpy() + 0.75 * b[k].numpy(), rtol=1e-6, atol=1e-7)


def test_a_negative_deco_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="fedmr-deco"):
        parse_run_config({"method": "fedmr", "fedmr-deco": -1.0})


def _decorrelated_class(seed: int, noise: float) -> torch.Tensor:
    """16 samples whose 15 features are the non-constant columns of a 16 x 16 Hadamard matrix
    (mutually orthogonal once centred: G_c's off-diagonal is 0), scaled, shifted and blurred
    by ``noise``: the features FedMR's term drives towards, where its sum is tiny."""
    g = torch.Generator().manual_seed(seed)
    hadamard = torch.ones(1, 1, dtype=torch.float64)
    while hadamard.shape[0] < 16:
        hadamard = torch.cat([torch.cat([hadamard, hadamard], 1), torch.cat([hadamard, -hadamard], 1)])
    scale = torch.rand(15, generator=g, dtype=torch.float64) * 3 + 0.5
    shift = torch.randn(15, generator=g, dtype=torch.float64) * 5
    return hadamard[:, 1:] * scale + shift + noise * torch.randn(16, 15, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(6))
def test_in_float32_the_term_of_nearly_decorrelated_features_is_never_negative_and_close(seed):
    """The off-diagonal sum is taken with the diagonal masked out: as ||G||_F^2 minus the
    squared diagonal it cancels two large numbers, and in float32 came out negative."""
    y = torch.zeros(16, dtype=torch.long)
    exact = _decorrelated_class(seed, 0.0)
    assert manifold_reshaping_term(exact.float(), y, 10).item() >= 0.0
    assert manifold_reshaping_term(exact.float(), y, 10).item() < 1e-12
    blurred = torch.cat([_decorrelated_class(seed, 1e-3), _decorrelated_class(seed + 100, 1e-3)])
    labels = torch.cat([y, torch.ones(16, dtype=torch.long)])
    reference = reference_mr(blurred, labels)  # the authors' loop, float64
    single = manifold_reshaping_term(blurred.float(), labels, 10)
    assert single.item() == pytest.approx(reference.item(), rel=1e-4)
