"""The general run settings, declared once and grouped as the docs show them (each method's and
optimizer's own settings are declared in its spec, beside its implementation: ``algorithms/**/*_spec.py``,
listed by :mod:`fedvls_flwr.config.registry`).

Adding a setting: one ``Setting(...)`` in its group below, then ``fedvls config --write``
regenerates what derives from the declarations (RunConfig's fields, pyproject's
``[tool.flwr.app.config]`` and docs/configuration.md).
"""

from __future__ import annotations

from fedvls_flwr.config.catalogue import DATASETS, MODELS
from fedvls_flwr.config.registry import method_names, part_names
from fedvls_flwr.config.settings import Setting, at_least, between, greater

#: A switch that can also follow what was measured: "auto", "true" or "false" (TOML/YAML
#: booleans are read as "true"/"false").
AUTO_SWITCH = ("auto", "true", "false")

#: (title, settings) in the order the docs list them.
GROUPS: tuple[tuple[str, tuple[Setting, ...]], ...] = (
    ("Experiment", (
        Setting("method", "fedvls", "the local objective (see docs/methods.md)", choices=method_names),
        Setting("dataset", "digits", "the dataset", choices=DATASETS),
        Setting("data-dir", "~/fedvls-data", "where datasets live (relative paths: against $FEDVLS_BASE_DIR)"),
        Setting("download", False, "let torchvision download MNIST / Fashion-MNIST / CIFAR into data-dir"),
        Setting("partition", "dirichlet", "label-skew scheme", choices=("dirichlet", "shards", "noniid-labeldir", "iid")),
        Setting("dirichlet-beta", 0.05, "Dirichlet concentration (smaller = stronger skew)",
                **greater(0, "e.g. 0.5, 0.1, 0.05")),
        Setting("shards-per-client", 2, "shards (partition = shards) or classes (noniid-labeldir) per client",
                **at_least(1)),
        Setting("min-partition-size", 10, "every Dirichlet client holds at least this many samples", **at_least(1)),
        Setting("seed", 0, "partition, model initialisation, client sampling and batch order",
                **at_least(0, "an integer; the partition and sampling draw from it")),
        Setting("model", "auto", "the network; auto = the paper's model for the dataset", choices=("auto", *MODELS)),
        Setting("train-pool-size", 0, "> 0: a stratified fixed-seed subsample of the training pool of this size",
                **at_least(0, "0 = the whole training pool")),
        # dataset = "synthetic": the FedProx/LEAF Synthetic(alpha, beta) generator, one client per node
        Setting("synthetic-alpha", 1.0, "Synthetic(alpha, beta): model heterogeneity", **at_least(0)),
        Setting("synthetic-beta", 1.0, "Synthetic(alpha, beta): data heterogeneity", **at_least(0)),
        Setting("synthetic-clients", 100, "Synthetic: number of generated clients (= num-supernodes)", **at_least(1)),
    )),
    ("Federation", (
        Setting("num-server-rounds", 30, "rounds", **at_least(1)),
        Setting("fraction-train", 1.0, "fraction of nodes sampled per round (R in the paper)",
                **between(0, 1, low_open=True)),
        Setting("min-nodes", 2, "nodes to wait for before the first round", **at_least(1)),
        # A simulation has all its nodes from the start: fewer than min-nodes fails at once.
        Setting("min-nodes-timeout", 900.0, "deployment: seconds to wait for min-nodes before the run fails",
                **greater(0, "seconds")),
        Setting("round-timeout", 3600.0, "seconds to wait for the replies of a round", **greater(0, "seconds")),
        Setting("min-fit-fraction", 0.5, "a round needs usable replies from this fraction of the sampled clients",
                **between(0, 1)),
        Setting("round-retries", 1, "re-runs of a round that got too few usable replies", **at_least(0)),
        Setting("server-optimizer", "fedavg", "how the average becomes the next global model",
                choices=lambda: part_names("server-optimizer")),
        Setting("protocol", "standard",
                "the federation's shape: standard (one global model), or fedconcat (clusters, then one head over their encoders)",
                choices=lambda: part_names("protocol")),
    )),
    ("Local training", (
        Setting("local-epochs", 5, "local epochs per round", **at_least(1)),
        Setting("batch-size", 64, "local batch size", **at_least(1)),
        Setting("lr", 0.01, "local SGD learning rate", **greater(0)),
        Setting("momentum", 0.9, "local SGD momentum", **between(0, 1, high_open=True)),
        Setting("weight-decay", 1e-5, "local SGD weight decay", **at_least(0)),
        Setting("local-optimizer", "sgd", "how a client steps: sgd, sam (FedSAM's sharpness-aware step) or fedgf (FedGF)",
                choices=lambda: part_names("local-optimizer")),
        # "fresh": a new optimizer every round (the FedVLS code); "carry": the momentum buffer
        # lives on in the client's state (the authors' FedAvg/FedLC/FedNTD clients).
        Setting("optimizer-state", "fresh", "local momentum: fresh every round, or carried across rounds",
                choices=("fresh", "carry"), label={"carry": "(momentum carried)"}),
        # Crop + flip + AutoAugment on the uint8 image datasets (cifar10, cifar100,
        # tinyimagenet); the MNIST-like sets are stored normalised and never augmented.
        Setting("augment", True, "CIFAR-style training augmentation (RGB datasets only)"),
        # bfloat16 autocast on CUDA; accepted and ignored on a CPU (so one preset serves both).
        # auto: on for the models where it was measured faster (algorithms/device.py, docs/performance.md).
        Setting("amp", "auto", "bfloat16 mixed precision on CUDA, training and server evaluation (auto: where "
                "measured faster)", choices=AUTO_SWITCH),
        # The conv nets' activations in NHWC on CUDA; ignored on a CPU.
        Setting("channels-last", "auto", "channels-last memory format on CUDA (auto: where measured faster)",
                choices=AUTO_SWITCH),
        # Each client's step (augmentation, forward, loss, backward, update) captured once per process
        # and replayed (algorithms/graphed.py); off: the same step launched op by op. Ignored on a CPU.
        Setting("cuda-graphs", True, "replay each client's training step as CUDA graphs on CUDA (ignored on a CPU)"),
    )),
    ("Hardware and evaluation", (
        Setting("device", "auto", "where clients train: auto (CUDA when present), cpu or cuda",
                choices=("auto", "cpu", "cuda")),
        # The ServerApp's own evaluation of the global model; in simulation it runs outside
        # Ray's GPU accounting (client-resources-num-gpus covers the clients only).
        Setting("server-device", "auto", "where the server evaluates: auto (CUDA when present, cpu when device = "
                "cpu), cpu or cuda", choices=("auto", "cpu", "cuda")),
        # Deterministic cuDNN/cuBLAS kernels and no TF32 (no effect on a CPU run, which is).
        Setting("deterministic", False, "bit-for-bit reproducible GPU runs (can be slower; docs/performance.md)"),
        Setting("torch-threads", 1, "torch threads per client process", **at_least(0, "0 keeps torch's default")),
        Setting("eval-batch-size", 1024, "evaluation batch size", **at_least(1)),
        # "server": the run dataset's test split on the server; "federated": each node's local
        # held-out split (node config test-fraction), pooled per class; "auto": server when the
        # server has the test split, else federated.
        Setting("evaluation", "auto", "where the global model is evaluated", choices=("auto", "server", "federated")),
    )),
    ("Results", (
        Setting("output-dir", "~/fedvls-runs", "results folder",
                check=lambda v: v.strip() != "", rule="a non-empty path"),
        Setting("run-name", "", "the run's folder under output-dir (default: dataset-method-skew-seed-time)",
                check=lambda v: "/" not in v and v not in (".", ".."), rule="a plain folder name (no '/')"),
        Setting("resume", False, "continue the run in run-name from its last completed round"),
        Setting("local-eval", False, "the local-update diagnostic (clients evaluate their updated model)"),
        # A site's class counts are its label distribution. No method needs them on the server
        # each round, so replies carry them only when asked: a simulation's server computes
        # them from the split itself (docs/methods.md, "What a site shares").
        Setting("share-class-counts", False, "diagnostic: sites send their class counts (label distribution) "
                "with every reply (docs/methods.md)"),
        # Event files in the run folder, written by the server from each round's rounds.jsonl
        # record (docs/tracking.md); needs the extra: pip install "fedvls-flwr[tensorboard]".
        Setting("tracking", "none", "also log every round's numbers for an experiment tracker (docs/tracking.md)",
                choices=("none", "tensorboard")),
    )),
)
GENERAL_SETTINGS: tuple[Setting, ...] = tuple(s for _, group in GROUPS for s in group)
