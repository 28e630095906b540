"""The error for a dataset that is missing or unusable (torch-free: launchers raise it too)."""

from __future__ import annotations


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing (or unusable); the message says how to get them."""
