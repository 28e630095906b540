"""AutoAugment (the CIFAR-10 policy) on a whole uint8 batch, with per-sample randomness.

``torchvision.transforms.v2.AutoAugment`` samples ONE sub-policy (and one set of
apply/sign coin flips) per call and applies it to everything it is given: called on
a batch, every image gets the same augmentation.  Per-sample randomness therefore
needs one call per image (exact, but ~N Python-level calls per batch), or calls on
small chunks (cheaper, but images of a chunk share their augmentation: correlated
samples, fewer distinct augmentations per batch).

The default here (``autoaugment="batched"``) keeps the exact per-sample semantics
without per-sample calls: each image draws its own sub-policy (uniform over the 25),
its own "apply" coin for each of the two operations (with the policy's probability)
and its own sign for signed magnitudes -- the same distribution as calling
torchvision's AutoAugment once per image.  The batch is then processed operation
slot by operation slot, grouping the images by operation *type*: all geometric ops
of a slot (shear/translate/rotate with each image's own matrix) are one
``grid_sample`` call, and each colour op (brightness, colour, contrast, sharpness,
posterize, solarize, autocontrast, equalize, invert) is one vectorised call with
per-image factors.  That is at most ~20 small groups per batch, independent of the
batch size.  The kernels reproduce torchvision's tensor kernels (nearest
interpolation, zero fill, the same inverse-affine matrices, grayscale weights,
blend/clamp/truncate to uint8, the 3x3 sharpness kernel with untouched borders,
PIL-style equalize); ``tests/test_augment.py`` checks them against
``torchvision.transforms.v2.functional`` image by image (bit-identical on CPU; on a
GPU, float rounding of the blends may differ by one intensity level on a few pixels).

On a GPU the same per-sample semantics run in fixed shapes (:meth:`BatchAutoAugment.sample_fixed`
and :meth:`BatchAutoAugment.apply_fixed`): the decisions are drawn on the batch's device from a
seeded generator there, and every operation family runs once on the whole batch, each image
keeping the result of its own operation (``torch.where``): one ``grid_sample`` for the
geometric ops, one blend for Brightness / Color / Contrast (and one for Sharpness), one
bitwise pass for Posterize / Solarize / Invert, one AutoContrast and one Equalize, per slot.
No image subset is selected, nothing is read back to the host, and the shapes never depend on
the draws: about a hundred small kernels per batch whatever the draws, and the whole
augmentation can be captured in a CUDA graph with the training step. On the same decisions
it computes what :meth:`BatchAutoAugment.apply` computes (tests/test_augment.py: bit for bit
on the CPU).

``autoaugment="torchvision"`` instead applies ``v2.AutoAugment(CIFAR10)`` itself to
consecutive chunks of ``group_size`` images (1 = per sample, exact but slow; larger
groups share one augmentation per group).  That mode draws from torch's global RNG
(torchvision's AutoAugment takes no generator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as nnf

__all__ = ["BatchAutoAugment", "CIFAR10_POLICY"]

# The AutoAugment CIFAR-10 policy (Cubuk et al. 2019, appendix table), as torchvision
# lists it: 25 sub-policies of two (operation, probability, magnitude bin) entries.
CIFAR10_POLICY: tuple[tuple[tuple[str, float, int | None], tuple[str, float, int | None]], ...] = (
    (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
    (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
    (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
    (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
    (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
    (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
    (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
    (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
    (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
    (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
    (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
    (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
    (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
    (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
    (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
    (("Color", 0.9, 9), ("Equalize", 0.6, None)),
    (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
    (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
    (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
    (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
    (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
    (("Equalize", 0.8, None), ("Invert", 0.1, None)),
    (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
)


_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


_COLOUR = (
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
)


_OPS = _GEOMETRIC + _COLOUR


_SIGNED = frozenset(_GEOMETRIC + ("Brightness", "Color", "Contrast", "Sharpness"))


_IS_GEOMETRIC = torch.tensor([op in _GEOMETRIC for op in _OPS])


_NUM_BINS = 10

#: Operation families of the fixed-shape path: every geometric op is one warp ("Rotate"
#: stands for all five), each other op its own family; "none" for a slot not applied.
_FAMILY = {**{op: 0 for op in _GEOMETRIC}, **{op: i + 1 for i, op in enumerate(_COLOUR)}, "none": len(_COLOUR) + 1}

#: Sharpness' 3x3 smoothing kernel (PIL's): 1/13 around a centre of 5/13.
_SHARP_KERNEL = torch.full((1, 1, 3, 3), 1.0 / 13.0)
_SHARP_KERNEL[0, 0, 1, 1] = 5.0 / 13.0


def _magnitude(op: str, bin_: int | None, height: int, width: int) -> float:
    """Unsigned magnitude of ``op`` at ``bin_`` (torchvision's AutoAugment space, 10 bins)."""
    if bin_ is None:
        return 0.0

    def lin(lo: float, hi: float) -> float:
        # float32 linspace, as torchvision, so the values agree to the bit.
        return float(torch.linspace(lo, hi, _NUM_BINS)[bin_])

    if op in ("ShearX", "ShearY"):
        return lin(0.0, 0.3)
    if op == "TranslateX":
        return lin(0.0, 150.0 / 331.0 * width)
    if op == "TranslateY":
        return lin(0.0, 150.0 / 331.0 * height)
    if op == "Rotate":
        return lin(0.0, 30.0)
    if op in ("Brightness", "Color", "Contrast", "Sharpness"):
        return lin(0.0, 0.9)
    if op == "Posterize":
        return float(int((8 - (torch.arange(_NUM_BINS) / ((_NUM_BINS - 1) / 4))).round().int()[bin_]))
    if op == "Solarize":
        return lin(1.0, 0.0)
    raise ValueError(f"unknown AutoAugment operation {op!r}")


def _inverse_affine(
    center: tuple[float, float], angle: float, translate: tuple[float, float], shear: tuple[float, float]
) -> list[float]:
    """Inverse of T * C * R(angle) * Shear * C^-1 (unit scale), the output->input pixel map
    used for sampling; same parametrisation (degrees, centre relative to the image centre)
    and the same floating-point evaluation order as torchvision's tensor kernels."""
    rot = math.radians(angle)
    sx = math.radians(shear[0])
    sy = math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy = math.cos(sy)
    tan_sx = math.tan(sx)
    a = math.cos(rot - sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot - sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    return m


def _theta(op: str, magnitude: float, height: int, width: int) -> list[float]:
    """Inverse affine matrix (2x3, row-major) of a signed geometric op, as AutoAugment calls
    ``F.affine``/``F.rotate`` (shears about the top-left corner, the rest about the centre)."""
    if op == "ShearX":
        return _inverse_affine((-0.5 * width, -0.5 * height), 0.0, (0.0, 0.0), (math.degrees(math.atan(magnitude)), 0.0))
    if op == "ShearY":
        return _inverse_affine((-0.5 * width, -0.5 * height), 0.0, (0.0, 0.0), (0.0, math.degrees(math.atan(magnitude))))
    if op == "TranslateX":
        return _inverse_affine((0.0, 0.0), 0.0, (float(int(magnitude)), 0.0), (0.0, 0.0))
    if op == "TranslateY":
        return _inverse_affine((0.0, 0.0), 0.0, (0.0, float(int(magnitude))), (0.0, 0.0))
    if op == "Rotate":
        return _inverse_affine((0.0, 0.0), -(magnitude % 360), (0.0, 0.0), (0.0, 0.0))
    raise ValueError(op)


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    """float32 (n, 1, H, W) luma, floored (torchvision's uint8 convention)."""
    if x.shape[-3] == 1:
        return x.to(torch.float32)
    r, g, b = x.unbind(dim=-3)
    gray = r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)
    return gray.unsqueeze(-3).floor_()


def _blend(x: torch.Tensor, other: torch.Tensor, ratio: torch.Tensor, one_minus: torch.Tensor) -> torch.Tensor:
    # addcmul: the same fused rounding as torchvision's ``add_(other, alpha=1 - ratio)``.
    out = x.to(torch.float32).mul_(ratio).addcmul_(other, one_minus)
    return out.clamp_(0, 255).to(torch.uint8)


def _brightness(x: torch.Tensor, f: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).mul_(f).clamp_(0, 255).to(torch.uint8)


def _color(x: torch.Tensor, f: torch.Tensor, one_minus: torch.Tensor) -> torch.Tensor:
    if x.shape[-3] == 1:
        return x
    return _blend(x, _grayscale(x), f, one_minus)


def _contrast(x: torch.Tensor, f: torch.Tensor, one_minus: torch.Tensor) -> torch.Tensor:
    mean = _grayscale(x).mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(x, mean, f, one_minus)


def _sharpness(x: torch.Tensor, f: torch.Tensor, one_minus: torch.Tensor) -> torch.Tensor:
    n, c, h, w = x.shape
    if h <= 2 or w <= 2:
        return x
    k = torch.full((3, 3), 1.0 / 13.0, dtype=torch.float32, device=x.device)
    k[1, 1] = 5.0 / 13.0
    out = x.to(torch.float32)
    blurred = nnf.conv2d(out, k.expand(c, 1, 3, 3), groups=c).round_()
    inner = out[..., 1:-1, 1:-1]
    inner.addcmul_(blurred.sub_(inner), one_minus)
    return out.clamp_(0, 255).to(torch.uint8)


def _posterize(x: torch.Tensor, bits: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    b = bits.to(torch.int32)
    mask = (((1 << b) - 1) << (8 - b)).clamp_(0, 255).to(torch.uint8)
    return x & mask


def _solarize(x: torch.Tensor, threshold: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= threshold, x.bitwise_not(), x)


def _autocontrast(x: torch.Tensor, _f: torch.Tensor, _o: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as TF

    return TF.autocontrast(x)


def _autocontrast_fixed(x: torch.Tensor) -> torch.Tensor:
    """torchvision's uint8 AutoContrast (per image and channel: stretch [min, max] to [0, 255];
    a flat channel stays as it is) with the same float32 operations, its flat-channel case
    written with ``torch.where`` instead of boolean indexing (no host synchronisation)."""
    f = x.to(torch.float32)
    low = f.amin(dim=(-2, -1), keepdim=True)
    high = f.amax(dim=(-2, -1), keepdim=True)
    flat = high == low
    scale = torch.where(flat, 1.0, high.sub(low).mul_(1.0 / 255))
    low = torch.where(flat, 0.0, low)
    return f.sub_(low).div_(scale).clamp_(0, 255).to(torch.uint8)


def _equalize(x: torch.Tensor, _f: torch.Tensor, _o: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as TF

    return TF.equalize(x)


def _invert(x: torch.Tensor, _f: torch.Tensor, _o: torch.Tensor) -> torch.Tensor:
    return x.bitwise_not()


_COLOUR_KERNELS = {
    "Brightness": _brightness,
    "Color": _color,
    "Contrast": _contrast,
    "Sharpness": _sharpness,
    "Posterize": _posterize,
    "Solarize": _solarize,
    "AutoContrast": _autocontrast,
    "Equalize": _equalize,
    "Invert": _invert,
}


def _base_grid(h: int, w: int, device: torch.device) -> torch.Tensor:
    """Pixel centres in torchvision's centred coordinates, with a column of ones: (1, h, w, 3)."""
    base = torch.empty(1, h, w, 3, dtype=torch.float32, device=device)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=device))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    return base


def _affine_batch(x: torch.Tensor, theta: torch.Tensor, base: torch.Tensor | None = None,
                  scale: torch.Tensor | None = None) -> torch.Tensor:
    """Nearest-neighbour, zero-fill warp of each image with its own inverse matrix
    ``theta`` (n, 2, 3) in torchvision's centred pixel coordinates (``base``, ``scale``: the
    pixel grid and the half sizes, made here when not given)."""
    n, c, h, w = x.shape
    base = _base_grid(h, w, x.device) if base is None else base
    if scale is None:
        scale = torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float32, device=x.device)
    rescaled = theta.transpose(1, 2).div(scale)  # (n, 3, 2)
    grid = base.view(1, h * w, 3).expand(n, h * w, 3).bmm(rescaled).view(n, h, w, 2)
    out = nnf.grid_sample(x.to(torch.float32), grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return out.round_().to(torch.uint8)


def _apply_colour(op: str, x: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Apply colour op ``op`` to uint8 ``x`` with per-image values (the factor ``1 + m``
    for blends, the bit count for Posterize, the 0..255 threshold for Solarize)."""
    v = value.to(torch.float64).view(-1, 1, 1, 1)  # CPU; 1 - v in double, as torchvision
    f = v.to(torch.float32).to(x.device, non_blocking=True)
    one_minus = (1.0 - v).to(torch.float32).to(x.device, non_blocking=True)
    return _COLOUR_KERNELS[op](x, f, one_minus)


class BatchAutoAugment:
    """AutoAugment with an independent draw per image, on uint8 batches (any device).

    Same distribution as ``torchvision.transforms.v2.AutoAugment(policy)`` called once
    per image (nearest interpolation, zero fill); see the module docstring.
    """

    def __init__(self, policy: Sequence[Sequence[tuple[str, float, int | None]]] = CIFAR10_POLICY) -> None:
        self.policy = tuple(policy)
        for sub in self.policy:
            for op, _p, _b in sub:
                if op not in _OPS:
                    raise ValueError(f"unknown AutoAugment operation {op!r}")
        entries = [e for sub in self.policy for e in sub]  # entry 2*k + slot
        self._op = torch.tensor([_OPS.index(op) for op, _, _ in entries])
        self._prob = torch.tensor([p for _, p, _ in entries], dtype=torch.float64)
        self._signed = torch.tensor([op in _SIGNED for op, _, _ in entries])
        self._tables: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._fixed: dict[tuple[int, int, str], dict[str, torch.Tensor]] = {}

    def _tables_for(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(values (E, 2) float64, thetas (E, 2, 2, 3) float32) for sign index 0=+, 1=-."""
        key = (height, width)
        if key not in self._tables:
            entries = [e for sub in self.policy for e in sub]
            values = torch.zeros(len(entries), 2, dtype=torch.float64)
            thetas = torch.zeros(len(entries), 2, 2, 3, dtype=torch.float32)
            thetas[..., 0, 0] = 1.0
            thetas[..., 1, 1] = 1.0
            for i, (op, _p, bin_) in enumerate(entries):
                m = _magnitude(op, bin_, height, width)
                for s, sign in enumerate((1.0, -1.0)):
                    ms = m * sign if op in _SIGNED else m
                    if op in _GEOMETRIC:
                        thetas[i, s] = torch.tensor(_theta(op, ms, height, width), dtype=torch.float32).view(2, 3)
                    elif op in ("Brightness", "Color", "Contrast", "Sharpness"):
                        values[i, s] = 1.0 + ms
                    elif op == "Solarize":
                        values[i, s] = 255.0 * ms
                    else:  # Posterize bits; unused for AutoContrast/Equalize/Invert
                        values[i, s] = ms
            self._tables[key] = (values, thetas)
        return self._tables[key]

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-image decisions: sub-policy index (n,), applied (n, 2) and negative (n, 2)."""
        sub = torch.randint(len(self.policy), (n,), generator=generator)
        coins = torch.rand(n, 2, generator=generator, dtype=torch.float64)
        signs = torch.rand(n, 2, generator=generator, dtype=torch.float64)
        entry = sub.unsqueeze(1) * 2 + torch.arange(2)
        applied = coins <= self._prob[entry]
        negative = self._signed[entry] & (signs <= 0.5)
        return sub, applied, negative

    def _fixed_tables(self, height: int, width: int, device: torch.device) -> dict[str, torch.Tensor]:
        """The per-entry tables of :meth:`apply_fixed`, on ``device`` (cached): operation code,
        probability, signedness, each entry's (factor, 1 - factor) pair computed in float64 and
        rounded to float32 as :func:`_apply_colour` does, posterize masks, solarize thresholds
        and inverse-affine matrices, per sign."""
        key = (height, width, str(device))
        if key not in self._fixed:
            values, thetas = self._tables_for(height, width)
            op = self._op
            names = [_OPS[int(i)] for i in op]
            factor = torch.ones(len(names), 2, dtype=torch.float32)
            keep = torch.zeros(len(names), 2, dtype=torch.float32)
            mask = torch.full((len(names), 2), 255, dtype=torch.int32)
            threshold = torch.full((len(names), 2), 256.0, dtype=torch.float32)
            for i, name in enumerate(names):
                if name in ("Brightness", "Color", "Contrast", "Sharpness"):
                    factor[i] = values[i].to(torch.float32)
                    keep[i] = (1.0 - values[i]).to(torch.float32)
                elif name == "Posterize":
                    bits = values[i].to(torch.int32)
                    mask[i] = (((1 << bits) - 1) << (8 - bits)).clamp(0, 255)
                elif name == "Solarize":
                    threshold[i] = values[i].to(torch.float32)
                elif name == "Invert":
                    threshold[i] = 0.0
            family = torch.tensor([_FAMILY[n] for n in names])
            inner = torch.zeros(1, 1, height, width, dtype=torch.bool)
            inner[..., 1:-1, 1:-1] = True
            self._fixed[key] = {name: t.to(device) for name, t in {
                "family": family, "prob": self._prob.to(torch.float32), "signed": self._signed,
                "factor": factor, "keep": keep, "mask": mask.to(torch.uint8), "threshold": threshold,
                "theta": thetas, "slot": torch.arange(2), "grid": _base_grid(height, width, torch.device("cpu")),
                "scale": torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32), "inner": inner,
                "kernel": _SHARP_KERNEL, "zero": torch.zeros(()),
                "mask_none": torch.tensor(255, dtype=torch.uint8), "threshold_none": torch.tensor(256.0)}.items()}
        return self._fixed[key]

    def sample_fixed(self, n: int, generator: torch.Generator, device: torch.device | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`sample`'s decisions drawn on ``device`` (the generator's by default) from
        ``generator``, in fixed shapes: sub-policy (n,), applied (n, 2), negative (n, 2). The
        same distribution as :meth:`sample` (uniform sub-policy, each slot applied with its
        probability, a signed magnitude negated with probability 1/2)."""
        device = generator.device if device is None else device
        tables = self._fixed_tables(1, 1, device)
        sub = torch.randint(len(self.policy), (n,), generator=generator, device=device)
        coins = torch.rand(n, 2, generator=generator, device=device)
        signs = torch.rand(n, 2, generator=generator, device=device)
        entry = sub.unsqueeze(1) * 2 + tables["slot"]
        return sub, coins <= tables["prob"][entry], tables["signed"][entry] & (signs <= 0.5)

    def apply_fixed(self, x: torch.Tensor, sub: torch.Tensor, applied: torch.Tensor,
                    negative: torch.Tensor) -> torch.Tensor:
        """:meth:`apply` in fixed shapes, without a host synchronisation: the decisions are
        tensors on ``x``'s device, every operation family runs on the whole batch and each image
        keeps its own operation's result. On the same decisions the same images as :meth:`apply`."""
        n, c, h, w = x.shape
        t = self._fixed_tables(h, w, x.device)
        for slot in range(2):
            entry = sub * 2 + slot
            sign = negative[:, slot].long()
            family = torch.where(applied[:, slot], t["family"][entry], _FAMILY["none"]).view(n, 1, 1, 1)
            # geometric: each image warped with its own matrix (identity for the others, unused)
            warped = _affine_batch(x, t["theta"][entry, sign], t["grid"], t["scale"])
            x = torch.where(family == _FAMILY["Rotate"], warped, x)
            # Brightness, Color, Contrast: x * f + other * (1 - f), other = 0, the grey image or its mean
            f = t["factor"][entry, sign].view(n, 1, 1, 1)
            keep = t["keep"][entry, sign].view(n, 1, 1, 1)
            gray = _grayscale(x)
            other = torch.where(family == _FAMILY["Color"], gray,
                                torch.where(family == _FAMILY["Contrast"], gray.mean(dim=(-3, -2, -1), keepdim=True),
                                            t["zero"]))
            blended = x.to(torch.float32).mul_(f).addcmul_(other, keep).clamp_(0, 255).to(torch.uint8)
            blends = (family == _FAMILY["Brightness"]) | (family == _FAMILY["Contrast"])
            if c > 1:  # Color on a grey image is the identity (as torchvision's)
                blends = blends | (family == _FAMILY["Color"])
            x = torch.where(blends, blended, x)
            # Sharpness: the inner pixels move towards the rounded 3x3 blur, the border stays
            if h > 2 and w > 2:
                sharp = x.to(torch.float32)
                blurred = nnf.pad(nnf.conv2d(sharp, t["kernel"].expand(c, 1, 3, 3), groups=c).round_(), (1, 1, 1, 1))
                sharp = sharp.addcmul_(blurred.sub_(sharp), keep).clamp_(0, 255).to(torch.uint8)
                x = torch.where((family == _FAMILY["Sharpness"]) & t["inner"], sharp, x)
            # Posterize (mask 255 elsewhere), then Solarize / Invert (threshold 256 elsewhere, 0 for Invert)
            on = applied[:, slot].view(n, 1, 1, 1)
            bits = x & torch.where(on, t["mask"][entry, sign].view(n, 1, 1, 1), t["mask_none"])
            x = torch.where(bits >= torch.where(on, t["threshold"][entry, sign].view(n, 1, 1, 1), t["threshold_none"]),
                            bits.bitwise_not(), bits)
            x = torch.where(family == _FAMILY["AutoContrast"], _autocontrast_fixed(x), x)
            x = torch.where(family == _FAMILY["Equalize"], _equalize(x, f, keep), x)
        return x

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.ndim != 4:
            raise TypeError(f"expected a uint8 (N, C, H, W) batch, got {x.dtype} {tuple(x.shape)}")
        sub, applied, negative = self.sample(x.shape[0], generator)
        return self.apply(x, sub, applied, negative)

    def apply(self, x: torch.Tensor, sub: torch.Tensor, applied: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        """Apply given per-image decisions (CPU tensors from :meth:`sample`)."""
        values, thetas = self._tables_for(x.shape[-2], x.shape[-1])
        x = x.clone()
        device = x.device
        for slot in range(2):
            entry = sub * 2 + slot
            op = self._op[entry]
            sign = negative[:, slot].long()
            on = applied[:, slot]
            sel = (on & _IS_GEOMETRIC[op]).nonzero().squeeze(1)
            if sel.numel():
                theta = thetas[entry[sel], sign[sel]].to(device, non_blocking=True)
                idx = sel.to(device, non_blocking=True)
                x[idx] = _affine_batch(x[idx], theta)
            for name in _COLOUR:
                sel = (on & (op == _OPS.index(name))).nonzero().squeeze(1)
                if sel.numel():
                    idx = sel.to(device, non_blocking=True)
                    x[idx] = _apply_colour(name, x[idx], values[entry[sel], sign[sel]])
        return x
