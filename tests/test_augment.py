"""Batched CIFAR augmentation: normalisation, crop/flip, per-sample AutoAugment."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from fedvls_flwr.data import autoaugment as A
from fedvls_flwr.data.augment import BatchTransform, make_batch_transform, random_crop_flip, random_crop_flip_fixed
from fedvls_flwr.data.autoaugment import CIFAR10_POLICY, BatchAutoAugment

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def _batch(n=16, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    # Half the images low-contrast, so autocontrast/equalize/solarize have work to do.
    x[n // 2 :] = x[n // 2 :] // 4 + 60
    return x


def _plain_normalise(x):
    # ToTensor + Normalize, as torchvision v1 computes them.
    from torchvision import transforms as T

    return T.Normalize(MEAN, STD)(x.to(torch.float32).div(255))


# ----------------------------------------------------------------------------- interface


@pytest.mark.parametrize("size", [32, 64])
def test_output_shape_dtype_and_range(size):
    x = _batch(8, size)
    out = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(1))(x)
    assert out.shape == x.shape
    assert out.dtype == torch.float32
    assert out.device == x.device
    lo = (0 - torch.tensor(MEAN)) / torch.tensor(STD)
    hi = (1 - torch.tensor(MEAN)) / torch.tensor(STD)
    per_channel = out.transpose(0, 1).reshape(3, -1)
    assert (per_channel.min(1).values >= lo - 1e-5).all()
    assert (per_channel.max(1).values <= hi + 1e-5).all()


@pytest.mark.parametrize("train,augment", [(True, False), (False, True), (False, False)])
def test_without_augmentation_is_plain_normalisation(train, augment):
    x = _batch(8)
    out = make_batch_transform(MEAN, STD, train=train, augment=augment)(x)
    assert torch.equal(out, _plain_normalise(x))


def test_float_input_taken_as_unit_range():
    x = _batch(4)
    out = make_batch_transform(MEAN, STD, train=False, augment=False)(x.float() / 255)
    torch.testing.assert_close(out, _plain_normalise(x))
    aug = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(0))
    assert aug(x.float() / 255).dtype == torch.float32


def test_identity_when_mean_is_none():
    x = torch.randn(4, 1, 28, 28)
    for train, augment in [(True, True), (False, False)]:
        t = make_batch_transform(None, None, train=train, augment=augment)
        assert isinstance(t, BatchTransform)
        assert t(x) is x


def test_mean_std_must_match():
    with pytest.raises(ValueError):
        make_batch_transform(MEAN, None, train=True, augment=True)
    with pytest.raises(ValueError):
        make_batch_transform(MEAN, STD[:2], train=True, augment=True)
    with pytest.raises(ValueError):
        make_batch_transform(MEAN, STD, train=True, augment=True, autoaugment="randaugment")


def test_input_not_modified():
    x = _batch(16)
    before = x.clone()
    make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(0))(x)
    assert torch.equal(x, before)


def test_seeded_generator_is_deterministic():
    x = _batch(16)

    def run(seed):
        t = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(seed))
        return t(x), t(x)

    a1, a2 = run(3)
    b1, b2 = run(3)
    c1, _ = run(4)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)  # the generator advances between calls
    assert not torch.equal(a1, c1)


def test_torchvision_chunk_mode_runs():
    x = _batch(10)
    t = make_batch_transform(MEAN, STD, train=True, augment=True, autoaugment="torchvision", group_size=4)
    out = t(x)
    assert out.shape == x.shape and out.dtype == torch.float32


def test_reference_pipeline_runs_on_pil():
    from PIL import Image

    from bench.reference_transform import per_sample_reference_transform

    img = Image.fromarray(_batch(1)[0].permute(1, 2, 0).numpy())
    out = per_sample_reference_transform(MEAN, STD)(img)
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32


# ----------------------------------------------------------------------------- crop + flip


def _find_crop(out, padded, size):
    for oy in range(9):
        for ox in range(9):
            crop = padded[:, oy : oy + size, ox : ox + size]
            if torch.equal(out, crop):
                return oy, ox, False
            if torch.equal(out, crop.flip(-1)):
                return oy, ox, True
    return None


def test_crop_and_flip_vary_per_sample_and_are_valid_crops():
    img = _batch(1, seed=5)[0]
    x = img.expand(64, -1, -1, -1).contiguous()
    out = random_crop_flip(x, padding=4, generator=torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(img, (4, 4, 4, 4))
    found = [_find_crop(o, padded, 32) for o in out]
    assert all(f is not None for f in found)
    assert len({f[:2] for f in found}) > 20  # offsets differ from image to image
    flips = [f[2] for f in found]
    assert 0 < sum(flips) < len(flips)
    assert {f[0] for f in found} <= set(range(9)) and {f[1] for f in found} <= set(range(9))


def test_full_transform_varies_per_sample():
    img = _batch(1, seed=6)[0]
    x = img.expand(32, -1, -1, -1).contiguous()
    out = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(0))(x)
    distinct = {tuple(o.flatten()[::97].tolist()) for o in out}
    assert len(distinct) > 25


# ----------------------------------------------------------------------------- AutoAugment


def test_policy_table_matches_torchvision():
    tv = v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    policies = getattr(tv, "_policies", None)
    if policies is None:
        pytest.skip("torchvision keeps its policy table elsewhere")
    assert [tuple(map(tuple, p)) for p in policies] == [tuple(map(tuple, p)) for p in CIFAR10_POLICY]


def test_sampled_decisions_follow_the_policy():
    aa = BatchAutoAugment()
    n = 40_000
    sub, applied, negative = aa.sample(n, torch.Generator().manual_seed(0))
    freq = torch.bincount(sub, minlength=25).double() / n
    assert (freq - 1 / 25).abs().max() < 0.01
    for k, policy in enumerate(CIFAR10_POLICY):
        rows = sub == k
        for slot, (op, prob, _) in enumerate(policy):
            rate = applied[rows, slot].double().mean().item()
            assert abs(rate - prob) < 0.05, (k, slot, op, rate, prob)
            neg = negative[rows, slot].double().mean().item()
            if op in A._SIGNED:
                assert abs(neg - 0.5) < 0.05
            else:
                assert neg == 0.0


def _tv_op(op, m, img):
    """What torchvision's AutoAugment does for (op, signed magnitude m)."""
    nearest = TF.InterpolationMode.NEAREST
    if op == "ShearX":
        return TF.affine(img, 0.0, [0, 0], 1.0, [math.degrees(math.atan(m)), 0.0], nearest, None, [0, 0])
    if op == "ShearY":
        return TF.affine(img, 0.0, [0, 0], 1.0, [0.0, math.degrees(math.atan(m))], nearest, None, [0, 0])
    if op == "TranslateX":
        return TF.affine(img, 0.0, [int(m), 0], 1.0, [0.0, 0.0], nearest, None)
    if op == "TranslateY":
        return TF.affine(img, 0.0, [0, int(m)], 1.0, [0.0, 0.0], nearest, None)
    if op == "Rotate":
        return TF.rotate(img, m, nearest, fill=None)
    if op == "Brightness":
        return TF.adjust_brightness(img, 1.0 + m)
    if op == "Color":
        return TF.adjust_saturation(img, 1.0 + m)
    if op == "Contrast":
        return TF.adjust_contrast(img, 1.0 + m)
    if op == "Sharpness":
        return TF.adjust_sharpness(img, 1.0 + m)
    if op == "Posterize":
        return TF.posterize(img, int(m))
    if op == "Solarize":
        return TF.solarize(img, 255.0 * m)
    if op == "AutoContrast":
        return TF.autocontrast(img)
    if op == "Equalize":
        return TF.equalize(img)
    if op == "Invert":
        return TF.invert(img)
    raise AssertionError(op)


