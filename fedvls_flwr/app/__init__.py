"""The Flower side: the server's experiment loop and strategy, the client's round, the message protocol, run folders.

Imports ``config``, ``data``, ``models``, ``algorithms`` and Flower. The code that starts Flower and Ray
from outside the apps lives in ``ops``.
"""
