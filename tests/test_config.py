"""Run-config parsing: defaults match pyproject, bad values fail with a precise message."""

import tomllib
from pathlib import Path

import pytest

from fedvls_flwr.config.run_config import SETTINGS, ConfigError, RunConfig, parse_run_config, resolve_path

ROOT = Path(__file__).resolve().parents[1]


def pyproject_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_defaults_are_the_runconfig_defaults():
    raw = pyproject_config()
    assert raw == RunConfig().to_flower()
    assert parse_run_config(raw) == RunConfig()


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"method": "fedfoo"}, "'method' = 'fedfoo' is not allowed; choose one of: fedavg, fedprox, moon"),
        ({"dataset": "imagenet"}, "'dataset' = 'imagenet' is not allowed"),
        ({"partition": "label"}, "'partition' = 'label'"),
        ({"dirichlet-beta": 0.0}, "'dirichlet-beta' = 0.0: must be > 0"),
        ({"fraction-train": 0.0}, "'fraction-train' = 0.0: must be in (0, 1]"),
        ({"fraction-train": 1.5}, "'fraction-train' = 1.5"),
        ({"local-epochs": 0}, "'local-epochs' = 0: must be >= 1"),
        ({"local-epochs": 1.5}, "'local-epochs' = 1.5: expected an integer"),
        ({"lr": -0.1}, "'lr' = -0.1: must be > 0"),
        ({"lr": "fast"}, "'lr' = 'fast': expected a number"),
        ({"momentum": 1.0}, "'momentum' = 1.0"),
        ({"use-dis": "maybe"}, "'use-dis' = 'maybe': expected true or false"),
        ({"teacher-mode": "frozen"}, "'teacher-mode' = 'frozen'"),
        ({"fedntd-tau": 0}, "'fedntd-tau' = 0"),
        ({"run-name": "a/b"}, "'run-name' = 'a/b'"),
        ({"lamda-dis": 0.1}, "unknown run config key 'lamda-dis'"),
        ({"lambda_dis": 0.1}, "did you mean 'lambda-dis'"),
    ],
)
def test_invalid_values_name_key_value_and_rule(override, fragment):
    with pytest.raises(ConfigError) as err:
        parse_run_config({**pyproject_config(), **override})
    assert fragment in str(err.value)


def test_round_config_with_extra_keys_parses_non_strict():
    raw = {**RunConfig(method="fedntd").to_flower(), "server-round": 3}
    assert parse_run_config(raw, strict=False).method == "fedntd"
    with pytest.raises(ConfigError):
        parse_run_config(raw)


def test_ints_are_accepted_for_floats_and_strings_for_bools():
    cfg = parse_run_config({"lr": 1, "use-logit": "false"})
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.use_logit is False


def test_paths(tmp_path, monkeypatch):
    assert resolve_path(str(tmp_path)) == tmp_path
    monkeypatch.setenv("FEDVLS_BASE_DIR", str(tmp_path))
    assert resolve_path("runs") == tmp_path / "runs"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_path("~/x") == tmp_path / "home" / "x"


FLOAT_KEYS = sorted(k for k, v in RunConfig().to_flower().items() if isinstance(v, float))


def test_every_float_key_is_covered():
    # the float settings a typo or an inf could hit: lr, momentum, weight decay, lambdas, taus, betas, timeouts, ...
    assert {"lr", "momentum", "weight-decay", "lambda-dis", "fedlc-tau", "fedntd-tau", "fedntd-beta",
            "dirichlet-beta", "logit-weight", "paper-logit-weight", "round-timeout", "fraction-train",
            "min-fit-fraction", "synthetic-alpha", "synthetic-beta"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_non_finite_floats_are_rejected(key, value):
    with pytest.raises(ConfigError) as err:
        parse_run_config({key: value})
    assert f"run config '{key}' = {value!r}: must be a finite number" in str(err.value)


@pytest.mark.parametrize(
    "key, value, meant",
    [
        ("method", "FedVLS", "fedvls"),            # case first
        ("method", "fedvsl", "fedvls"),            # then edits (two letters swapped)
        ("dataset", "fminst", "fmnist"),
        ("dataset", "MNIST10K", "mnist10k"),
        ("model", "resnet-18", "resnet18"),
        ("partition", "dirchlet", "dirichlet"),
        ("local-optimizer", "sdg", "sgd"),
        ("server-optimizer", "FedAdam", "fedadam"),
        ("evaluation", "sever", "server"),
        ("tracking", "tensorbord", "tensorboard"),
        ("device", "CUDA", "cuda"),
        ("device", "gpu", "cuda"),                 # a synonym before a near spelling ('cpu')
    ],
)
def test_a_refused_choice_suggests_the_closest_allowed_value(key, value, meant):
    with pytest.raises(ConfigError) as err:
        parse_run_config({key: value})
    assert f"run config '{key}' = {value!r} is not allowed (did you mean '{meant}'?); choose one of: " in str(err.value)


def test_a_choice_far_from_every_allowed_value_gets_no_guess():
    with pytest.raises(ConfigError) as err:
        parse_run_config({"dataset": "svhn"})
    assert "did you mean" not in str(err.value) and "choose one of: " in str(err.value)


def test_every_setting_with_choices_suggests_through_the_one_helper():
    """A setting declared with choices (a new method's included) gets the hint with no code of its own:
    each allowed value, upper-cased, is refused with that value suggested."""
    from fedvls_flwr.config.run_config import SETTINGS

    for setting in (s for s in SETTINGS if s.allowed()):
        for value in setting.allowed():
            if value.upper() == value:
                continue
            with pytest.raises(ConfigError) as err:
                setting.validate(value.upper())
            assert f"(did you mean '{value}'?)" in str(err.value), (setting.key, value)


def test_edit_distance_counts_edits_and_swaps():
    from fedvls_flwr.config.settings import edit_distance

    assert [edit_distance(a, b) for a, b in [("", "abc"), ("abc", "abc"), ("fminst", "fmnist"), ("kitten", "sitting"),
                                             ("ab", "ba"), ("abc", "")]] == [3, 0, 1, 3, 1, 3]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ({"seed": -1}, "'seed' = -1: must be >= 0"),
        ({"seed": float("inf")}, "'seed' = inf: expected an integer"),  # was an OverflowError
        ({"local-epochs": float("nan")}, "'local-epochs' = nan: expected an integer"),
        ({"num-server-round": 3}, "did you mean 'num-server-rounds'?"),
        ({"lamda-dis": 0.1}, "did you mean 'lambda-dis'?"),
        ({"datset": "digits"}, "did you mean 'dataset'?"),
        ({"momentun": 0.5}, "did you mean 'momentum'?"),
        ({"learning-rate": 0.1}, "did you mean 'lr'?"),
        ({"num-supernodes": 10}, "'num-supernodes' is a federation setting"),
    ],
)
def test_seed_integers_and_near_miss_keys(override, fragment):
    with pytest.raises(ConfigError) as err:
        parse_run_config(override)
    assert fragment in str(err.value)


def test_to_flower_is_a_new_dict_each_time_and_follows_replace():
    cfg = parse_run_config({"seed": 3})
    first = cfg.to_flower()
    first["seed"] = 99  # the caller's own dict: the config and its next to_flower are unchanged
    assert cfg.to_flower()["seed"] == 3 == cfg.seed
    assert cfg.replace(seed=5).to_flower()["seed"] == 5
    assert cfg.to_flower() == {s.key: getattr(cfg, s.name) for s in SETTINGS}
