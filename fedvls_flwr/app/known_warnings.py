"""Warnings the app's own design causes in every run, which a user can do nothing about, kept
out of the log - each by its exact text, so every other warning of the same library still shows.

* Ray's ``FutureWarning`` at ``ray.init`` that it "will no longer override accelerator visible
  devices env var if num_gpus=0": the only switch that silences it,
  ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0``, would also change what it warns about (clients that
  ask Ray for no GPU would see every GPU, which the app's device check and its documented
  ``client-resources-num-gpus`` rely on not happening), so the app keeps Ray's current behaviour
  and ignores exactly this one warning. Flower loads the ClientApp before it starts Ray
  (``flwr/server/superlink/fleet/vce/vce_api.py``, ``start_vce``: ``app_fn()`` before ``run_api``
  builds the Ray backend), so the filter is in place when Ray warns.
"""

from __future__ import annotations

import re
import warnings

#: The start of Ray's message (ray/_private/worker.py, ``init``), as it is matched.
RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices env var"
#: The module Ray's warning is attributed to.
RAY_WARNING_MODULE = "ray._private.worker"


def hide_rays_accelerator_tip() -> None:
    """Ignore Ray's FutureWarning about its future accelerator default, and only it."""
    warnings.filterwarnings("ignore", message=re.escape(RAY_ACCELERATOR_TIP), category=FutureWarning,
                            module=re.escape(RAY_WARNING_MODULE))
