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
* Flower's ``Manually terminating ClientAppActor`` WARNING, which every Ray actor logs when the
  simulation ends its actors at the end of every run (``flwr/simulation/ray_transport/
  ray_actor.py``): the end of a run, not a problem. Filtered by its exact text in the actors
  (:func:`quiet_in_ray_actors`); every other line of Flower's still shows.

* The empty ``INFO :`` line Flower's simulation (and SuperLink-run ServerApp) process logs as its
  exit message when a run ends well (``flwr/supercore/exit/exit.py``: an empty message for exit
  code 0): dropped in the ServerApp's process, where the app is loaded
  (:func:`drop_empty_exit_line`); Flower's exit message of a failed run has text and still shows.

In a Ray actor the app's own per-process line on where a node's data came from (``node data:``)
goes to DEBUG too: Ray's log deduplication holds such similar lines back and prints them at the
end of the run, after the run's last line, where they only confuse.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings

#: The start of Ray's message (ray/_private/worker.py, ``init``), as it is matched.
RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator visible devices env var"
#: The module Ray's warning is attributed to.
RAY_WARNING_MODULE = "ray._private.worker"


def hide_rays_accelerator_tip() -> None:
    """Ignore Ray's FutureWarning about its future accelerator default, and only it."""
    warnings.filterwarnings("ignore", message=re.escape(RAY_ACCELERATOR_TIP), category=FutureWarning,
                            module=re.escape(RAY_WARNING_MODULE))


#: Flower's message (its format string) when it ends a simulation's client actor.
ACTOR_TERMINATION = "Manually terminating %s"


class _DropActorTermination(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != ACTOR_TERMINATION


def in_ray_actor() -> bool:
    """Whether this process is a Ray actor (a simulation's ClientApp process); Ray is looked up,
    not imported: a process that never loaded it is no Ray actor."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized()) and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001 - a Ray that cannot say: treat as not an actor
        return False


def quiet_in_ray_actors() -> None:
    """In a Ray actor: drop Flower's actor-termination warning, and the node-data lines to DEBUG
    (see the module docstring). Elsewhere nothing changes."""
    if not in_ray_actor():
        return
    from fedvls_flwr.data.node_data import node_data_lines_at_debug

    node_data_lines_at_debug()
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropActorTermination) for f in logger.filters):
        logger.addFilter(_DropActorTermination())


class _DropEmptyInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg == "" and not record.args)


def drop_empty_exit_line() -> None:
    """Drop Flower's empty exit message of a run that ended well (see the module docstring)."""
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropEmptyInfo) for f in logger.filters):
        logger.addFilter(_DropEmptyInfo())
