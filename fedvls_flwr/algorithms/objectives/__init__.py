"""Local training objectives: one class per method, its spec beside it (``<module>_spec.py``).

``base`` holds the interface and FedAvg's cross-entropy; ``fedvls`` the method; ``fedmr`` and
``baselines`` the others. This ``__init__`` imports nothing, so the torch-free specs can be
imported (by :mod:`fedvls_flwr.config.registry`) without torch.
"""
