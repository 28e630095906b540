"""Run configuration: every setting declared once, the registry that lists the parts' specs, the typed RunConfig.

Imports only the standard library (no torch, no Flower): the ServerApp validates a run before any heavy import.
"""
