"""fedvls-flwr: FedVLS and its baselines as a Flower app.

The subpackages follow a run's data flow; each imports only the ones listed before it:
``config`` (settings, method registry, RunConfig) -> ``data`` (datasets, partitions, node
data) -> ``models`` -> ``algorithms`` (objectives, local and server optimizers, the training
loop, aggregation) -> ``app`` (the Flower side: strategy, server, client, run folders) ->
``ops`` (operating Flower and Ray from outside: launcher, processes, the in-process engine) ->
``experiments`` (check, sweeps, reports) -> ``deploy`` (certificates, fence, deployment tools).
``cli`` is the ``fedvls`` command.
"""
