"""Per-step cost of each local objective, alone and inside a whole MLP training step.

    python bench/bench_objectives.py              # 1 thread, 2,000 steps, median of 5
    python bench/bench_objectives.py --steps 500  # quicker, noisier

Why: at mnist10k scale a FedVLS round costs about 1.25x a FedAvg round in the plain loop
and in the app alike (bench/bench_round.py). This splits a step of the paper's MNIST MLP
(784-200-200-10, batch 64, one thread, the app's LocalSGD with momentum) into the
objective's value and gradient with respect to the logits and the rest, on a client
whose counts come from a Dirichlet-0.05 partition (6 of 10 classes vacant), so every
FedVLS term runs. The teacher rows are prepared once, as the app does once per round
without augmentation; their cost is not in the step.

Prints a Markdown table; the repeats are interleaved across objectives so a busy machine
distorts the comparison less.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fedvls_flwr.algorithms.objectives.base import objective_for  # noqa: E402
from fedvls_flwr.algorithms.sgd import LocalSGD  # noqa: E402
from fedvls_flwr.models import build_model  # noqa: E402

BATCH, CLASSES = 64, 10
# client 0 of seed 0 at Dirichlet 0.05 on mnist10k (docs/results/table1-mnist10k)
CLIENT_COUNTS = torch.tensor([155, 0, 7, 0, 0, 152, 0, 0, 0, 808])


def per_step_ms(fn, steps: int) -> float:
    for _ in range(min(200, steps)):
        fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps * 1e3


def make_cases(methods: list[str]):
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(CLIENT_COUNTS.float(), BATCH, replacement=True, generator=gen)
    x = torch.randn(BATCH, 784, generator=gen)
    cases = {}
    for method in methods:
        objective = objective_for(method, CLIENT_COUNTS)
        teacher = None
        if objective.needs_teacher:
            teacher = objective.prepare_teacher(torch.randn(BATCH, CLASSES, generator=gen), y)
        logits = torch.randn(BATCH, CLASSES, generator=gen, requires_grad=True)

        def objective_only(objective=objective, logits=logits, teacher=teacher):
            loss, _ = objective.loss_terms(logits, y, teacher)
            loss.backward()

        torch.manual_seed(0)
        model = build_model("mlp", (1, 28, 28), CLASSES)
        opt = LocalSGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)

        def whole_step(objective=objective, model=model, opt=opt, teacher=teacher):
            opt.zero_grad()
            loss, _ = objective.loss_terms(model(x), y, teacher)
            loss.backward()
            opt.step()

        cases[method] = (objective_only, whole_step)
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--methods", default="fedavg,fedlc,fedntd,fedvls")
    args = ap.parse_args()
    torch.set_num_threads(1)
    methods = args.methods.split(",")
    cases = make_cases(methods)
    obj = {m: [] for m in methods}
    step = {m: [] for m in methods}
    for _ in range(args.repeats):
        for m in methods:
            obj[m].append(per_step_ms(cases[m][0], args.steps))
            step[m].append(per_step_ms(cases[m][1], args.steps))
    base = statistics.median(step[methods[0]])
    print(f"MNIST MLP, batch {BATCH}, 1 thread, {args.steps} steps, median of {args.repeats} (range)\n")
    print(f"| objective | objective value + gradient (ms/step) | whole training step (ms/step) | step / {methods[0]} step |")
    print("| --- | --- | --- | --- |")
    for m in methods:
        o, s = statistics.median(obj[m]), statistics.median(step[m])
        print(f"| {m} | {o:.3f} ({min(obj[m]):.3f}-{max(obj[m]):.3f}) "
              f"| {s:.3f} ({min(step[m]):.3f}-{max(step[m]):.3f}) | {s / base:.2f}x |")


if __name__ == "__main__":
    main()
