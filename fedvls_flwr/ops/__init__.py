"""Operating Flower and Ray from outside the apps: local SuperLinks and SuperNodes, the Flower
CLI, process control by PID, Ray clusters we start, and the in-process engine that drives the
apps without any of them.

Imports ``config`` and ``app`` (the apps the in-process engine drives); never ``experiments`` or ``deploy``.
"""
