"""What the server can say about the federation it waits for (no Flower): the message of a
run whose ``min-nodes`` never came, and two SuperNodes that say they are the same partition."""

from __future__ import annotations


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
