"""FedConcat (:mod:`fedvls_flwr.algorithms.fedconcat`), a protocol in stages: its spec, and what it
needs of the rest of a run config and of the federation - each rule a message that says what is
wrong and how to fix it, or None. Torch-free (:mod:`fedvls_flwr.config.spec`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fedvls_flwr.config.settings import Setting, at_least
from fedvls_flwr.config.spec import EveryValueLabel, Part, Selection

FEDCONCAT_CLUSTERS = Setting("fedconcat-clusters", 2, "FedConcat: number of clusters K (2 or 4 in the FedVLS paper)",
                             label=EveryValueLabel("K={}"), **at_least(1))
FEDCONCAT_ENCODER_ROUNDS = Setting(
    "fedconcat-encoder-rounds", 0,
    "FedConcat: rounds of stage 1 (FedAvg inside each cluster); 0 = the authors' 1 : 20 split of num-server-rounds",
    **at_least(0, "0 = the 1 : 20 split"),
)
FEDCONCAT_HEAD_STEPS = Setting("fedconcat-head-steps", 3, "FedConcat stage 2: mini-batches per client and round on the head",
                               **at_least(1))
FEDCONCAT_HEAD_INIT = Setting(
    "fedconcat-head-init", "random",
    "FedConcat: the new head starts random, or from the clusters' heads side by side (the authors' CIFAR-100 start)",
    choices=("random", "concat"), label={"concat": "(head from clusters)"},
)
FEDCONCAT_ASSIGNMENT = Setting(
    "fedconcat-assignment", "",
    "FedConcat: the cluster of partition 0, 1, ... ('0,1,0,1'); empty = K-means over the sites' label distributions",
    check=lambda v: v == "" or re.fullmatch(r"\d+(,\d+)*", v.replace(" ", "")) is not None,
    rule="comma-separated cluster numbers, one per partition id, e.g. '0,1,0,1' (empty: K-means)",
)


def fedconcat_assignment(text: str) -> list[int]:
    """``fedconcat-assignment`` as the cluster of partition 0, 1, ... (empty: none given).
    Its form is the setting's own rule; its clusters are checked by :func:`fedconcat_rules`."""
    text = text.replace(" ", "")
    return [int(v) for v in text.split(",")] if text else []


def fedconcat_rules(values: Mapping[str, Any], selection: Selection) -> str | None:
    """What FedConcat needs of the rest of the run config."""
    rounds, k = int(values["num-server-rounds"]), int(values["fedconcat-clusters"])
    encoder_rounds = int(values["fedconcat-encoder-rounds"])
    if rounds < 2:
        return ("protocol 'fedconcat' has two stages of at least one round each: set num-server-rounds >= 2 "
                "(the authors' split is 50 + 1000)")
    if encoder_rounds >= rounds:
        return (f"fedconcat-encoder-rounds = {encoder_rounds} leaves no round for stage 2 of num-server-rounds = "
                f"{rounds}: make it smaller than num-server-rounds, or 0 for the 1 : 20 split")
    if values["server-optimizer"] != "fedavg":
        return (f"protocol 'fedconcat' averages K cluster models and then a head: it does not combine with "
                f"server-optimizer '{values['server-optimizer']}'; use server-optimizer='fedavg'")
    if values["evaluation"] == "federated":
        return "protocol 'fedconcat' is evaluated on the server's test set: use evaluation='server' or 'auto'"
    with_server = [f"{kind} '{part.name}'" for kind, part in selection.parts.items() if part.server is not None]
    if with_server:
        return (f"protocol 'fedconcat' keeps K models, so {with_server[0]} (whose server state follows one global "
                "model) does not combine with it; use local-optimizer='sgd' or 'sam'")
    if not selection.model_has_encoder:
        return (f"protocol 'fedconcat' concatenates the encoders of K models, and model '{selection.model}' has none "
                "(its only layer is the classifier, so the head would read K copies of the input): use model='mlp' "
                "or a CNN")
    if assignment := fedconcat_assignment(str(values["fedconcat-assignment"])):
        used = set(assignment)
        if bad := sorted(v for v in used if v >= k):
            return (f"fedconcat-assignment names cluster(s) {bad}, but fedconcat-clusters = {k} numbers them "
                    f"0..{k - 1}")
        if empty := sorted(set(range(k)) - used):
            return (f"fedconcat-assignment '{values['fedconcat-assignment']}' puts no partition in cluster(s) {empty} "
                    f"of fedconcat-clusters = {k}: their encoders would never train and still go into the "
                    "concatenated model; give every cluster a partition, or lower fedconcat-clusters")
    return None


def fedconcat_federation_rules(values: Mapping[str, Any], nodes: int) -> str | None:
    """What FedConcat needs of the number of nodes (one partition each)."""
    k = int(values["fedconcat-clusters"])
    assignment = fedconcat_assignment(str(values["fedconcat-assignment"]))
    if not assignment and k > nodes:
        return (f"fedconcat-clusters = {k} needs at least {k} sites for K-means, and the federation has {nodes} "
                f"node(s): lower fedconcat-clusters to at most {nodes}, or use more nodes")
    if assignment and (given := len(assignment)) != nodes:
        return (f"fedconcat-assignment gives the clusters of {given} partition(s), and the federation has {nodes} "
                f"node(s), partitions 0..{nodes - 1}: give one cluster per partition ({nodes} numbers), or leave it "
                "empty for K-means")
    return None


FEDCONCAT = Part(
    "fedconcat", "FedConcat", "fedvls_flwr.algorithms.fedconcat:FedConcat",
    (FEDCONCAT_CLUSTERS, FEDCONCAT_ENCODER_ROUNDS, FEDCONCAT_HEAD_STEPS, FEDCONCAT_HEAD_INIT, FEDCONCAT_ASSIGNMENT),
    shares=("class-counts",), rules=fedconcat_rules, federation_rules=fedconcat_federation_rules,
    sends="stage 1: the site's cluster model instead of one global model; stage 2: the K frozen encoders, "
          "once per node, then the head each round",
)
