"""Model zoo: shapes, documented parameter counts, trainability, factory errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedvls_flwr.models import MODELS, build_model, count_parameters, default_model

CONV = ("mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32")

# The numbers documented in the fedvls_flwr.models docstring.
PARAMS = {
    ("mlp", (1, 28, 28), 10): 199_210,
    ("mlp", (1, 28, 28), 100): 217_300,
    ("mlp", (1, 8, 8), 10): 55_210,
    ("logreg", (60,), 10): 610,
    ("mobilenetv2", (3, 32, 32), 10): 2_296_922,
    ("mobilenetv2", (3, 32, 32), 100): 2_412_212,
    ("resnet18", (3, 32, 32), 10): 11_173_962,
    ("resnet18", (3, 32, 32), 100): 11_220_132,
    ("resnet18-imagenet", (3, 32, 32), 10): 11_181_642,
    ("resnet18-imagenet", (3, 32, 32), 100): 11_227_812,
    ("resnet32", (3, 32, 32), 10): 464_154,
    ("resnet32", (3, 32, 32), 100): 470_004,
    ("cnn", (1, 28, 28), 10): 21_840,
    ("cnn", (1, 28, 28), 100): 26_430,
}


@pytest.fixture(autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_models_tuple_is_complete():
    assert set(MODELS) == {"mlp", "logreg", "cnn", "mobilenetv2", "resnet18", "resnet18-imagenet", "resnet32"}


@pytest.mark.parametrize("key", sorted(PARAMS, key=str))
def test_parameter_counts_match_docstring(key):
    name, shape, c = key
    assert count_parameters(build_model(name, shape, c)) == PARAMS[key]


def test_parameter_count_documented_in_module_docstring():
    import fedvls_flwr.models as m

    for value in (199_210, 21_840, 26_430, 2_296_922, 2_412_212, 11_173_962, 11_220_132, 11_181_642, 464_154, 470_004):
        assert f"{value:,}" in m.__doc__


def test_count_parameters_ignores_frozen():
    model = build_model("logreg", (60,), 10)
    model[1].bias.requires_grad_(False)
    assert count_parameters(model) == 600


@pytest.mark.parametrize(
    "name,shape,c",
    [("mlp", (1, 28, 28), 10), ("mlp", (1, 8, 8), 10), ("mlp", (3, 32, 32), 100), ("logreg", (60,), 10)],
)
def test_dense_output_shape(name, shape, c):
    model = build_model(name, shape, c)
    assert model(torch.randn(5, *shape)).shape == (5, c)


def test_mlp_structure():
    model = build_model("mlp", (1, 28, 28), 10)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 200), (200, 200), (200, 10)]
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 2


@pytest.mark.parametrize("name", CONV)
@pytest.mark.parametrize("size,c", [(32, 10), (64, 200)])
def test_conv_output_shape(name, size, c):
    model = build_model(name, (3, size, size), c)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, c)
    assert torch.isfinite(out).all()


def test_mobilenetv2_layout():
    model = build_model("mobilenetv2", (3, 32, 32), 10)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    stem = convs[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1) and stem.out_channels == 32
    assert convs[-1].out_channels == 1280 and convs[-1].kernel_size == (1, 1)
    assert model.fc.in_features == 1280
    # Feature map before pooling: 4x4 for 32x32 inputs (three stride-2 stages).
    feats = model.head_conv(model.blocks(model.stem(torch.randn(1, 3, 32, 32))))
    assert feats.shape == (1, 1280, 4, 4)


def test_resnet18_cifar_layout():
    model = build_model("resnet18", (3, 32, 32), 10)
    stem = model.stem[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    assert [len(s) for s in model.stages] == [2, 2, 2, 2]
    assert model.fc.in_features == 512
    imagenet = build_model("resnet18-imagenet", (3, 32, 32), 10)
    assert imagenet.conv1.kernel_size == (7, 7)
    assert any(isinstance(m, nn.MaxPool2d) for m in imagenet.modules())


def test_resnet32_layout():
    model = build_model("resnet32", (3, 32, 32), 10)
    assert [len(s) for s in model.stages] == [5, 5, 5]
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 31  # + the linear head = 32 weighted layers
    assert model.fc.in_features == 64


@pytest.mark.parametrize(
    "name,shape",
    [("mlp", (1, 28, 28)), ("logreg", (60,))] + [(n, (3, 32, 32)) for n in CONV],
)
def test_sgd_steps_lower_the_loss(name, shape):
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    model.train()
    x = torch.randn(8, *shape)
    y = torch.arange(8) % 10
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.train()
    with torch.no_grad():
        final = nn.functional.cross_entropy(model(x), y).item()
    assert final < losses[0]


def test_unknown_model_lists_choices():
    with pytest.raises(ValueError) as err:
        build_model("vgg16", (3, 32, 32), 10)
    for name in MODELS:
        assert name in str(err.value)
    with pytest.raises(ValueError):
        build_model("auto", (3, 32, 32), 10)


def test_conv_model_needs_image_shape():
    with pytest.raises(ValueError):
        build_model("resnet32", (60,), 10)


@pytest.mark.parametrize(
    "dataset,expected",
    [
        ("digits", "mlp"),
        ("mnist", "mlp"),
        ("mnist10k", "mlp"),
        ("cifar10", "mobilenetv2"),
        ("cifar100", "mobilenetv2"),
        ("tinyimagenet", "mobilenetv2"),
        ("synthetic", "logreg"),
    ],
)
def test_default_model(dataset, expected):
    assert default_model(dataset) == expected
    assert default_model(dataset) in MODELS


def test_default_model_unknown_dataset():
    with pytest.raises(ValueError):
        default_model("imagenet")


# -- a network built to hold received weights (algorithms/run_model.build_loaded) ----------------

from fedvls_flwr.algorithms.run_model import build_loaded, build_run_model  # noqa: E402
from fedvls_flwr.config.run_config import parse_run_config  # noqa: E402


def _received(factory):
    """Weights unlike any initialisation: what a client receives."""
    torch.manual_seed(7)
    return {k: (torch.rand_like(v) + 0.5 if k.endswith("running_var") else 0.1 * torch.randn_like(v))
            if v.is_floating_point() else v + 3 for k, v in factory().state_dict().items()}


@pytest.mark.parametrize("name", ["mlp", "logreg", "cnn", "mobilenetv2", "resnet18", "resnet32", "moon"])
def test_build_loaded_holds_exactly_the_received_weights(name):
    """Built without initialisation, the network holds the received tensors bit for bit, as one
    built, initialised and loaded does, and computes the same outputs."""
    if name == "moon":  # a wrapped network (MOON's projection head) built as a run builds it
        cfg = parse_run_config({"dataset": "cifar10", "model": "cnn", "method": "moon"})
        factory = lambda: build_run_model(cfg, (3, 32, 32), 10)  # noqa: E731
        shape = (3, 32, 32)
    else:
        shape = (1, 28, 28) if name in ("mlp", "logreg", "cnn") else (3, 32, 32)
        factory = lambda: build_model(name, shape, 10)  # noqa: E731
    received = _received(factory)
    model = build_loaded(factory, received)
    usual = factory()
    usual.load_state_dict(received, strict=True)
    got = model.state_dict()
    assert got.keys() == received.keys()
    for key, value in received.items():
        assert got[key].device.type == "cpu" and got[key].dtype == value.dtype
        assert torch.equal(got[key], value), key
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(1))
    model.eval(), usual.eval()
    out, ref = model(x), usual(x)
    out, ref = (out[0], ref[0]) if isinstance(out, tuple) else (out, ref)
    assert torch.isfinite(ref).all() and torch.equal(out, ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the network built on the GPU it trains on")
@pytest.mark.parametrize("name", ["resnet18", "moon"])
def test_build_loaded_on_cuda_holds_the_received_weights(name):
    settings = {"model": "cnn", "method": "moon"} if name == "moon" else {"model": name}
    cfg = parse_run_config({"dataset": "cifar10", **settings})
    factory = lambda: build_run_model(cfg, (3, 32, 32), 10)  # noqa: E731
    received = _received(factory)
    model = build_loaded(factory, received, torch.device("cuda"))
    got = model.state_dict()
    assert all(got[k].is_cuda and torch.equal(got[k].cpu(), v) for k, v in received.items())


class _WithConstant(nn.Module):
    """A network with a buffer kept out of its state dict: no received state fills it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("scale", torch.full((2,), 2.0), persistent=False)

    def forward(self, x):
        return self.fc(x) * self.scale


