"""What does following an open check in windows with a check in launches do to the claims?

The claim's check alternates the script's settings (A) and the candidate (B) in 7 windows of
one launch, ``A B A B A B A``, where only loader settings differ. Its interval is for what a
user's check of plain launches would measure (the fit's uncertainty and the spread between
launches), so windows whose launch's level moves under them can leave a real gain open (timm's
``train.py``: ``-j 1`` 1.18x [0.94-1.48] while the level rose by a quarter; plain launches
1.18-1.23x). Such a check is now followed by the same check a launch each, ``A B A B A``, one
more pair at a time while open (nine at most: ``sweep.claim``), and that verdict is the one
read. A second look is a second chance to claim a gain that is not there: this models both.

Windows: log rates of the launch's level, a random walk of ``--window-walk`` a window, plus
independent noise of ``--window-noise`` a window, plus B's true gain; read by the project's
``fit_alternation`` and ``check_interval`` with ``--between`` as the spread between launches.
Launches: as ``benchmarks/contender.py`` models them (``check``). For each true gain it prints
how often the run claims a gain with windows alone and with the follow-up, and for the A/A case
that share is the false-claim rate (target at most 5 %).

    python benchmarks/windows_then_launches.py              # 4,000 runs a gain, a few seconds

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

import _bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from contender import THRESHOLDS, check  # noqa: E402
from ddp_profile.profiler.decide.paired import (  # noqa: E402
    CANDIDATE,
    check_interval,
    fit_alternation,
    order,
)

WINDOWS = len(order(3))  # A B A B A B A


def windows(gain: float, rng: np.random.Generator, noise: float, walk: float, between: float
            ) -> str:
    """One check in windows of one launch: "faster", "open" (not faster, yet it read a gain and
    its interval still holds one above the noise floor: ``decide.paired.alternation_open``
    with ``gained``) or "lost"."""
    logs = np.cumsum(rng.normal(0.0, walk, WINDOWS)) + rng.normal(0.0, noise, WINDOWS)
    logs += gain * (np.arange(WINDOWS) % 2 == 1)
    rows = [(CANDIDATE if i % 2 else None, float(i), float(math.exp(v)))
            for i, v in enumerate(logs)]
    fit = fit_alternation(rows)
    if fit is None:
        return "lost"
    low, high = check_interval(fit, CANDIDATE, between, THRESHOLDS.interval_confidence)
    if low > 1.0 and fit.ratio(CANDIDATE) > 1 + THRESHOLDS.noise_floor:
        return "faster"
    return "open" if high > 1 + THRESHOLDS.noise_floor and fit.ratio(CANDIDATE) > 1.0 \
        else "lost"


def shares(gain: float, args: argparse.Namespace) -> dict[str, float]:
    rng = np.random.default_rng(args.seed)
    alone = followed = opened = 0
    for _ in range(args.trials):
        seen = windows(gain, rng, args.window_noise, args.window_walk, args.between)
        alone += seen == "faster"
        opened += seen == "open"
        if seen == "faster" or (seen == "open" and check(
                gain, rng, args.noise, args.walk, THRESHOLDS.noise_floor)[0]):
            followed += 1
    return {"windows alone": round(alone / args.trials, 4),
            "open": round(opened / args.trials, 4),
            "with the follow-up": round(followed / args.trials, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--window-noise", type=float, default=0.03, help="a window, log scale")
    parser.add_argument("--window-walk", type=float, default=0.04, help="a window, log scale")
    parser.add_argument("--between", type=float, default=0.05,
                        help="the spread between launches the run showed (at least launch_sd)")
    parser.add_argument("--noise", type=float, default=0.05, help="a launch, log scale")
    parser.add_argument("--walk", type=float, default=0.04, help="a launch, log scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    figures = {}
    for gain in (1.0, 1.1, 1.2):
        figures[f"{gain:.2f}x"] = found = shares(math.log(gain), args)
        print(f"true gain {gain:.2f}x: claimed {found['windows alone']:6.1%} by windows alone, "
              f"{found['with the follow-up']:6.1%} with the follow-up "
              f"(open after the windows {found['open']:6.1%})", flush=True)
    _bench.finish("windows_then_launches", {**vars(args), "figures": figures,
                                            "confidence": THRESHOLDS.interval_confidence})


if __name__ == "__main__":
    main()
