"""BatchNorm and small batches: a short last batch joins the one before it for
BatchNorm models only, a client of one sample fails with a clear message, and a model that
reaches a 1x1 feature map at a BatchNorm layer is named at start-up."""

import pytest
import torch
from torch import nn

from fedvls_flwr.algorithms.batchnorm import (
    TooFewSamplesError,
    batch_bounds,
    feature_map_problem,
    has_batchnorm,
    imagenet_resnet18_smallest_map,
    smallest_batchnorm_map,
)
from fedvls_flwr.algorithms.training import train_local
from fedvls_flwr.config.run_config import ConfigError, RunConfig
from fedvls_flwr.data.node_data import ClientData
from fedvls_flwr.experiments.check import main as check_main
from fedvls_flwr.models import build_model


def _cfg(**kw):
    base = dict(method="fedvls", local_epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=0.0, device="cpu")
    return RunConfig(**{**base, **kw})


def _bn_at_1x1(seed=0):
    """A conv net whose BatchNorm sees a 1x1 map (as resnet18-imagenet's last stage on 28x28)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8, 5),
    )


def _data(n, shape=(1, 4, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    return ClientData(torch.randn(n, *shape, generator=g), torch.arange(n) % 5, 5, None, None)


def _train(model, n, cfg, shape=(1, 4, 4)):
    return train_local(model, _data(n, shape), cfg, device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "n, batch, batchnorm, expected",
    [
        (65, 64, True, [(0, 65)]),  # 65 images, batch 64: one step of 65, not 64 + 1
        (65, 64, False, [(0, 64), (64, 65)]),  # without BatchNorm: unchanged
        (290, 32, True, [(i, i + 32) for i in range(0, 256, 32)] + [(256, 290)]),  # 32 + 2 -> one of 34
        (100, 64, True, [(0, 64), (64, 100)]),  # a last batch of 36 >= 32 stays
        (96, 64, True, [(0, 64), (64, 96)]),  # exactly half a batch stays
        (10, 64, True, [(0, 10)]),  # fewer than a batch: the whole client
        (2, 64, True, [(0, 2)]),
        (1, 64, False, [(0, 1)]),
        (128, 64, True, [(0, 64), (64, 128)]),
    ],
)
def test_batch_bounds(n, batch, batchnorm, expected):
    bounds = batch_bounds(n, batch, batchnorm=batchnorm)
    assert bounds == expected
    assert sum(stop - start for start, stop in bounds) == n  # every sample once per epoch


def test_batchnorm_model_trains_when_n_mod_batch_is_one():
    """A last batch of one sample would fail: 'Expected more than 1 value per channel when training'."""
    res = _train(_bn_at_1x1(), 17, _cfg())  # 8 + 8 + 1
    assert res.steps == 2 * 2 and res.num_examples == 17
    assert all(torch.isfinite(torch.tensor([res.loss, *res.terms.values()])))


def test_resnet18_imagenet_on_28x28_with_a_last_batch_of_one():
    """ResNet-18 (ImageNet stem) on 28x28 images (its last stage runs at 1x1), one epoch of 4 + 1 samples."""
    model = build_model("resnet18-imagenet", (1, 28, 28), 5)
    res = _train(model, 5, _cfg(local_epochs=1, batch_size=4), shape=(1, 28, 28))
    assert res.steps == 1 and all(torch.isfinite(p).all() for p in model.state_dict().values())


def test_models_without_batchnorm_keep_the_short_last_batch():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))
    assert not has_batchnorm(mlp) and has_batchnorm(_bn_at_1x1())
    assert _train(mlp, 17, _cfg()).steps == 2 * 3
    assert _train(mlp, 1, _cfg()).steps == 2  # one sample trains without BatchNorm


def test_a_client_of_one_sample_with_batchnorm_fails_with_a_clear_message():
    with pytest.raises(TooFewSamplesError, match="holds 1 training sample.*BatchNorm.*min-partition-size >= 2"):
        _train(_bn_at_1x1(), 1, _cfg())


@pytest.mark.parametrize(
    "name, shape, smallest",
    [
        ("resnet18-imagenet", (1, 28, 28), (1, 1)),
        ("resnet18-imagenet", (3, 32, 32), (1, 1)),
        ("mobilenetv2", (1, 8, 8), (1, 1)),
        ("mobilenetv2", (3, 32, 32), (4, 4)),
        ("resnet18", (3, 32, 32), (4, 4)),
        ("resnet32", (3, 32, 32), (8, 8)),
        ("cnn", (1, 28, 28), None),
        ("mlp", (1, 8, 8), None),
    ],
)
def test_smallest_batchnorm_map(name, shape, smallest):
    model = build_model(name, shape, 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert smallest_batchnorm_map(model, shape) == smallest
    assert model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("size", [8, 28, 32, 33, 64, 65, 224])
def test_resnet18_imagenet_map_without_torchvision_matches_the_model(size):
    with torch.device("meta"):
        model = build_model("resnet18-imagenet", (3, size, size), 10)
    assert imagenet_resnet18_smallest_map((3, size, size)) == smallest_batchnorm_map(model, (3, size, size))
    assert imagenet_resnet18_smallest_map((3, size, 2 * size)) == smallest_batchnorm_map(model, (3, size, 2 * size))


def test_a_1x1_map_is_a_warning_naming_model_and_input_size_and_batch_size_1_is_refused():
    note = feature_map_problem((1, 1), "resnet18-imagenet", (1, 28, 28), 64)
    assert note is not None and "model 'resnet18-imagenet' reduces 1x28x28 inputs to a 1x1 feature map" in note
    with pytest.raises(ConfigError, match="'batch-size' = 1: model 'resnet18-imagenet' reduces 1x28x28"):
        feature_map_problem((1, 1), "resnet18-imagenet", (1, 28, 28), 1)
    assert feature_map_problem((4, 4), "resnet18", (3, 32, 32), 1) is None
    assert feature_map_problem(None, "mlp", (1, 8, 8), 1) is None


def test_check_command_warns_about_a_1x1_map(capsys):
    assert check_main(["--run-config", "model='mobilenetv2' batch-size=32"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("ok:")
    assert "warning: model 'mobilenetv2' reduces 1x8x8 inputs to a 1x1 feature map" in captured.err
    assert check_main(["--run-config", "model='mobilenetv2' batch-size=1"]) == 2
    assert "'batch-size' = 1: model 'mobilenetv2' reduces 1x8x8" in capsys.readouterr().err
    assert check_main(["--run-config", "model='mlp'"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_check_command_warns_about_resnet18_imagenet_on_fashion_mnist(capsys, tmp_path):
    from tests.tiny_data import write_idx_dataset

    write_idx_dataset(tmp_path / "FashionMNIST" / "raw", n_train=40, n_test=10)
    data = f"dataset='fmnist' data-dir='{tmp_path}'"
    assert check_main(["--run-config", data + " model='resnet18-imagenet'"]) == 0
    assert "warning: model 'resnet18-imagenet' reduces 1x28x28 inputs to a 1x1 feature map" in capsys.readouterr().err
    assert check_main(["--run-config", data + " model='resnet18'"]) == 0  # 28 -> 4x4: no warning
    assert "warning" not in capsys.readouterr().err


def test_serverapp_refuses_batch_size_1_at_a_1x1_map_before_any_round(tmp_path):
    from fedvls_flwr.app.server import run_experiment

    class UntouchedGrid:
        def __getattr__(self, name):
            pytest.fail(f"the grid was used ({name}) before the config was refused")

    cfg = RunConfig(dataset="digits", model="mobilenetv2", batch_size=1, output_dir=str(tmp_path), run_name="r")
    with pytest.raises(ConfigError, match="'batch-size' = 1: model 'mobilenetv2' reduces 1x8x8 inputs"):
        run_experiment(UntouchedGrid(), cfg)
    assert not (tmp_path / "r").exists()  # no run folder written


def test_check_command_warns_about_partitions_of_one_sample_with_a_batchnorm_model(capsys):
    tiny = "partition='shards' shards-per-client=1 train-pool-size=20"  # 19 shards of 20 samples
    assert check_main(["--run-config", f"{tiny} model='resnet32'", "--num-supernodes", "19"]) == 0
    assert "hold fewer than 2 samples: with the BatchNorm model 'resnet32'" in capsys.readouterr().err
    assert check_main(["--run-config", f"{tiny} model='mlp'", "--num-supernodes", "19"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("server_optimizer", ["fedavg", "fedavgm", "fedadam", "fedexp"])
def test_a_batchnorm_models_buffers_keep_their_shapes_through_a_round(server_optimizer):
    """A real BatchNorm model's state, as clients send it and the server averages, steps and
    broadcasts it, keeps every array's shape and dtype: num_batches_tracked stays 0-d int64
    (a shape (1,) passed unnoticed where a test only took int() of it), and the result loads
    back into the model strictly."""
    import numpy as np

    from fedvls_flwr.algorithms.aggregation import Reply, weighted_average
    from fedvls_flwr.algorithms.parts import RunContext
    from fedvls_flwr.algorithms.server_optim import build_server_optimizer
    from fedvls_flwr.app.messages import to_array_record, to_numpy_dict
    from fedvls_flwr.config.run_config import RunConfig

    model = build_model("resnet32", (3, 32, 32), 10)
    assert has_batchnorm(model)
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    tracked = [k for k in state if k.endswith("num_batches_tracked")]
    assert tracked and all(state[k].shape == () and state[k].dtype == np.int64 for k in tracked)
    optimizer = build_server_optimizer({"server-optimizer": server_optimizer}, RunContext(RunConfig()))
    reference = state
    for server_round in (1, 2, 3):
        replies = [Reply(str(i), {k: (v + i + 1 if v.dtype.kind == "f" else v + 5 * server_round).astype(v.dtype)
                                  for k, v in reference.items()}, 10 * (i + 1), {}) for i in range(2)]
        new = optimizer.step(server_round, reference, weighted_average(replies, reference), replies)
        reference = to_numpy_dict(to_array_record(new))   # what the next round broadcasts
        for key, value in state.items():
            assert reference[key].shape == value.shape, (server_round, key, reference[key].shape)
            assert reference[key].dtype == value.dtype, (server_round, key)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in reference.items()}, strict=True)
    assert all(model.state_dict()[k].shape == torch.Size([]) for k in tracked)
