"""Datasets as in-memory tensors, label-skew partitions, a node's own data, caches and batched augmentation.

Imports ``config``, numpy and torch; never Flower or Ray.
"""
