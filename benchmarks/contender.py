"""What does alternating a contender after an established check do to the run's claims?

The claim's check alternates the script's settings (A) with the search's best (B), ``A B A B A``
in launches, one more pair at a time while undecided (nine at most). Where it establishes B,
the configuration that measured faster still in the search (C; here another batch size, which
moves for more than ``clear_gain``) is alternated with A the same way, and replaces B where its
own check establishes it and reads the larger gain (``decide.evidence.verdict``). Both checks
are modelled as ``benchmarks/alternations.py`` models one: log rates of a level (a random walk
of ``--walk`` a launch) plus independent noise of ``--noise`` a launch plus the side's true
gain, read by the project's own ``fit_alternation`` (locally where the line leaves 3 times the
variance) and ``check_interval``.

For pairs of true gains (B's, C's) it prints how often the run claims a gain, how often the
claim is false (the recommended side has no true gain), how often C is recommended, and the
true gain the run recommends on average, with and without the contender's check:

- ``A/A``: neither side faster. The contender is checked only behind an established B, so the
  run claims falsely exactly as often as with one check.
- ``B real, C none``: how often a chance reading of C displaces a real gain.
- ``B real, C larger``: how often the larger gain is found (timm's ``train.py``: ``-j 1``
  1.22x, ``-j 1 -b 64`` 1.42x in plain launches).

    python benchmarks/contender.py                # 4,000 runs a pair of gains, 6 s
    python benchmarks/contender.py --noise 0.08 --trials 10000

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _bench  # noqa: E402  (records the run)
from ddp_profile.profiler.decide.choose import ChoiceThresholds  # noqa: E402
from ddp_profile.profiler.decide.paired import (  # noqa: E402
    CANDIDATE,
    check_interval,
    fit_alternation,
)

THRESHOLDS = ChoiceThresholds()
FIRST, MOST = 5, 9  # launches: A B A B A, then one more pair while undecided (claim.py)


def check(gain: float, rng: np.random.Generator, noise: float, walk: float, need: float
          ) -> tuple[bool, float]:
    """One alternation in launches, extended as the claim extends it: (established beyond
    noise and by more than ``need``, its ratio)."""
    launches = FIRST
    logs = np.cumsum(rng.normal(0.0, walk, MOST)) + rng.normal(0.0, noise, MOST)
    logs += gain * (np.arange(MOST) % 2 == 1)
    while True:
        rows = [(CANDIDATE if i % 2 else None, float(i), float(math.exp(v)))
                for i, v in enumerate(logs[:launches])]
        fit = fit_alternation(rows, local=True)
        if fit is None:
            return False, 1.0
        low, high = check_interval(fit, CANDIDATE, 0.0, THRESHOLDS.interval_confidence)
        ratio = fit.ratio(CANDIDATE)
        faster = low > 1.0
        if faster or launches >= MOST or high <= 1 + THRESHOLDS.noise_floor:
            return faster and ratio > 1 + need, ratio
        launches += 2


def run(gain_b: float, gain_c: float, rng: np.random.Generator, noise: float, walk: float,
        contender: bool) -> Optional[str]:
    """The side the run recommends: "B", "C", or None (the script's settings)."""
    established, ratio_b = check(gain_b, rng, noise, walk, THRESHOLDS.noise_floor)
    if not established:
        return None
    if contender:
        won, ratio_c = check(gain_c, rng, noise, walk, THRESHOLDS.clear_gain)  # a batch
        if won and ratio_c > ratio_b:
            return "C"
    return "B"


def shares(gain_b: float, gain_c: float, trials: int, noise: float, walk: float, seed: int,
           contender: bool) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    gains = {"B": gain_b, "C": gain_c, None: 0.0}
    picks = [run(gain_b, gain_c, rng, noise, walk, contender) for _ in range(trials)]
    claimed = [p for p in picks if p is not None]
    return {"claimed": round(len(claimed) / trials, 4),
            "false": round(sum(gains[p] <= 0.0 for p in claimed) / trials, 4),
            "C": round(picks.count("C") / trials, 4),
            "mean gain": round(float(np.mean([math.exp(gains[p]) for p in picks])), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--noise", type=float, default=0.05, help="per launch, log scale")
    parser.add_argument("--walk", type=float, default=0.04, help="a launch, log scale")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cases = {"A/A": (0.0, 0.0), "B real, C none": (math.log(1.2), 0.0),
             "B real, C equal": (math.log(1.2), math.log(1.2)),
             "B real, C larger": (math.log(1.2), math.log(1.42))}
    figures = {}
    for name, (gain_b, gain_c) in cases.items():
        for contender in (False, True):
            key = f"{name}, {'with' if contender else 'without'} the contender"
            figures[key] = found = shares(gain_b, gain_c, args.trials, args.noise, args.walk,
                                          args.seed, contender)
            print(f"{key:45s} claimed {found['claimed']:6.1%}  false {found['false']:6.1%}  "
                  f"C {found['C']:6.1%}  true gain recommended {found['mean gain']:.3f}x",
                  flush=True)
    _bench.finish("contender", {"noise": args.noise, "walk": args.walk, "trials": args.trials,
                      "confidence": THRESHOLDS.interval_confidence, "figures": figures})


if __name__ == "__main__":
    main()
