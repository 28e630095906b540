"""A GPU call's time budget, shared by the scripts one device call runs (bench/gpu_session.sh):
a step starts only when the seconds left of ``--budget`` cover what it needs, else it is
reported as skipped (one JSON line) and the script goes on with what fits."""

from __future__ import annotations

import json
import time


class Budget:
    """Seconds left of ``--budget``: a step starts only with time for it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (0 once spent): the most a step that started may still wait."""
        return max(0.0, self.end - time.monotonic())

    def allows(self, step: str, needs: float) -> bool:
        left = self.end - time.monotonic()
        if left >= needs:
            return True
        print(json.dumps({"skipped": step, "seconds_left": round(left), "needs": needs}), flush=True)
        return False
