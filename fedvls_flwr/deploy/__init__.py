"""Real deployments: certificates and keys, the nginx fence, the one-machine launcher, the round-time breakdown.

Imports ``config``, ``data.node_config``, ``app.events``, ``ops`` and ``experiments.check``; never torch
(an operator's machine needs none).
"""
