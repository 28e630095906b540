"""What clients and server compute: local objectives and optimizers, the training loop, aggregation, server steps.

Imports ``config``, ``data`` and ``models``, numpy and torch; never Flower or Ray (the core runs without them).

Each part's spec sits beside its implementation (``<module>_spec.py``): the registry in the
config floor lists the specs, so a spec is held to that floor's rule - the standard library
and the config modules only - and this ``__init__`` (like each subpackage's that holds a spec)
imports nothing.
"""
