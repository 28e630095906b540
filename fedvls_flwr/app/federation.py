"""What the server makes of its federation, without Flower: the message of a run whose
``min-nodes`` never came, two SuperNodes that say they are the same partition, and the
nodes' evaluations of the global model pooled into one."""

from __future__ import annotations

import numpy as np

from fedvls_flwr.app import keys


def too_few_nodes(needed: int, timeout: float, have: int, said: list[int], waited: float, simulation: bool) -> str:
    """Why the first round cannot start: ``have`` of ``needed`` nodes, which said partitions ``said``.

    A simulation has all its nodes from the start, so the fix is a number. A deployment's
    server knows only the partition ids the connected nodes say (from their node config):
    which ones are missing is a guess it states as one (partitions numbered 0..min-nodes-1),
    and only when every id said fits it (node-local sites without a partition-id say a hash).
    """
    if simulation:
        return (f"min-nodes = {needed} but this simulation has {have} SuperNode(s) (num-supernodes), "
                f"so the first round can never start: lower min-nodes to at most {have} (--run-config "
                f"\"min-nodes={have}\"), or simulate more nodes (--federation-config \"num-supernodes={needed}\")")
    said = sorted(said)
    which = f"they say partition id(s) {', '.join(map(str, said))}" if said else "none said its partition id"
    if len(said) < have:
        which += f" ({have - len(said)} did not answer)"
    twice = sorted({p for p in said if said.count(p) > 1})
    if twice:
        which += f"; partition id(s) {', '.join(map(str, twice))} said by two nodes"
    absent = [p for p in range(needed) if p not in said]
    guess = (f"; if the partitions are numbered 0..{needed - 1}, the missing ones are "
             f"{', '.join(map(str, absent))}" if said and absent and max(said) < needed else "")
    return (f"only {have} of min-nodes = {needed} SuperNodes connected within min-nodes-timeout = "
            f"{timeout:g} s ({waited:.0f} s waited); {which}{guess}. No round was started. Start the missing "
            "SuperNodes (each with its own --node-config partition-id), lower min-nodes, or raise "
            "min-nodes-timeout, then start the run again")


def same_partition(partitions: dict[int, int], node: int, others: list[int]) -> int | None:
    """The first of ``others`` that said the same partition id as ``node``, or None."""
    if node not in partitions:
        return None
    return next((o for o in others if o != node and partitions.get(o) == partitions[node]), None)


def pool_evaluations(replies: list[dict]) -> dict:
    """Sum per-class correct/total counts of the nodes' evaluations (sample-weighted)."""
    usable = [r for r in replies if r.get(keys.NUM_EXAMPLES, 0) > 0 and keys.TOTAL_PER_CLASS in r]
    if not usable:
        return {"accuracy": None, "loss": None, "per_class_accuracy": None, "eval_nodes": 0, "eval_examples": 0}
    correct = np.sum([np.asarray(r[keys.CORRECT_PER_CLASS], dtype=np.float64) for r in usable], axis=0)
    total = np.sum([np.asarray(r[keys.TOTAL_PER_CLASS], dtype=np.float64) for r in usable], axis=0)
    n = float(total.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = np.where(total > 0, correct / np.maximum(total, 1), np.nan)
    return {
        "accuracy": float(correct.sum() / n),
        "loss": float(sum(r[keys.LOSS_SUM] for r in usable) / n),
        "per_class_accuracy": [float(v) for v in per_class],
        "eval_nodes": len(usable),
        "eval_examples": int(n),
    }
