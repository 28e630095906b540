"""fedvls-flwr: FedVLS and its baselines as a Flower app.

The subpackages follow a run's data flow; each imports only the ones listed before it:
``config`` (settings, method registry, RunConfig) -> ``data`` (datasets, partitions, node
data) -> ``models`` -> ``algorithms`` (objectives, local and server optimizers, the training
loop, aggregation) -> ``app`` (the Flower side: strategy, server, client, run folders) ->
``ops`` (operating Flower and Ray from outside: launcher, processes, the in-process engine) ->
``experiments`` (check, sweeps, reports) -> ``deploy`` (certificates, fence, deployment tools).
``cli`` is the ``fedvls`` command.
"""

import os

# cuBLAS's workspace for deterministic runs (fedvls_flwr.algorithms.device.CUBLAS_WORKSPACE), set
# in every process that runs the app's code before it can do any CUDA work: torch reads
# CUBLAS_WORKSPACE_CONFIG once, at the process's first cuBLAS call, and keeps both the workspace
# size and whether deterministic mode may use cuBLAS. Set only when a ``deterministic = true``
# run started, it came too late in a process that had multiplied on a GPU before (a kept client
# worker or sweep worker after a ``false`` run, the server, a test process): that run raised at
# its first matrix product. ``:4096:8`` (32 MiB) is torch's own default workspace on Hopper and
# newer GPUs and more than its default on older ones (about 8 MiB); a user's own value stands.
# Processes started from here (Ray, a SuperLink, client workers) inherit it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
