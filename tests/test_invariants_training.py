"""Invariants of evaluation and local training that need no Flower run.

Evaluation: for every dataset stored as raw uint8 images (CIFAR-10/100, TinyImageNet), evaluating
the raw images with the dataset's mean/std equals evaluating the same images normalised by hand
here (and a plain forward pass of the model in eval mode), at any batch size; two evaluations of
one model agree exactly.

Local training (the client's train_round, on a node's own uint8 images): the batch order and the
augmentation draws come from (seed, round, partition) - the same three give the same weights bit
for bit whatever else drew random numbers before (a resumed round trains as the first did), and
changing any one of them changes the training; with the whole set in one batch (batch order
irrelevant), the augmentation alone still changes with the round."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from PIL import Image
from torch import nn

from fedvls_flwr.algorithms.run_model import build_run_model
from fedvls_flwr.algorithms.training import evaluate
from fedvls_flwr.app import keys
from fedvls_flwr.app.client import train_round
from fedvls_flwr.config.run_config import IMAGE_DATASETS, parse_run_config
from fedvls_flwr.data.datasets import image_format
from fedvls_flwr.models import build_model

CPU = torch.device("cpu")
RAW_UINT8 = [name for name in IMAGE_DATASETS if name != "digits" and not image_format(name).normalised]


def test_the_raw_image_datasets_are_the_rgb_ones():
    assert set(RAW_UINT8) == {"cifar10", "cifar100", "tinyimagenet"}


def images(name: str, n: int = 37, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    fmt = image_format(name)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, *fmt.shape), dtype=torch.uint8, generator=g)
    y = torch.randint(0, fmt.num_classes, (n,), generator=g)
    return x, y


def normalised_by_hand(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """pixel / 255, then (value - mean) / std per channel, in float32."""
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (x.to(torch.float32) / 255 - m) / s


def same(a: float, b: float, rel: float = 0.0) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def small_batchnorm_cnn(shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A model that computes differently in train mode (the BatchNorm models are large)."""
    return nn.Sequential(nn.Conv2d(shape[0], 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, num_classes))


