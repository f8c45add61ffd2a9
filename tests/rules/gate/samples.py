"""Seeded throughput samples for the gate's tests."""

from __future__ import annotations

import numpy as np


def throughput(n: int, seed: int, level: float = 1000.0, cv: float = 0.05) -> np.ndarray:
    """``n`` per-step throughputs, lognormal around ``level`` with relative spread ``cv``."""
    rng = np.random.default_rng(seed)
    return level * rng.lognormal(0.0, cv, n)
