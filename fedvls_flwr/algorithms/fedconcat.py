"""FedConcat (Diao, Li, He, "Exploiting Label Skews in Federated Learning with Model
Concatenation", AAAI 2024), as the authors' code runs it (sjtudyq/FedConcat, experiments.py).

A protocol in stages (docs/methods.md, "FedConcat"):

0. once, before round 1: K-means (k-means++, 10 restarts, seeded) over the sites' label
   distributions (class counts / n_i) puts every site in one of K clusters - or the
   assignment comes from the setting ``fedconcat-assignment``. It is part of the server's
   state (and the checkpoint), never recomputed on resume, and written to protocol.json.
1. rounds 1..E (``fedconcat-encoder-rounds``; 0 = the authors' 1 : 20 split of
   ``num-server-rounds``): inside each cluster, FedAvg of a whole model (encoder + that
   cluster's head), every cluster starting from the same initial weights; the clients
   train with the run's local objective and optimizer (plain CE in the paper). No global
   model exists, so nothing is evaluated.
2. rounds E+1..R: the K encoders are frozen and concatenated in cluster order (features
   d*K); a new linear head (d*K -> C) is trained: every sampled client takes
   ``fedconcat-head-steps`` mini-batches (3 in the authors' code) of one shuffled pass on
   the head only, with a fresh SGD; the server averages the heads unweighted (every client
   took the same number of steps). The concatenated model is evaluated after every round.
   Each node gets the K encoders once (the protocol's client state, kept in the node's state
   across rounds); a node that joins late, or lost its state, gets them with its next message.

Round state (one flat dict of arrays): ``fedconcat/assignment`` (cluster per partition id, -1
for unknown), ``cluster<k>/<model key>`` in stage 1; ``encoder<k>/<model key>`` and
``head/weight``, ``head/bias`` from the end of round E on. The protocol's own state (the
checkpoint's ``protocol/encoder-rounds``) is E, fixed when the run starts: a run resumed with
another ``num-server-rounds`` keeps its stage boundary.

Without augmentation (the paper's MNIST setting) a frozen encoder's features of an image are
the same every head round, so they are computed once per process and reused: a client's for its
whole training data (:meth:`ConcatModel.features_of`), the server's for each batch of its test
set (:meth:`ConcatModel.forward_rows`), as long as the encoders stay the same; a head round then
costs the head's steps. The features are computed in larger batches than a step's (up to
``eval-batch-size``), so a network whose results depend on the batch they are computed in may
differ in the last bits from recomputing them per step (tests/test_fedconcat.py compares the
accuracies).

Differences from the authors' code, on purpose: every cluster starts from a deep copy of
the same initial model (their list of state dicts shares client 0's tensors, so a cluster
trained after client 0 in round 1 could start from client 0's trained weights); frozen
encoders run in eval mode in stage 2 (theirs stay in train mode, which only matters for
BatchNorm models, whose running statistics the server's copy would then keep updating).
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from fedvls_flwr.algorithms.aggregation import ArrayDict, Reply, weighted_average
from fedvls_flwr.algorithms.fedconcat_spec import fedconcat_assignment
from fedvls_flwr.algorithms.parts import RunContext, StateDict
from fedvls_flwr.algorithms.rounds import Assignment, ClientOutcome, ClientRound, RoundProtocol, read_tensor, train_as_usual
from fedvls_flwr.algorithms.sgd import LocalSGD
from fedvls_flwr.algorithms.training import TrainResult
from fedvls_flwr.config.settings import ConfigError
from fedvls_flwr.data.augment import make_batch_transform, same_device
from fedvls_flwr.models import FeatureTap, classifier_of

__all__ = ["FedConcat", "ConcatModel", "cluster_sites", "encoder_rounds"]

ASSIGNMENT = "fedconcat/assignment"
ENCODER_ROUNDS = "encoder-rounds"  # the protocol's own state (the checkpoint's protocol/encoder-rounds)
HEAD_WEIGHT, HEAD_BIAS = "head/weight", "head/bias"
STAGE = "fedconcat-stage"  # message config: 1 or 2
CLUSTER = "fedconcat-cluster"  # message config (stage 1): the node's cluster
DIGEST = "encoder-digest"  # the client state's: encoder_digest of the encoders kept beside it


def encoder_rounds(num_rounds: int, setting: int) -> int:
    """Stage 1's rounds: the setting, or (0) the authors' 1 : 20 split (50 + 1000 rounds),
    at least one round in each stage."""
    if setting > 0:
        return setting
    return min(num_rounds - 1, max(1, round(num_rounds / 21)))


def cluster_sites(distributions: np.ndarray, clusters: int, seed: int) -> np.ndarray:
    """K-means labels of the sites' label distributions (rows sum to 1): k-means++, 10 restarts."""
    from sklearn.cluster import KMeans

    if distributions.shape[0] < clusters:
        raise ValueError(f"fedconcat-clusters = {clusters} needs at least {clusters} sites, "
                         f"{distributions.shape[0]} took part in the clustering")
    return np.asarray(KMeans(n_clusters=clusters, n_init=10, random_state=seed).fit(distributions).labels_, np.int64)