def make(model_name: str, shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    if model_name == "batchnorm":
        return small_batchnorm_cnn(shape, num_classes)
    return build_model(model_name, shape, num_classes)


# every raw-image format with the small CNN, and one BatchNorm model (whose eval mode matters)
@pytest.mark.parametrize("name, model_name", [*((n, "cnn") for n in RAW_UINT8), ("cifar10", "batchnorm")])
def test_evaluating_raw_images_equals_evaluating_them_normalised_by_hand(name, model_name):
    fmt = image_format(name)
    x, y = images(name)
    torch.manual_seed(1)
    model = make(model_name, fmt.shape, fmt.num_classes)
    model.train()  # as left by training: evaluation must switch to eval mode itself
    if model_name == "batchnorm":  # running statistics unlike any batch's
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.fill_(0.3)
                m.running_var.fill_(2.0)
    by_hand = normalised_by_hand(x, fmt.mean, fmt.std)

    # a plain forward pass in eval mode, scored here
    reference = make(model_name, fmt.shape, fmt.num_classes)
    reference.load_state_dict(model.state_dict())
    reference.eval()
    with torch.no_grad():
        logits = reference(by_hand)
    predicted = logits.argmax(dim=1)
    accuracy = int((predicted == y).sum()) / len(y)
    loss = float(F.cross_entropy(logits, y, reduction="none").double().sum()) / len(y)
    per_class = [float("nan") if not (y == c).any() else float((predicted[y == c] == c).float().mean())
                 for c in range(fmt.num_classes)]

    raw = [evaluate(model, x, y, fmt.num_classes, device=CPU, batch_size=b, mean=fmt.mean, std=fmt.std)
           for b in (8, 1024)]
    normalised = evaluate(model, by_hand, y, fmt.num_classes, device=CPU, batch_size=8)
    again = evaluate(model, x, y, fmt.num_classes, device=CPU, batch_size=8, mean=fmt.mean, std=fmt.std)
    for res in (*raw, normalised):
        assert res.num_examples == len(y)
        assert res.accuracy == accuracy
        assert math.isclose(res.loss, loss, rel_tol=1e-5)
        assert all(same(a, b, 1e-6) for a, b in zip(res.per_class_accuracy, per_class))
    assert raw[0].accuracy == normalised.accuracy and math.isclose(raw[0].loss, normalised.loss, rel_tol=1e-6)
    # the same evaluation twice: exactly the same numbers
    assert (again.accuracy, again.loss, again.num_examples) == (raw[0].accuracy, raw[0].loss, raw[0].num_examples)
    assert all(same(a, b) for a, b in zip(again.per_class_accuracy, raw[0].per_class_accuracy))


# ------------------------------------------------------------------------------- local training
CIFAR10_CLASSES = "airplane,automobile,bird,cat,deer,dog,frog,horse,ship,truck"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A node's own images: 12 RGB 32x32 PNGs of 4 CIFAR-10 classes."""
    root = tmp_path_factory.mktemp("site")
    rng = np.random.default_rng(0)
    for k in range(12):
        folder = root / CIFAR10_CLASSES.split(",")[k % 4]
        folder.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    return root


RUN = {"dataset": "cifar10", "model": "cnn", "method": "fedavg", "local-epochs": 2, "batch-size": 4, "lr": 0.05,
       "momentum": 0.0, "weight-decay": 0.0, "augment": True, "device": "cpu"}


@pytest.fixture(scope="module")
def initial() -> dict[str, torch.Tensor]:
    """The global model every call starts from (drawn once: train() itself reseeds nothing)."""
    g = torch.random.get_rng_state()
    torch.manual_seed(0)
    model = build_run_model(parse_run_config(RUN), (3, 32, 32), 10)
    torch.random.set_rng_state(g)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture()
def train(site: Path, initial: dict[str, torch.Tensor]):
    return lambda **kw: train_once(site, initial, **kw)


def train_once(site: Path, initial: dict[str, torch.Tensor], *, seed: int, server_round: int, partition: int,
               **changes: object) -> dict[str, np.ndarray]:
    """train_round's weights for one node's images, from the same initial model every time."""
    cfg = parse_run_config({**RUN, "seed": seed, **changes})
    content = RecordDict({
        keys.ARRAYS: ArrayRecord(initial),
        keys.CONFIG: ConfigRecord({**cfg.to_flower(), keys.SERVER_ROUND: server_round}),
    })
    node = {"dataset": "folder", "data-dir": str(site), "classes": CIFAR10_CLASSES, "partition-id": partition,
            "cache-dir": "none"}
    reply = train_round(content, node)
    return {k: v.numpy() for k, v in reply.array_records[keys.ARRAYS].items()}


def largest_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def test_the_same_seed_round_and_partition_train_the_same_weights_whatever_drew_before(train):
    torch.manual_seed(7)
    first = train(seed=1, server_round=3, partition=0)
    torch.manual_seed(12345)  # other random draws in between (another client, a resumed process)
    np.random.seed(54321)
    torch.rand(100)
    again = train(seed=1, server_round=3, partition=0)
    assert largest_difference(first, again) == 0.0


@pytest.mark.parametrize("other", [{"server_round": 4}, {"seed": 2}, {"partition": 1}],
                         ids=["next round", "other seed", "other partition"])
def test_another_round_seed_or_partition_trains_differently(train, other):
    base = {"seed": 1, "server_round": 3, "partition": 0}
    # the same images in both calls: a node-local folder does not depend on the seed or the id
    assert largest_difference(train(**base), train(**{**base, **other})) > 1e-4


def test_the_augmentation_alone_changes_from_round_to_round(train):
    # the whole set in one batch, one epoch: the batch order only reorders a sum
    one_batch = {"batch-size": 12, "local-epochs": 1}
    plain = [train(seed=1, server_round=r, partition=0, augment=False, **one_batch) for r in (3, 4)]
    assert largest_difference(*plain) < 1e-6
    augmented = [train(seed=1, server_round=r, partition=0, augment=True, **one_batch) for r in (3, 4)]
    assert largest_difference(*augmented) > 1e-4
