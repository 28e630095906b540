"""What a user installs: the wheel holds every module of the package, pyproject declares
ranges (a GPU host keeps its own torch) while the lock pins the tested stack, and the app's
metadata passes Flower's own fab-format-version 1 rules."""

import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from fedvls_flwr.deploy import wheelhouse
from fedvls_flwr.deploy.wheelhouse import build_project_wheel

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_wheel_holds_every_module_of_the_package_and_claims_only_its_name(tmp_path):
    """Not server_app.py and client_app.py at the top level of site-packages too, where any
    other Flower app's entry points of the same (Flower's template) names would clash."""
    wheel = build_project_wheel(tmp_path, "--no-build-isolation")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "fedvls_flwr").rglob("*.py")}
    assert sources <= names, f"missing from the wheel: {sorted(sources - names)}"
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"fedvls_flwr"}, top_level


def test_the_app_folders_entry_points_only_name_the_packages_apps():
    """`flwr run .` loads server_app:app / client_app:app from the app folder (kept, as Flower's
    layout asks); they are the package's objects, and Flower's own check of the reference
    (the one `flwr run` and `flwr build` apply) accepts the re-export."""
    from flwr.supercore.object_ref import validate

    import client_app
    import server_app
    from fedvls_flwr.app import client_app as package_client_app
    from fedvls_flwr.app import server_app as package_server_app

    assert server_app.app is package_server_app.app and client_app.app is package_client_app.app
    components = PYPROJECT["tool"]["flwr"]["app"]["components"]
    for ref in (components["serverapp"], components["clientapp"], "fedvls_flwr.app.server_app:app",
                "fedvls_flwr.app.client_app:app"):
        assert validate(ref, check_module=True, project_dir=ROOT) == (True, None), ref


def test_the_wheelhouse_leaves_out_the_hosts_torch_and_pins_the_tested_versions(tmp_path):
    reqs = [Requirement(r).name for r in wheelhouse.requirements()]
    assert "torch" not in reqs and "torchvision" not in reqs and "flwr" in reqs
    lock = wheelhouse.lock_without_host_packages(ROOT / "constraints-py311.txt", tmp_path).read_text()
    assert "flwr==1.41.0" in lock and "torch==" not in lock and "nvidia-" not in lock.lower()
    (cmd,) = wheelhouse.download_commands(tmp_path, "3.12", ["manylinux_2_28_x86_64"], tmp_path / "c.txt", None)
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in cmd
    with_tv = wheelhouse.download_commands(tmp_path, "3.12", ["manylinux_2_28_x86_64"], None, "0.26.0")
    assert with_tv[-1][-2:] == ["--no-deps", "torchvision==0.26.0"]


def _requirements() -> dict[str, Requirement]:
    return {(r := Requirement(text)).name: r for text in PYPROJECT["project"]["dependencies"]}


def test_project_declares_ranges_and_the_lock_pins_versions_inside_them():
    reqs = _requirements()
    for name in ("torch", "torchvision", "flwr"):
        assert not any(s.operator == "==" for s in reqs[name].specifier), f"{name}: a range, not a pin"
    python = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert all(python.contains(v) for v in ("3.11", "3.12", "3.13")), python
    pins = dict(
        line.split("==", 1) for line in (ROOT / "constraints-py311.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    for name, req in reqs.items():
        key = next((k for k in pins if k.lower().replace("_", "-") == name.lower()), None)
        assert key is not None, f"{name} is not pinned in constraints-py311.txt"
        assert req.specifier.contains(pins[key], prereleases=True), f"{name}=={pins[key]} outside {req.specifier}"


def test_app_metadata_passes_flowers_fab_format_rules():
    from flwr.supercore.fab_format_version import normalize_and_validate_fab_format

    meta = normalize_and_validate_fab_format(PYPROJECT)
    assert meta.fab_format_version == 1
    assert (ROOT / PYPROJECT["project"]["license"]["file"]).is_file()


def test_fedvls_version_names_the_package_and_what_it_runs_on(capsys):
    import platform

    from fedvls_flwr import cli

    declared = PYPROJECT["project"]["version"]
    assert cli.main(["--version"]) == 0
    said = capsys.readouterr().out.strip()
    assert said.startswith(f"fedvls-flwr {declared} (flwr 1.41.") and f"Python {platform.python_version()})" in said
    assert cli.main(["-V"]) == 0 and capsys.readouterr().out.strip() == said


def test_the_app_folder_of_an_installed_package_is_the_projects_app_naming_the_installed_apps(tmp_path):
    """What an installed package (no checkout) submits to `flwr run` (a sweep's --engine flwr):
    the project's run-config defaults and metadata, components naming the package's apps, and
    Flower's own FAB rules pass."""
    from flwr.supercore.fab_format_version import normalize_and_validate_fab_format

    from fedvls_flwr.ops.app_folder import COMPONENTS, installed_app_pyproject

    app = tomllib.loads(installed_app_pyproject("0.1.0"))
    assert app["tool"]["flwr"]["app"]["config"] == PYPROJECT["tool"]["flwr"]["app"]["config"]
    assert app["tool"]["flwr"]["app"]["components"] == COMPONENTS
    assert {k: app["project"][k] for k in ("name", "version", "license")} == {
        k: PYPROJECT["project"][k] for k in ("name", "version", "license")}
    assert [r for r in app["project"]["dependencies"] if r.startswith("flwr")] == [
        r for r in PYPROJECT["project"]["dependencies"] if r.startswith("flwr")]
    assert {k: v for k, v in app["tool"]["flwr"]["app"].items() if k not in ("components", "config")} == {
        k: v for k, v in PYPROJECT["tool"]["flwr"]["app"].items() if k not in ("components", "config")}
    assert normalize_and_validate_fab_format(app).fab_format_version == 1
