"""The Flower app folder that ``flwr run`` packs and submits: the project's checkout, or - for an
installed package, which has no checkout - a folder written here that names the installed apps.

``flwr run <folder>`` builds a FAB from the folder's ``pyproject.toml`` (name, version, licence,
the ``flwr`` dependency, ``[tool.flwr.app.components]`` and ``[tool.flwr.app.config]``) and the
SuperLink loads the components from the FAB's folder first, then from the installed packages.
A folder that holds only that pyproject (and the licence it names), with components
``fedvls_flwr.app.server_app:app`` and ``fedvls_flwr.app.client_app:app``, therefore runs the
installed package (docs/contributing.md, "The entry points and the installed package").
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from fedvls_flwr.config.generate import pyproject_section
from fedvls_flwr.ops.launch import PROJECT_DIR

#: The installed apps, as an app folder's components name them.
COMPONENTS = {"serverapp": "fedvls_flwr.app.server_app:app", "clientapp": "fedvls_flwr.app.client_app:app"}


def installed_app_pyproject(version: str) -> str:
    """The pyproject.toml of an app folder for the installed package ``version``: the run config's
    defaults from the declarations (``fedvls config`` prints the same table)."""
    components = "".join(f'{name} = "{ref}"\n' for name, ref in COMPONENTS.items())
    return (
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "fedvls-flwr"\nversion = "{version}"\n'
        'description = "The installed fedvls_flwr package as a Flower app (written by fedvls)"\n'
        'license = { file = "LICENSE" }\ndependencies = ["flwr[simulation]>=1.41,<1.42"]\n\n'
        '[tool.flwr.app]\npublisher = "fedvls-flwr"\nfab-format-version = 1\nflwr-version-target = "1.41.0"\n\n'
        f"[tool.flwr.app.components]\n{components}\n{pyproject_section()}"
    )


def app_folder(scratch: Path) -> Path:
    """The folder ``flwr run`` submits: the checkout this package runs from, else an app folder for
    the installed package written into ``scratch`` (kept: each run's FAB is built from it)."""
    if (PROJECT_DIR / "pyproject.toml").is_file():
        return PROJECT_DIR
    try:
        dist = distribution("fedvls-flwr")
        version = dist.version
        licence = next((f for f in dist.files or [] if f.name in ("LICENSE", "LICENSE.md")), None)
        licence_text = licence.read_text() if licence is not None else None
    except PackageNotFoundError:
        version, licence_text = "0.0.0", None
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "LICENSE").write_text(licence_text or "See the fedvls-flwr package's licence.\n")
    (scratch / "pyproject.toml").write_text(installed_app_pyproject(version))
    return scratch
