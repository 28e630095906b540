"""The datasets and models a run may name, and what the rest of the config needs to know of them.

Torch-free facts about :mod:`fedvls_flwr.data` and :mod:`fedvls_flwr.models` (tests check them
against the real loaders and networks), so a run config is judged before either is imported.
"""

from __future__ import annotations

#: Datasets held as images (loaded by :mod:`fedvls_flwr.data`); ``synthetic`` is generated.
IMAGE_DATASETS = ("digits", "mnist", "mnist10k", "fmnist", "cifar10", "cifar100", "tinyimagenet")
DATASETS = (*IMAGE_DATASETS, "synthetic")
#: The model zoo (:mod:`fedvls_flwr.models`); ``auto`` = the paper's model for the dataset.
MODELS = ("mlp", "logreg", "cnn", "mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32")
#: ``model = "auto"`` resolves to these.
DEFAULT_MODELS = {
    "digits": "mlp", "mnist": "mlp", "mnist10k": "mlp", "fmnist": "mlp",
    "cifar10": "mobilenetv2", "cifar100": "mobilenetv2", "tinyimagenet": "mobilenetv2",
    "synthetic": "logreg",
}
#: Models whose only layer is the classifier: no encoder computes features before it.
MODELS_WITHOUT_ENCODER = frozenset({"logreg"})


def resolved_model(model: str, dataset: str) -> str:
    """The model a run trains: ``model``, or the paper's model for ``dataset`` when ``auto``."""
    return DEFAULT_MODELS[dataset] if model == "auto" else model