def test_build_loaded_builds_as_usual_where_the_state_does_not_fill_every_tensor():
    received = {k: torch.ones_like(v) for k, v in _WithConstant().state_dict().items()}
    model = build_loaded(_WithConstant, received)
    assert torch.equal(model.scale, torch.full((2,), 2.0))  # initialised, not left as uninitialised memory
    assert torch.equal(model.fc.weight, torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="Missing key"):
        build_loaded(lambda: nn.Linear(3, 2), {"weight": torch.ones(2, 3)})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        build_loaded(lambda: nn.Linear(3, 2), {**nn.Linear(3, 2).state_dict(), "extra": torch.ones(1)})
    with pytest.raises(RuntimeError, match="size mismatch"):
        build_loaded(lambda: nn.Linear(3, 2), {"weight": torch.ones(4, 3), "bias": torch.ones(4)})


def test_build_loaded_builds_as_usual_a_network_that_reads_values_while_built():
    """A constructor that reads a value (which the meta device has not) is built as usual."""
    def reads_a_value():
        probe = torch.ones(1)
        return nn.Linear(3, int(probe.item()) + 1)

    received = {"weight": torch.full((2, 3), 5.0), "bias": torch.zeros(2)}
    model = build_loaded(reads_a_value, received)
    assert torch.equal(model.weight, received["weight"])


