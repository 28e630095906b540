"""Run configs that are valid but almost surely not meant, said as a warning wherever the run
is checked or starts (``fedvls check``, the ServerApp's log). Torch-free."""

from __future__ import annotations

from typing import Any

#: More rounds than this gets a warning: the presets here run at most 300.
MAX_SANE_ROUNDS = 10_000


def rounds_warning(cfg: Any, pool_size: int | None) -> str | None:
    """A warning for a ``num-server-rounds`` that would not end in any useful time, or None;
    with the training pool's size it says how many samples that trains."""
    if cfg.num_server_rounds <= MAX_SANE_ROUNDS:
        return None
    work = ""
    if pool_size:
        share = cfg.fraction_train * pool_size * cfg.local_epochs
        work = (f"; every round trains about {share:.3g} samples ({cfg.fraction_train:g} x {pool_size} "
                f"x {cfg.local_epochs} local epochs), {share * cfg.num_server_rounds:.3g} in all")
    return (f"num-server-rounds = {cfg.num_server_rounds} is far beyond the at most 300 rounds of the presets "
            f"here{work}: this run would not end in any useful time; set the number of rounds you mean")
