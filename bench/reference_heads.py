"""The plain loop of ``bench/reference_loop.py`` with FedConcat's frozen features computed once.

In FedConcat's second stage the K encoders are frozen, so a loop written for speed computes
their features of every client's training data (no augmentation: the MNIST setting) and of
the test set once, when stage 2 begins, and each head round then trains and evaluates the
linear head on those features alone. This is that loop: ``bench/reference_loop.py`` with its
FedConcat protocol's head rounds and its evaluation of the concatenated model taken from the
kept features (everything else, stage 1 included, is that loop's). Its accuracies equal the
recomputing loop's where the encoders compute a row independently of the batch it is in (the
MLP); ``bench/bench_engine.py`` times the app's head round against it.

    python bench/reference_heads.py --dataset mnist10k --clients 10 --rounds 32 --method fedavg \\
        --protocol fedconcat --fedconcat-encoder-rounds 2 --fedconcat-assignment 0,1,0,1,0,1,0,1,0,1

Takes every option of ``bench/reference_loop.py`` and prints the same JSON.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import bench.reference_loop as loop  # noqa: E402
from bench.reference_parts import concatenated_features  # noqa: E402
from fedvls_flwr.data.datasets import load_dataset  # noqa: E402


class OnKeptFeatures(nn.Module):
    """The concatenated model for the evaluation: the head over the test set's kept features."""

    def __init__(self, head: dict[str, torch.Tensor], features: torch.Tensor) -> None:
        super().__init__()
        self.head = nn.Linear(head["weight"].shape[1], head["weight"].shape[0])
        self.head.load_state_dict(head)
        self.features = features


class KeptFeaturesLoop(loop.FedConcatLoop):
    """FedConcat with the frozen encoders' features of each client and of the test set computed
    once, when stage 2 begins (in ``eval-batch-size`` chunks)."""

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        step = self.cfg.eval_batch_size
        with torch.no_grad():
            return torch.cat([concatenated_features(self.encoders, x[i:i + step]) for i in range(0, x.shape[0], step)])

    def round(self, r: int, sampled: list[int], model: nn.Module, device: torch.device):
        if self.stage(r) == 1:
            return super().round(r, sampled, model, device)
        cfg = self.cfg
        if not hasattr(self, "kept"):
            self.kept = [self._features(c.x) for c in self.clients]
            bundle = load_dataset(cfg.dataset, cfg.run.resolved_data_dir(), download=cfg.download,
                                  pool_size=cfg.train_pool_size)  # the loop's test set (loaded once per process)
            self.test_features = self._features(bundle.test_x.to(device))
        seconds, heads = [], []
        for i in sampled:
            t_client = time.perf_counter()
            gen = torch.Generator().manual_seed(loop.batch_seed(cfg.seed, r, i))
            heads.append(self._train_head(self.kept[i], self.clients[i].y, gen))
            seconds.append(time.perf_counter() - t_client)
        t_agg = time.perf_counter()
        self.head = {k: torch.stack([h[k].double() for h in heads]).mean(dim=0).to(self.head[k].dtype)
                     for k in self.head}
        return seconds, t_agg, OnKeptFeatures(self.head, self.test_features)

    def _train_head(self, features: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``fedconcat-head-steps`` mini-batches of one shuffled pass, plain CE, a fresh SGD."""
        cfg = self.cfg
        linear = nn.Linear(self.head["weight"].shape[1], self.head["weight"].shape[0])
        linear.load_state_dict(self.head)
        optimizer = torch.optim.SGD(linear.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        n = len(y)
        order = torch.randperm(n, generator=generator)
        for s in range(min(self.head_steps, math.ceil(n / cfg.batch_size))):
            idx = order[s * cfg.batch_size:(s + 1) * cfg.batch_size].to(features.device)
            loss = F.cross_entropy(linear(features[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return {k: v.detach().clone() for k, v in linear.state_dict().items()}


_evaluate = loop.evaluate


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, float]:
    """The loop's evaluation; for the head over kept features, from those features."""
    if not isinstance(model, OnKeptFeatures):
        return _evaluate(model, x, y, batch_size)
    correct, loss = 0, 0.0
    for i in range(0, len(y), batch_size):
        logits = model.head(model.features[i:i + batch_size]).float()
        yb = y[i:i + batch_size]
        correct += int((logits.argmax(dim=1) == yb).sum())
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
    return correct / max(len(y), 1), loss / max(len(y), 1)


def main(argv: list[str] | None = None) -> int:
    loop.FedConcatLoop = KeptFeaturesLoop  # type: ignore[misc]
    loop.evaluate = evaluate
    return loop.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
