"""What clients and server compute: local objectives and optimizers, the training loop, aggregation, server steps.

Imports ``config``, ``data`` and ``models``, numpy and torch; never Flower or Ray (the core runs without them).
"""