@pytest.mark.parametrize("name", ["mlp", "resnet18", "mobilenetv2", "moon"])
def test_build_loaded_takes_handed_over_tensors_as_its_own(name):
    """Given ``take``, the network holds the handed-over tensors themselves (no copy), with the
    values and outputs of one built, initialised and loaded as usual, and trains them in place."""
    if name == "moon":
        cfg = parse_run_config({"dataset": "cifar10", "model": "cnn", "method": "moon"})
        factory = lambda: build_run_model(cfg, (3, 32, 32), 10)  # noqa: E731
        shape = (3, 32, 32)
    else:
        shape = (1, 28, 28) if name == "mlp" else (3, 32, 32)
        factory = lambda: build_model(name, shape, 10)  # noqa: E731
    received = _received(factory)
    handed = {k: v.clone() for k, v in received.items()}
    model = build_loaded(factory, handed, take=True)
    usual = factory()
    usual.load_state_dict(received, strict=True)
    got = model.state_dict()
    assert got.keys() == received.keys()
    for key, value in received.items():
        assert got[key].data_ptr() == handed[key].data_ptr(), key  # the very tensor
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    assert all(p.requires_grad for p in model.parameters())
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(1))
    model.eval(), usual.eval()
    out, ref = model(x), usual(x)
    out, ref = (out[0], ref[0]) if isinstance(out, tuple) else (out, ref)
    assert torch.equal(out, ref)


def test_build_loaded_copies_what_it_cannot_take_as_it_is():
    """A handed-over tensor of another dtype is cast into the network's (assigning it would change
    the network's dtype); tied weights stay tied (assigning would give each name its own tensor);
    a state that does not fit is refused as without ``take``."""
    double = {k: v.double() for k, v in nn.Linear(3, 2).state_dict().items()}
    model = build_loaded(lambda: nn.Linear(3, 2), double, take=True)
    assert model.weight.dtype == torch.float32 and torch.equal(model.weight, double["weight"].float())

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False)
            self.b.weight = self.a.weight

    state = {"a.weight": torch.full((2, 2), 3.0), "b.weight": torch.full((2, 2), 3.0)}
    tied = build_loaded(Tied, dict(state), take=True)
    assert tied.a.weight is tied.b.weight and torch.equal(tied.a.weight, state["a.weight"])
    with pytest.raises(RuntimeError, match="size mismatch"):
        build_loaded(lambda: nn.Linear(3, 2), {"weight": torch.ones(4, 3), "bias": torch.ones(4)}, take=True)
    with pytest.raises(RuntimeError, match="Missing key"):
        build_loaded(lambda: nn.Linear(3, 2), {"weight": torch.ones(2, 3)}, take=True)


def test_reply_weights_are_c_contiguous_whatever_the_networks_layout():
    """A channels-last network's weights leave the client in the usual order (the reply's encoder
    copies anything else through np.save, about 25 ms a ResNet-18 client), with their values."""
    from fedvls_flwr.algorithms.rounds import host_weights
    from fedvls_flwr.app.messages import array_view, numpy_record

    model = build_model("cnn", (3, 16, 16), 10).to(memory_format=torch.channels_last)
    assert any(not v.is_contiguous() for v in model.state_dict().values())
    weights = host_weights(model)
    assert all(v.is_contiguous() and v.device.type == "cpu" for v in weights.values())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    record = numpy_record({k: v.numpy() for k, v in weights.items()})
    assert all(array_view(arr) is not None for arr in record.values())  # the encoder's own path, one copy