def _prefixed(prefix: str, arrays: Mapping[str, Any]) -> dict[str, Any]:
    return {prefix + k: v for k, v in arrays.items()}


def _unprefixed(prefix: str, arrays: Mapping[str, Any]) -> dict[str, Any]:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


#: The most bytes of frozen features a process keeps (beyond it they are recomputed).
FEATURE_BYTES = 2 * 2**30


class ConcatModel(nn.Module):
    """K frozen encoders (whole models whose classifier input is taken) side by side, and one head."""

    def __init__(self, encoders: list[nn.Module], head: nn.Linear) -> None:
        super().__init__()
        self.encoders = nn.ModuleList(encoders)
        self.head = head
        for encoder in self.encoders:
            encoder.requires_grad_(False)
        self.encoders.eval()  # frozen: BatchNorm keeps its aggregated statistics (train() leaves it so)
        self._taps = [FeatureTap(e) for e in self.encoders]
        # features kept per input: key -> (a weak reference to the input, its version, the features)
        self._kept: dict[tuple[Any, ...], tuple[weakref.ref, int, torch.Tensor]] = {}
        self._kept_bytes = 0

    def _recall(self, source: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor | None:
        hit = self._kept.get((id(source), *key))
        if hit is not None and hit[0]() is source and hit[1] == source._version:
            return hit[2]
        return None

    def _keep(self, source: torch.Tensor, key: tuple[Any, ...], features: torch.Tensor) -> None:
        full = (id(source), *key)
        for stale in [k for k, (ref, _, _) in self._kept.items() if k == full or ref() is None]:
            self._kept_bytes -= self._kept.pop(stale)[2].nbytes
        if self._kept_bytes + features.nbytes <= FEATURE_BYTES:
            self._kept[full] = (weakref.ref(source), source._version, features)
            self._kept_bytes += features.nbytes

    @torch.no_grad()
    def features_of(self, x: torch.Tensor, transform: Any, device: torch.device, batch_size: int) -> torch.Tensor:
        """The frozen features of every row of ``x`` (a client's training data, transformed by
        ``transform``, which must not augment), on ``device``: computed once, in batches of
        ``batch_size``, and kept for as long as ``x`` is not changed and the encoders are these."""
        key = ("rows", transform.mean, transform.std, str(device))
        kept = self._recall(x, key)
        if kept is None:
            kept = torch.cat([self.features(transform(x[i:i + batch_size].to(device)))
                              for i in range(0, x.shape[0], batch_size)])
            self._keep(x, key, kept)
        return kept

    def forward_rows(self, source: torch.Tensor, start: int, stop: int, batch: Any, tag: Hashable) -> torch.Tensor:
        """The logits of rows ``start:stop`` of ``source``, ``batch()`` giving them as the model
        reads them (``tag`` names that transform and device): the frozen features of those rows
        are kept, so evaluating the same test set again runs the head only."""
        key = ("slice", start, stop, tag)
        features = self._recall(source, key)
        if features is None:
            features = self.features(batch())
            self._keep(source, key, features)
        return self.head(features)

    def train(self, mode: bool = True) -> ConcatModel:
        """The head's mode only: the frozen encoders stay in eval mode (BatchNorm keeps its
        aggregated statistics), set once when built - walking K whole models to set it again
        cost a tenth of a head round's client."""
        self.training = mode
        self.head.train(mode)
        return self

    @torch.no_grad()
    def features(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for encoder, tap in zip(self.encoders, self._taps):
            encoder(x)
            assert tap.features is not None
            out.append(tap.features.flatten(1))
        return torch.cat(out, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class _BuiltConcat:
    """The last concatenated model this process built, with the encoders it was built from.

    Within a run every node receives the same frozen encoders, and a process that serves several
    nodes (a Ray actor, the in-process engine) would otherwise rebuild the same K encoders for
    every message. A new request reuses the model when its encoders are equal to the kept ones and
    loads only the head; anything else rebuilds. Equal means: the same :func:`encoder_digest`
    when both sides have one (a client's node keeps the digest of its encoders beside them), else
    tensor for tensor, compared exactly (the server's evaluation)."""

    def __init__(self) -> None:
        self.encoders: dict[int, dict[str, torch.Tensor]] | None = None
        self.digest: bytes | None = None
        self.model: ConcatModel | None = None

    def get(self, model_factory: Any, encoders: Mapping[int, Mapping[str, torch.Tensor]],
            head: Mapping[str, torch.Tensor], device: torch.device | None, digest: bytes | None = None) -> ConcatModel:
        if self.model is not None and self.encoders is not None \
                and tuple(self.model.head.weight.shape) == tuple(head["weight"].shape):
            if digest is not None and self.digest is not None:
                same = digest == self.digest
            else:
                same = _same_encoders(self.encoders, encoders)
                if same and digest is not None:
                    self.digest = digest  # checked tensor for tensor: its digest is this model's
            if same:
                _load_head(self.model.head, head)
                # "cuda" against the head's "cuda:0": the same GPU, not a move of K encoders each message
                moved = device is None or same_device(self.model.head.weight.device, torch.device(device))
                return self.model if moved else self.model.to(device)
        self.model = _concat_model(model_factory(), encoders, head, device)
        self.encoders = {k: {name: t.detach().clone() for name, t in e.items()} for k, e in encoders.items()}
        self.digest = digest
        return self.model


def _load_head(linear: nn.Linear, head: Mapping[str, torch.Tensor]) -> None:
    """``linear.load_state_dict(head)``: the same copies, without its walk over hooks, keys and
    submodules (70 µs a message, most of a head-round client's model lookup). Anything but the
    two tensors of the head's shapes goes to ``load_state_dict``, which says what does not fit."""
    weight, bias = head.get("weight"), head.get("bias")
    if len(head) != 2 or weight is None or bias is None or linear.bias is None \
            or weight.shape != linear.weight.shape or bias.shape != linear.bias.shape:
        linear.load_state_dict(dict(head))
        return
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)


def encoder_digest(encoders: Mapping[str, torch.Tensor]) -> bytes:
    """A fingerprint of the frozen encoders (names, dtypes, shapes and bits, BLAKE2b): two sets
    with the same digest are equal, and comparing digests costs nothing beside comparing the
    tensors of K whole models for every message of a head round."""
    import hashlib

    h = hashlib.blake2b(digest_size=32)
    for name in sorted(encoders):
        t = encoders[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.digest()


def _same_encoders(a: Mapping[int, Mapping[str, torch.Tensor]], b: Mapping[int, Mapping[str, torch.Tensor]]) -> bool:
    if sorted(a) != sorted(b):
        return False
    for k in a:
        if sorted(a[k]) != sorted(b[k]):
            return False
        for name, t in a[k].items():
            other = b[k][name]
            if t.shape != other.shape or t.dtype != other.dtype or not torch.equal(t, other.to(t.device)):
                return False
    return True


#: One per process (see :class:`_BuiltConcat`).
_BUILT = _BuiltConcat()


def _concat_model(model: nn.Module, encoders: Mapping[int, Mapping[str, torch.Tensor]], head: Mapping[str, torch.Tensor],
                  device: torch.device | None = None) -> ConcatModel:
    copies = []
    for k in sorted(encoders):
        encoder = copy.deepcopy(model)
        encoder.load_state_dict(dict(encoders[k]))
        copies.append(encoder)
    out_features, in_features = head["weight"].shape
    linear = nn.Linear(in_features, out_features)
    linear.load_state_dict(dict(head))
    concat = ConcatModel(copies, linear)
    return concat if device is None else concat.to(device)


class FedConcat(RoundProtocol):
    single_model = False

    def __init__(self, settings: Mapping[str, Any], context: RunContext) -> None:
        super().__init__(settings, context)
        self.clusters = int(settings["fedconcat-clusters"])
        self.encoder_rounds = encoder_rounds(self.cfg.num_server_rounds, int(settings["fedconcat-encoder-rounds"]))
        self.head_steps = int(settings["fedconcat-head-steps"])
        self.head_init = str(settings["fedconcat-head-init"])
        self.assignment_setting = str(settings["fedconcat-assignment"])
        self._has_encoders: set[int] = set()  # nodes that hold the frozen encoders (this server's life)
        self._sending_encoders: set[int] = set()
        self._model: nn.Module | None = None
        self.source = "setting" if self.assignment_setting else "k-means"
        self.site_distributions: dict[int, list[float]] = {}
        self.kept_state: StateDict = {}  # a client's: the frozen encoders its node holds, and their DIGEST

    def stage(self, server_round: int) -> int:
        return 1 if server_round <= self.encoder_rounds else 2

    # ---- server -------------------------------------------------------------------
    def wants_site_statistics(self) -> bool:
        return not self.assignment_setting

    def bind_model(self, model: nn.Module) -> None:
        self._model = model

    def initial_state(self, model_arrays: ArrayDict, site_stats: Mapping[int, Mapping[str, list[int]]]) -> ArrayDict:
        if self.assignment_setting:
            assignment = np.asarray(fedconcat_assignment(self.assignment_setting), np.int64)
        else:
            partitions = sorted(site_stats)
            counts = np.asarray([site_stats[p]["class-counts"] for p in partitions], np.float64)
            sizes = counts.sum(axis=1, keepdims=True)
            if (sizes <= 0).any():
                raise ValueError("a site reported no training sample; FedConcat cannot place it in a cluster")
            distributions = counts / sizes
            self.site_distributions = {p: [float(v) for v in row] for p, row in zip(partitions, distributions)}
            labels = cluster_sites(distributions, self.clusters, self.cfg.seed)
            assignment = np.full(max(partitions) + 1, -1, np.int64)
            assignment[partitions] = labels
        state: ArrayDict = {ASSIGNMENT: assignment}
        for k in range(self.clusters):  # every cluster starts from (a copy of) the same weights
            state.update(_prefixed(f"cluster{k}/", {name: v.copy() for name, v in model_arrays.items()}))
        return state

    def state(self) -> ArrayDict:
        return {ENCODER_ROUNDS: np.asarray([self.encoder_rounds], np.int64)}

    def load_state(self, state: ArrayDict) -> None:
        """Stage 1 keeps the length it had when the run started: ``num-server-rounds`` may change
        on resume (more or fewer head rounds), the boundary may not."""
        if ENCODER_ROUNDS not in state:
            return  # nothing saved: the setting's split
        saved = int(np.asarray(state[ENCODER_ROUNDS]).reshape(-1)[0])
        if self.cfg.num_server_rounds <= saved:
            raise ConfigError(
                f"resume: this FedConcat run's stage 1 has {saved} rounds (fixed when it started), so "
                f"num-server-rounds = {self.cfg.num_server_rounds} leaves no round for stage 2; resume with "
                f"num-server-rounds > {saved}")
        self.encoder_rounds = saved

    def cluster_of(self, state: ArrayDict, partition: int | None) -> int | None:
        assignment = state[ASSIGNMENT]
        if partition is None or not 0 <= partition < assignment.shape[0] or assignment[partition] < 0:
            return None
        return int(assignment[partition])

    def plan(self, server_round: int, state: ArrayDict, partitions: Mapping[int, int | None]) -> dict[int, Assignment]:
        if self.stage(server_round) == 1:
            per_cluster = {k: Assignment(f"cluster{k}", _unprefixed(f"cluster{k}/", state), {STAGE: 1, CLUSTER: k})
                           for k in range(self.clusters)}  # one message per cluster, not one per node
            out: dict[int, Assignment] = {}
            for node, partition in partitions.items():
                k = self.cluster_of(state, partition)
                if k is not None:  # a site unknown at the clustering waits for stage 2
                    out[node] = per_cluster[k]
            return out
        head = {HEAD_WEIGHT: state[HEAD_WEIGHT], HEAD_BIAS: state[HEAD_BIAS]}
        with_encoders = {**head, **{k: v for k, v in state.items() if k.startswith("encoder")}}
        self._sending_encoders = {n for n in partitions if n not in self._has_encoders}
        # one message for the nodes that need the encoders and one for the others (not one per node)
        first = Assignment("head", with_encoders, {STAGE: 2}, head)
        later = Assignment("head", head, {STAGE: 2}, head)
        return {node: first if node in self._sending_encoders else later for node in partitions}

    def aggregate(self, server_round: int, state: ArrayDict, groups: Mapping[str, list[Reply]]) -> ArrayDict:
        new = dict(state)
        if self.stage(server_round) == 1:
            for k in range(self.clusters):
                replies = groups.get(f"cluster{k}")
                if replies:  # a cluster none of whose clients replied keeps its model
                    prefix = f"cluster{k}/"
                    new.update(_prefixed(prefix, weighted_average(replies, _unprefixed(prefix, state))))
            return self._to_stage_two(new) if server_round == self.encoder_rounds else new
        replies = groups["head"]
        for name in (HEAD_WEIGHT, HEAD_BIAS):  # unweighted: every client took the same steps
            mean = np.mean([r.arrays[name].astype(np.float64) for r in replies], axis=0)
            new[name] = mean.astype(state[name].dtype)
        self._has_encoders |= {int(r.client) for r in replies if int(r.client) in self._sending_encoders}
        return new

    def forget_node(self, node: int) -> None:
        """A node failed: it may have lost its state, so it gets the encoders again."""
        self._has_encoders.discard(node)

    def _to_stage_two(self, state: ArrayDict) -> ArrayDict:
        """The end of stage 1: cluster models become frozen encoders, and a new head is drawn
        (seeded, so a resumed run draws the same one)."""
        if self._model is None:
            raise RuntimeError("FedConcat needs the run's model (bind_model) before stage 2")
        out: ArrayDict = {ASSIGNMENT: state[ASSIGNMENT]}
        for k in range(self.clusters):
            out.update(_prefixed(f"encoder{k}/", _unprefixed(f"cluster{k}/", state)))
        classifier = classifier_of(self._model)
        names = {id(m): name for name, m in self._model.named_modules()}
        prefix = names[id(classifier)] + "."
        width = classifier.in_features * self.clusters
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + 21)
        if self.head_init == "concat":  # the authors' CIFAR-100 / TinyImageNet start
            weights = [state[f"cluster{k}/{prefix}weight"] for k in range(self.clusters)]
            weight = np.concatenate(weights, axis=1)
            bias = np.sum([state[f"cluster{k}/{prefix}bias"] for k in range(self.clusters)], axis=0)
        else:  # PyTorch's default initialisation of a new nn.Linear(d*K, C)
            w = torch.empty(classifier.out_features, width)
            nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
            bound = 1 / math.sqrt(width)
            b = torch.empty(classifier.out_features).uniform_(-bound, bound, generator=generator)
            weight, bias = w.numpy(), b.numpy()
        dtype = state[f"cluster0/{prefix}weight"].dtype
        out[HEAD_WEIGHT], out[HEAD_BIAS] = weight.astype(dtype), bias.astype(dtype)
        return out

    def evaluation_model(self, state: ArrayDict, model: nn.Module, server_round: int = 0) -> nn.Module | None:
        if HEAD_WEIGHT not in state or self.stage(server_round) == 1:
            return None  # stage 1: K cluster models, no global one
        encoders = {k: {name: read_tensor(v) for name, v in _unprefixed(f"encoder{k}/", state).items()}
                    for k in range(self.clusters)}
        head = {"weight": read_tensor(state[HEAD_WEIGHT]), "bias": read_tensor(state[HEAD_BIAS])}
        return _BUILT.get(lambda: model, encoders, head, None)

    def round_info(self, server_round: int) -> dict[str, Any]:
        return {"stage": self.stage(server_round)}

    def describe(self, state: ArrayDict) -> dict[str, Any]:
        assignment = state[ASSIGNMENT]
        return {
            "protocol": "fedconcat",
            "clusters": self.clusters,
            "encoder_rounds": self.encoder_rounds,
            "classifier_rounds": self.cfg.num_server_rounds - self.encoder_rounds,
            "assignment_source": self.source,
            "assignment": {str(p): int(k) for p, k in enumerate(assignment) if k >= 0},
            "setting": ",".join(str(int(k)) for k in assignment),
            **({"label_distributions": {str(p): d for p, d in self.site_distributions.items()}}
               if self.site_distributions else {}),
        }

    # ---- client -------------------------------------------------------------------
    def load_client_state(self, state: StateDict) -> None:
        """The frozen encoders this node kept (none before they first came), and their digest."""
        self.kept_state = dict(state)

    def kept_digest(self) -> bytes | None:
        """The encoder_digest the node keeps beside its encoders (None: kept before digests were)."""
        digest = self.kept_state.get(DIGEST)
        return None if digest is None else digest.numpy().tobytes()

    def client_state(self) -> StateDict:
        """The frozen encoders with their digest, kept for the node's next head rounds: the very
        tensors that came from the node's state when nothing new came (so they are not encoded
        again)."""
        return {k: v.detach().cpu() for k, v in self.kept_state.items()}

    def client_train(self, step: ClientRound) -> ClientOutcome:
        """Stage 1: the ordinary local training of the cluster's model. Stage 2: the head, over
        the frozen encoders the node keeps."""
        if int(step.config.get(STAGE, 1)) != 2:
            return train_as_usual(step)
        arrays = step.arrays
        received: dict[str, torch.Tensor] = {k: v for k, v in arrays.items() if k.startswith("encoder")}
        if received:
            digest = torch.frombuffer(bytearray(encoder_digest(received)), dtype=torch.uint8)
            self.kept_state = {**received, DIGEST: digest}
        else:
            received = {k: v for k, v in self.kept_state.items() if k != DIGEST}
            if not received:
                raise RuntimeError("FedConcat stage 2: this node holds no frozen encoders (they come once per node, "
                                   "and its state was lost, e.g. a restarted SuperNode); the server sends them again "
                                   "with its next message")
        clusters = sorted({int(k.split("/", 1)[0][len("encoder"):]) for k in received})
        encoders = {k: _unprefixed(f"encoder{k}/", received) for k in clusters}
        head = {"weight": arrays[HEAD_WEIGHT], "bias": arrays[HEAD_BIAS]}
        device, cfg, data = step.device, step.cfg, step.data
        model = _BUILT.get(step.model_factory, encoders, head, device, digest=self.kept_digest())
        model.train()
        x, y = data.x, data.y
        n = int(x.shape[0])
        transform = make_batch_transform(data.mean, data.std, train=True, augment=cfg.augment, generator=step.generator)
        # no augmentation: the frozen features of this client's data, once per process (module docstring)
        features = None if transform.augments else model.features_of(x, transform, device, cfg.eval_batch_size)
        sgd = LocalSGD(model.head.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        order = torch.randperm(n, generator=step.generator)
        steps = min(self.head_steps, math.ceil(n / cfg.batch_size))
        loss_sum, seen = torch.zeros((), device=device), 0
        for s in range(steps):
            idx = order[s * cfg.batch_size:(s + 1) * cfg.batch_size]
            yb = y[idx].to(device)
            if features is not None:
                inputs = features[idx.to(features.device)]
            else:
                inputs = model.features(transform(x[idx].to(device)))
            sgd.zero_grad()
            loss = nn.functional.cross_entropy(model.head(inputs), yb)
            loss.backward()
            sgd.step()
            loss_sum += loss.detach() * idx.shape[0]
            seen += int(idx.shape[0])
        if not torch.isfinite(loss_sum):
            raise RuntimeError("FedConcat stage 2: the head's loss became non-finite; the update was not sent")
        counts = torch.bincount(y, minlength=data.num_classes)
        mean_loss = float(loss_sum) / max(seen, 1)
        result = TrainResult(num_examples=seen, loss=mean_loss, terms={"head-ce": mean_loss},
                             num_vacant=int((counts == 0).sum()), class_counts=[int(c) for c in counts.tolist()], steps=steps)
        weights = {HEAD_WEIGHT: model.head.weight.detach().cpu(), HEAD_BIAS: model.head.bias.detach().cpu()}
        return ClientOutcome(weights, result)
