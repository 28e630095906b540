"""The method registry, the run config, pyproject and the objectives agree."""

import dataclasses
import math
import tomllib
from pathlib import Path

import pytest
import torch

from fedvls_flwr.algorithms.objectives.base import Objective, objective_for
from fedvls_flwr.config.registry import METHODS, get_method, method_names, method_settings, owners
from fedvls_flwr.config.run_config import SETTINGS, RunConfig, parse_run_config
from fedvls_flwr.data.node_data import ClientData

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_is_in_pyproject_with_its_declared_default():
    raw = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert raw == {s.key: s.default for s in SETTINGS}
    assert {type(raw[s.key]) for s in SETTINGS if s.kind is float} == {float}  # 1.0, not 1


@pytest.mark.parametrize("method", method_names())
def test_registered_objective_exists_and_matches_its_declaration(method):
    spec = get_method(method)
    cls = spec.load()
    assert issubclass(cls, Objective) and cls.name == method
    two_vacant = torch.tensor([5, 0, 3, 0, 7])
    objective = objective_for(method, two_vacant)
    assert objective.settings == spec.defaults()  # exactly its own keys, at their defaults


def test_a_parts_settings_are_its_own_keys_from_the_validated_config():
    cfg = parse_run_config({"method": "fedlc", "fedlc-tau": 0.1, "lambda-dis": 0.7})
    assert get_method(cfg.method).own_settings(cfg.to_flower()) == {"fedlc-tau": 0.1, "fedlc-form": "standard"}
    assert get_method("fedavg").own_settings(RunConfig(method="fedavg").to_flower()) == {}


def test_a_methods_key_is_validated_once_with_one_spelling():
    with pytest.raises(ValueError, match="'fedntd-tau' = 0.0: must be > 0"):
        parse_run_config({"fedntd-tau": 0.0})
    with pytest.raises(ValueError, match="'fedntd-tau' = 0.0: must be > 0"):
        objective_for("fedntd", torch.tensor([1, 2]), {"fedntd-tau": 0.0})


def test_shared_settings_are_one_declaration():
    assert len({s.key for s in method_settings()}) == len(method_settings())
    assert {name for _, name in owners("teacher-mode")} == {"fedntd", "fedlmd", "fedvls", "fedvls-paper"}
    assert owners("sam-rho") == (("local-optimizer", "sam"), ("local-optimizer", "fedgf"))
    assert owners("lr") == ()
    assert [m.name for m in METHODS] == list(method_names())


def test_what_derives_from_the_declarations_is_current():
    """RunConfig's fields, pyproject's [tool.flwr.app.config] and docs/configuration.md are
    generated (`fedvls config --write`); each lists every key with its declared default."""
    from fedvls_flwr.config import generate

    assert generate.stale(ROOT) == [], "run `fedvls config --write`"
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    assert list(fields) == [s.name for s in generate.all_settings()]
    for s in SETTINGS:
        assert fields[s.name].default == s.default and fields[s.name].type == s.kind.__name__
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert all(f"| `{s.key}` | `" in page for s in SETTINGS)


def test_a_stale_generated_file_is_named(tmp_path):
    from fedvls_flwr.config import generate

    for rel in generate.generated(ROOT):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    assert generate.stale(tmp_path) == []
    pyproject = tmp_path / generate.PYPROJECT_FILE
    pyproject.write_text(pyproject.read_text().replace("lr = 0.01", "lr = 0.02"))
    assert generate.stale(tmp_path) == [generate.PYPROJECT_FILE]
    assert generate.main(["--check", "--project", str(tmp_path)]) == 1
    assert generate.main(["--write", "--project", str(tmp_path)]) == 0 and generate.stale(tmp_path) == []
    assert "lr = 0.01" in pyproject.read_text() and "[tool.pytest.ini_options]" in pyproject.read_text()


@pytest.mark.parametrize("local", ["sgd", "sam", "fedgf"])
@pytest.mark.parametrize("method", method_names())
def test_every_method_trains_with_every_local_optimizer_and_optimizer_state(method, local):
    from fedvls_flwr.algorithms.parts import ClientState
    from fedvls_flwr.algorithms.run_model import build_run_model
    from fedvls_flwr.algorithms.training import train_local

    g = torch.Generator().manual_seed(0)
    y = torch.tensor([0, 1, 1, 0, 0, 1, 3, 0] * 3)  # classes 2 vacant, 3 rare
    x = torch.randn(len(y), 1, 4, 4, generator=g) + y.view(-1, 1, 1, 1).float()
    for mode in ("fresh", "carry"):
        cfg = RunConfig(method=method, local_optimizer=local, optimizer_state=mode, local_epochs=1, batch_size=8,
                        moon_projection_dim=8, device="cpu")
        torch.manual_seed(0)
        model = build_run_model(cfg, (1, 4, 4), 4)
        state = ClientState()
        for _ in range(2):  # a second round sees the state of the first
            res = train_local(model, ClientData(x, y, 4, None, None), cfg, device=torch.device("cpu"), generator=g, state=state)
            assert all(math.isfinite(v) for v in res.terms.values()), (method, local, mode, res.terms)
