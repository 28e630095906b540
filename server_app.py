"""Flower's ServerApp for ``flwr run .`` (pyproject: ``serverapp = "server_app:app"``).

The app is :mod:`fedvls_flwr.app.server_app`; this file, in the app folder and in every FAB
built from it, only names it. It is not installed with the package (pip would put a module
called ``server_app`` at the top level of site-packages, where any other Flower app's would clash).
"""

from fedvls_flwr.app.server_app import app, main

__all__ = ["app", "main"]  # Flower's check of "server_app:app" reads __all__ (flwr.supercore.object_ref)
