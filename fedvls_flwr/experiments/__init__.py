"""Before and after runs: check a run config, run YAML presets as sweeps, turn run folders into tables and plots.

Imports ``config``, ``app`` (run folders), ``ops`` (the launcher, the in-process engine) and, for
check's dry run, ``data``, ``models`` and ``algorithms``; never Flower or Ray. The tables and plots
(report, runs, tables, plots, diagnostics_table, stages_table) load neither torch nor Flower.
"""