@pytest.mark.parametrize("size", [32, 64])
def test_every_policy_entry_matches_torchvision_per_image(size):
    x = _batch(6, size)
    n = x.shape[0]
    aa = BatchAutoAugment()
    entries = [e for sub in CIFAR10_POLICY for e in sub]
    for i, (op, _prob, bin_) in enumerate(entries):
        for neg in (False, True):
            if neg and op not in A._SIGNED:
                continue
            sub = torch.full((n,), i // 2)
            applied = torch.zeros(n, 2, dtype=torch.bool)
            applied[:, i % 2] = True
            negative = torch.zeros(n, 2, dtype=torch.bool)
            negative[:, i % 2] = neg
            out = aa.apply(x, sub, applied, negative)
            m = A._magnitude(op, bin_, size, size) * (-1 if neg else 1)
            ref = torch.stack([_tv_op(op, m, img) for img in x])
            assert torch.equal(out, ref), (op, bin_, neg)


def test_two_slots_compose_in_order():
    # Sub-policy 5: ShearY then Posterize, both applied, negative shear.
    x = _batch(4)
    n = x.shape[0]
    aa = BatchAutoAugment()
    sub = torch.full((n,), 5)
    out = aa.apply(x, sub, torch.ones(n, 2, dtype=torch.bool), torch.tensor([[True, False]] * n))
    m_shear = -A._magnitude("ShearY", 7, 32, 32)
    bits = A._magnitude("Posterize", 7, 32, 32)
    ref = torch.stack([_tv_op("Posterize", bits, _tv_op("ShearY", m_shear, img)) for img in x])
    assert torch.equal(out, ref)


def test_unapplied_images_are_untouched_and_mixed_batches_work():
    x = _batch(40)
    aa = BatchAutoAugment()
    sub, applied, negative = aa.sample(40, torch.Generator().manual_seed(2))
    out = aa.apply(x, sub, applied, negative)
    untouched = ~applied.any(dim=1)
    assert untouched.any()
    assert torch.equal(out[untouched], x[untouched])
    for k in range(40):  # every image gets exactly its own two-step chain
        img = x[k]
        for slot, (op, _p, bin_) in enumerate(CIFAR10_POLICY[int(sub[k])]):
            if applied[k, slot]:
                m = A._magnitude(op, bin_, 32, 32) * (-1 if negative[k, slot] else 1)
                img = _tv_op(op, m, img)
        assert torch.equal(out[k], img), k


# ----------------------------------------------------------------------------- fixed shapes (the GPU path)


def test_fixed_shapes_compute_what_the_grouped_path_computes():
    """On the same decisions, apply_fixed (every family on the whole batch, torch.where per
    image) gives apply's images bit for bit: random batches, a flat channel (AutoContrast's
    special case), grey images (Color is the identity) and every policy entry forced on."""
    aa = BatchAutoAugment()
    x = _batch(48)
    x[3, 1] = 77  # one flat channel
    for seed in range(8):
        decisions = aa.sample(48, torch.Generator().manual_seed(seed))
        assert torch.equal(aa.apply_fixed(x, *decisions), aa.apply(x, *decisions)), seed
        grey = x[:, :1].contiguous()
        assert torch.equal(aa.apply_fixed(grey, *decisions), aa.apply(grey, *decisions)), seed
    n = 6
    for i in range(2 * len(CIFAR10_POLICY)):
        for neg in (False, True):
            sub = torch.full((n,), i // 2)
            applied = torch.zeros(n, 2, dtype=torch.bool)
            applied[:, i % 2] = True
            negative = torch.zeros(n, 2, dtype=torch.bool)
            negative[:, i % 2] = neg
            assert torch.equal(aa.apply_fixed(x[:n], sub, applied, negative), aa.apply(x[:n], sub, applied, negative))


def test_fixed_shape_draws_follow_the_policy():
    """sample_fixed (drawn where its generator lives) has sample's distribution."""
    aa = BatchAutoAugment()
    n = 40_000
    sub, applied, negative = aa.sample_fixed(n, torch.Generator().manual_seed(0))
    assert sub.shape == (n,) and applied.shape == negative.shape == (n, 2)
    freq = torch.bincount(sub, minlength=25).double() / n
    assert (freq - 1 / 25).abs().max() < 0.01
    for k, policy in enumerate(CIFAR10_POLICY):
        rows = sub == k
        for slot, (op, prob, _) in enumerate(policy):
            assert abs(applied[rows, slot].double().mean().item() - prob) < 0.05, (k, slot)
            neg = negative[rows, slot].double().mean().item()
            assert abs(neg - 0.5) < 0.05 if op in A._SIGNED else neg == 0.0


def test_fixed_shape_crop_and_flip_are_valid_per_sample_crops():
    img = _batch(1, seed=5)[0]
    x = img.expand(64, -1, -1, -1).contiguous()
    out = random_crop_flip_fixed(x, 4, True, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(img, (4, 4, 4, 4))
    found = [_find_crop(o, padded, 32) for o in out]
    assert all(f is not None for f in found)
    assert len({f[:2] for f in found}) > 20
    assert 0 < sum(f[2] for f in found) < len(found)
    again = random_crop_flip_fixed(x, 4, True, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)


def assert_same_augmentation(levels: torch.Tensor) -> None:
    """``levels``: |GPU - CPU| of one augmented batch, in intensity levels (N, C, H, W). The two
    compute the same augmentation when few pixels differ at all and no image differs in more
    than a few pixels by more than a level. A one-level difference (a blend rounded otherwise:
    CUDA's fused multiply-adds need not match the CPU's) can grow in the second AutoAugment
    operation - Equalize and AutoContrast stretch it, Solarize and Posterize cross a threshold -
    to tens of levels at a few pixels (a one-ulp change of the blend moved at most 0.2% of the
    pixels of a batch, by up to 72 levels, measured on the CPU); a wrong operation or parameter
    changes most pixels of the images it touches."""
    per_image_far = (levels > 1 + 1e-3).flatten(1).float().mean(1)
    assert (levels > 1e-3).float().mean() < 0.02, "more than 2% of the pixels differ"
    assert per_image_far.max() < 0.1, f"image {int(per_image_far.argmax())} differs by more than a level in " \
                                      f"{float(per_image_far.max()):.1%} of its pixels"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_generator_draws_on_the_gpu_and_repeats_with_its_seed():
    x = _batch(64).cuda()

    def run(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        t = make_batch_transform(MEAN, STD, train=True, augment=True, generator=g)
        assert t.on_device
        return t(x), t(x)

    (a1, a2), (b1, b2), (c1, _) = run(3), run(3), run(4)
    assert torch.equal(a1, b1) and torch.equal(a2, b2) and not torch.equal(a1, a2) and not torch.equal(a1, c1)
    # on the same decisions the GPU's fixed-shape kernels agree with the CPU's grouped ones
    aa = BatchAutoAugment()
    decisions = aa.sample(64, torch.Generator().manual_seed(1))
    gpu = aa.apply_fixed(x, *(d.cuda() for d in decisions)).cpu()
    cpu = aa.apply(x.cpu(), *decisions)
    assert_same_augmentation((gpu.int() - cpu.int()).abs().float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_decisions():
    x = _batch(64)
    cpu = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(0))(x)
    gpu = make_batch_transform(MEAN, STD, train=True, augment=True, generator=torch.Generator().manual_seed(0))(
        x.cuda()
    )
    assert gpu.device.type == "cuda"
    assert_same_augmentation((gpu.cpu() - cpu).abs() * torch.tensor(STD).view(1, 3, 1, 1) * 255)
