"""Every preset in conf/ loads and validates (no SuperLink is started)."""

import tomllib
from pathlib import Path

import pytest

from fedvls_flwr.config import parse_run_config
from fedvls_flwr.sweep import PresetError, load_preset

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.name)
def test_yaml_presets_validate(path):
    preset = load_preset(path)
    assert preset.runs, f"{path.name} defines no run"
    names = [r.get("run-name") for r in preset.runs]
    assert len(names) == len(preset.runs)


@pytest.mark.parametrize("path", sorted(CONF.glob("*.toml")), ids=lambda p: p.name)
def test_toml_run_configs_validate(path):
    parse_run_config(tomllib.loads(path.read_text()))


def test_authors_preset_is_what_spec_says():
    cfg = parse_run_config(tomllib.loads((CONF / "fedvls-authors.toml").read_text()))
    assert (cfg.method, cfg.weight_decay, cfg.teacher_mode, cfg.logit_weight) == ("fedvls", 0.0, "train", 0.005)


def test_bad_preset_fails_before_anything_starts(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: {dataset: digits}\ngrid: {method: [fedavg, fedfoo]}\n")
    with pytest.raises(PresetError, match="'method' = 'fedfoo' is not allowed"):
        load_preset(bad)


@pytest.mark.parametrize(
    "base, message",
    [
        ("{dataset: mnist10k, data-dir: /nonexistent}", "/nonexistent"),
        ("{dataset: digits, partition: shards, shards-per-client: 500}", "shards_per_client=500"),
    ],
)
def test_missing_data_or_impossible_split_fails_before_any_superlink(tmp_path, base, message, monkeypatch):
    from fedvls_flwr import sweep

    monkeypatch.setattr(sweep.LocalSuperLink, "start", lambda *a, **k: pytest.fail("a SuperLink was started"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"base: {base}\ngrid: {{method: [fedavg]}}\n")
    with pytest.raises(PresetError, match=message):
        sweep.run_preset(load_preset(bad), tmp_path / "out", report=False)


def test_sweep_reuses_identical_finished_runs_and_refuses_a_folder_with_other_settings(tmp_path):
    """A planned run that finished under another name is not run again (also when that run
    was made by a version that did not know some keys yet: they ran at their defaults); a
    folder whose finished run differs from what is planned for it is an error."""
    import json

    from fedvls_flwr import sweep
    from fedvls_flwr.config import RunConfig

    out = tmp_path / "out"
    old = out / "made-by-an-older-version"
    old.mkdir(parents=True)
    config = {k: v for k, v in RunConfig(dataset="digits", num_server_rounds=1).to_flower().items()
              if k not in ("server-optimizer", "local-optimizer")}  # keys that version did not have
    identity = {"config": {k: v for k, v in config.items() if k not in sweep.NON_IDENTITY_KEYS}, "num-supernodes": 3}
    (old / sweep.RUN_FILE).write_text(json.dumps({"identity": identity}))
    (old / "summary.json").write_text(json.dumps({"status": "completed", "config": config}))
    preset_path = tmp_path / "p.yaml"
    preset_path.write_text("base: {dataset: digits, num-server-rounds: 1}\ngrid: {method: [fedvls]}\n"
                           "federation: {num-supernodes: 3}\n")
    result = sweep.run_preset(sweep.load_preset(preset_path), out, report=False)
    assert list(result["statuses"].values()) == ["skipped (the same run finished as made-by-an-older-version)"]
    # the planned run's own folder holding a different finished run
    name = sweep.load_preset(preset_path).runs[0]["run-name"]
    (out / name).mkdir()
    (out / name / "summary.json").write_text(json.dumps({"status": "completed", "config": {**config, "lr": 0.5}}))
    with pytest.raises(PresetError, match="other settings than planned for it \\(lr\\)"):
        sweep.run_preset(sweep.load_preset(preset_path), out, report=False)
