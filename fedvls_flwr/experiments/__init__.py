"""Before and after runs: check a run config, run YAML presets as sweeps, turn run folders into tables and plots.

Imports ``config``, ``app`` (run folders) and ``ops`` (the launcher, the in-process engine);
tables and plots load neither torch nor Flower.
"""
