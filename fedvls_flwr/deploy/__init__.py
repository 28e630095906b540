"""Real deployments: certificates and keys, the nginx fence, the one-machine launcher, the round-time breakdown.

Imports ``config``, ``ops`` and ``experiments.check``; never torch (an operator's machine needs none).
"""
