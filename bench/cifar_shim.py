"""Generated CIFAR-10 files that every process of a benchmark accepts.

torchvision checks the md5 sums of the CIFAR archives' files, and generated files
(``tests/tiny_data.write_tiny_cifar10``) have other sums. The benchmarks' runs load the data in
many processes - this one, the in-process engine's client workers, Flower's and Ray's - so the
sums are passed in the environment (``MD5_ENV``) and a ``sitecustomize`` module on
``PYTHONPATH`` (:func:`cifar_env`) points torchvision's CIFAR classes at them when
``torchvision.datasets.cifar`` is first imported. For benchmarks only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MD5_ENV = "FEDVLS_BENCH_CIFAR_MD5"

SITECUSTOMIZE = f'''\
"""Benchmark-only (bench/cifar_shim.py): torchvision accepts the generated CIFAR files."""
import importlib.abc
import json
import os
import sys

_SUMS = os.environ.get("{MD5_ENV}")


def _patch(module):
    for name, sums in json.loads(_SUMS).items():
        cls = getattr(module, name)
        cls.train_list = [[n, sums[n]] for n, _ in cls.train_list]
        cls.test_list = [[n, sums[n]] for n, _ in cls.test_list]
        cls.meta = {{**cls.meta, "md5": sums[cls.meta["filename"]]}}


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torchvision.datasets.cifar":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


if _SUMS:
    import importlib.util

    sys.meta_path.insert(0, _Hook())
'''


def cifar_env(folder: Path, sums: dict[str, str]) -> dict[str, str]:
    """The environment (to merge into ``os.environ`` before any worker or Flower process
    starts) under which every process accepts the generated CIFAR-10 files with ``sums``; this
    process is patched at once. The shim goes into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {MD5_ENV: json.dumps({"CIFAR10": sums}),
           "PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)}
    import torchvision.datasets as tvd

    cls = tvd.CIFAR10
    cls.train_list = [[n, sums[n]] for n, _ in cls.train_list]
    cls.test_list = [[n, sums[n]] for n, _ in cls.test_list]
    cls.meta = {**cls.meta, "md5": sums[cls.meta["filename"]]}
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # the client workers' import path is this process's
    return env
