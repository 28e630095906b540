"""Flower's ClientApp for ``flwr run .`` (pyproject: ``clientapp = "client_app:app"``).

The app is :mod:`fedvls_flwr.app.client_app`; this file, in the app folder and in every FAB
built from it, only names it. It is not installed with the package (see server_app.py).
"""

from fedvls_flwr.app.client_app import app

__all__ = ["app"]  # Flower's check of "client_app:app" reads __all__ (flwr.supercore.object_ref)
