"""How often does an alternation of launches read faster beyond noise: with the line's fit, and
with the claim's reading (locally, each candidate against the references beside it, where the
line leaves 3 times their variance)?

Modelled alternations ``A B A B ... A`` of launches whose log rate is the machine's level plus
independent noise of ``--noise`` per launch (lognormal), plus the candidate's gain. The level
takes one of three forms:
- ``still``: constant;
- ``walking``: a random walk of ``--walk`` a launch;
- ``swinging``: half a sine of amplitude ``--swing`` over the alternation, its phase drawn
  at random (a machine that slows down and recovers, as imagenet's 9 launches on 2 busy cores
  did).

Each alternation is read by the project's own functions: ``decide.paired.fit_alternation``
without ``local`` (the line) and with it (the claim's and the gate's reading of launches),
then ``check_interval`` at the claim's confidence with nothing added for a check
(``PairedClaim.faster`` reads this interval for launches). With no gain, the share that reads
faster is the false-claim rate; with ``--gain``, the share that finds the gain.

A third reading, which the project does not use, is modelled beside them: ``peaks``, every
candidate launch faster than both references beside it (under no gain and independent launches,
9 launches do that by chance in 7,936 of their 9! orders, 2.2 %), and ``either``, the claim's
reading or that one. It answers whether crediting such an alternation would find gains the
claim's reading misses.

    python benchmarks/alternations.py                    # 9 and 11 launches, 4,000 each
    python benchmarks/alternations.py --launches 9 --trials 10000

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _bench  # noqa: E402  (records the run)
from ddp_profile.profiler.decide.choose import ChoiceThresholds  # noqa: E402
from ddp_profile.profiler.decide.paired import (  # noqa: E402
    CANDIDATE,
    check_interval,
    fit_alternation,
)


def level(form: str, launches: int, rng: np.random.Generator, walk: float, swing: float
          ) -> np.ndarray:
    if form == "walking":
        return np.cumsum(rng.normal(0.0, walk, launches))
    if form == "swinging":
        phase = rng.uniform(0.0, math.pi)
        return swing * np.sin(np.linspace(0.0, math.pi, launches) + phase)
    return np.zeros(launches)


def faster_shares(launches: int, gain: float, form: str, trials: int, noise: float,
                  walk: float, swing: float, confidence: float, seed: int) -> dict[str, float]:
    """The share of ``trials`` alternations each reading calls faster beyond noise."""
    rng = np.random.default_rng(seed)
    counts = {"line": 0, "local": 0, "read locally": 0, "peaks": 0, "either": 0}
    for _ in range(trials):
        logs = level(form, launches, rng, walk, swing) + rng.normal(0.0, noise, launches)
        logs += gain * (np.arange(launches) % 2 == 1)
        rows = [(CANDIDATE if i % 2 else None, float(i), float(math.exp(v)))
                for i, v in enumerate(logs)]
        faster = {}
        for name, local in (("line", False), ("local", True)):
            fit = fit_alternation(rows, local=local)
            counts["read locally"] += bool(local and fit is not None and fit.local)
            faster[name] = bool(fit is not None
                                and check_interval(fit, CANDIDATE, 0.0, confidence)[0] > 1.0)
        faster["peaks"] = all(logs[i] > max(logs[i - 1], logs[i + 1])
                              for i in range(1, launches - 1, 2))
        faster["either"] = faster["local"] or faster["peaks"]
        for name, read in faster.items():
            counts[name] += read
    return {name: round(count / trials, 4) for name, count in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", default="9,11")
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--noise", type=float, default=0.05, help="per launch, log scale")
    parser.add_argument("--walk", type=float, default=0.04, help="a launch, log scale")
    parser.add_argument("--swing", type=float, default=0.15, help="amplitude, log scale")
    parser.add_argument("--gain", type=float, default=0.08, help="log gain of the B side")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    confidence = ChoiceThresholds().interval_confidence
    figures = {}
    for launches in (int(v) for v in args.launches.split(",")):
        for form in ("still", "walking", "swinging"):
            for label, gain in (("A/A", 0.0), (f"gain {math.exp(args.gain):.2f}x", args.gain)):
                shares = faster_shares(launches, gain, form, args.trials, args.noise,
                                       args.walk, args.swing, confidence, args.seed)
                key = f"{launches} launches, {form}, {label}"
                figures[key] = shares
                print(f"{key:44s} read faster: line {shares['line']:6.1%}  "
                      f"claim's {shares['local']:6.1%}  (read locally "
                      f"{shares['read locally']:4.0%})  peaks {shares['peaks']:6.1%}  "
                      f"either {shares['either']:6.1%}", flush=True)
    _bench.finish("alternations", {"confidence": confidence, "noise": args.noise, "walk": args.walk,
                      "swing": args.swing, "trials": args.trials, "figures": figures})


if __name__ == "__main__":
    main()
