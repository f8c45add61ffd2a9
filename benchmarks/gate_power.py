"""How often does the gate cry wolf, and how often does it catch a real 10 % regression?

Simulates many baseline/current pairs and runs the gate's rule (``rules.regression.compare``,
with its production settings) on each:

- **A/A** pairs (no change): the share judged "regression" is the false-alarm rate
  (target <= 1 %).
- **A/B** pairs (current throughput 10 % lower): the share judged "regression" is the
  detection rate (target >= 95 %).

Samples are per-step global throughput. With ``--run-dir`` they are bootstrap-resampled from
the real per-step samples of a run's probes; otherwise drawn from a noise model of CPU
training steps: lognormal step-time noise (coefficient of variation ``--cv``, 3-8 %), a few
outlier steps (``--outlier-rate`` of steps 1.3-2.5x slower: GC, page-cache misses, a noisy
neighbour) and a run-to-run level shift (``--run-shift``, SD of each run's mean level) since two
runs on the same machine never match exactly.

    python benchmarks/gate_power.py --quick
    python benchmarks/gate_power.py --run-dir RUN_DIR --steps 30,60

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Callable, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddp_profile.rules.regression import INCONCLUSIVE, REGRESSION, compare  # noqa: E402

Sampler = Callable[[np.random.Generator, int], np.ndarray]


def noise_model(cv: float, outlier_rate: float, run_shift: float) -> Sampler:
    """Per-step throughput of one simulated run (level 1000 samples/s before the shift)."""
    sigma = math.sqrt(math.log(1 + cv * cv))

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        level = 1000.0 * math.exp(rng.normal(0.0, run_shift))
        step_time = rng.lognormal(-sigma * sigma / 2, sigma, n)
        outliers = rng.random(n) < outlier_rate
        step_time[outliers] *= rng.uniform(1.3, 2.5, int(outliers.sum()))
        return level / step_time

    return draw


def resampler(samples: np.ndarray, run_shift: float) -> Sampler:
    """Bootstrap resamples of real per-step samples, plus the same run-to-run level shift."""
    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return samples[rng.integers(0, len(samples), n)] * math.exp(rng.normal(0.0, run_shift))

    return draw


def wilson(hits: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a rate."""
    if trials == 0:
        return math.nan, math.nan
    rate = hits / trials
    centre = (rate + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials ** 2)) / (
        1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def simulate(draw: Sampler, n_steps: int, trials: int, slowdown: float, seed: int,
             max_regression: float) -> dict[str, float]:
    """Share of pairs judged regression / inconclusive when current is ``slowdown`` slower."""
    rng = np.random.default_rng(seed)
    regressions = inconclusive = 0
    for trial in range(trials):
        baseline = draw(rng, n_steps)
        current = draw(rng, n_steps) * (1.0 - slowdown)
        verdict = compare(baseline, current, max_regression=max_regression, seed=trial)
        regressions += verdict.status == REGRESSION
        inconclusive += verdict.status == INCONCLUSIVE
    low, high = wilson(regressions, trials)
    return {"rate": regressions / trials, "rate_ci95": [round(low, 4), round(high, 4)],
            "inconclusive": inconclusive / trials, "trials": trials}


def _real_samples(run_dir: str, probe_id: Optional[str]) -> dict[str, np.ndarray]:
    from ddp_profile.profiler.baseline import step_throughput_samples
    from ddp_profile.profiler.results import load_run

    run = load_run(run_dir)
    ids = [probe_id] if probe_id else [p["id"] for p in run.summary.get("probes", [])
                                       if p.get("status") == "ok" and p.get("kind") != "ceiling"]
    found = {pid: np.asarray(step_throughput_samples(run, pid)) for pid in ids}
    return {pid: s for pid, s in found.items() if len(s) >= 8}


def _parse_list(text: str, kind: type) -> list:
    return [kind(item) for item in text.split(",") if item.strip()]


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="resample real per-step samples from this run")
    parser.add_argument("--probe", help="only this probe of --run-dir (default: every ok probe)")
    parser.add_argument("--steps", default="30,60", help="measured steps per side, e.g. 30,60")
    parser.add_argument("--cv", default="0.03,0.05,0.08", help="step-time CVs of the model")
    parser.add_argument("--outlier-rate", type=float, default=0.02)
    parser.add_argument("--run-shift", type=float, default=0.015,
                        help="SD of the run-to-run throughput level (fraction)")
    parser.add_argument("--regression", type=float, default=0.10, help="A/B slowdown")
    parser.add_argument("--max-regression", type=float, default=0.05)
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="150 trials, 40 steps, CV 5 %%")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.steps, args.cv = 150, "40", "0.05"

    if args.run_dir:
        sources = {f"probe={pid} (cv={s.std() / s.mean():.3f}, n={len(s)})":
                   resampler(s, args.run_shift)
                   for pid, s in _real_samples(args.run_dir, args.probe).items()}
        if not sources:
            raise SystemExit(f"no probe with >= 8 measured steps in {args.run_dir}")
    else:
        sources = {f"model cv={cv:g}": noise_model(cv, args.outlier_rate, args.run_shift)
                   for cv in _parse_list(args.cv, float)}

    started = time.perf_counter()
    cells = []
    for name, draw in sources.items():
        for n_steps in _parse_list(args.steps, int):
            a_a = simulate(draw, n_steps, args.trials, 0.0, args.seed, args.max_regression)
            a_b = simulate(draw, n_steps, args.trials, args.regression, args.seed + 1,
                           args.max_regression)
            cells.append({"source": name, "steps": n_steps, "false_alarm": a_a["rate"],
                          "false_alarm_ci95": a_a["rate_ci95"], "detection": a_b["rate"],
                          "detection_ci95": a_b["rate_ci95"],
                          "inconclusive": max(a_a["inconclusive"], a_b["inconclusive"]),
                          "meets_targets": a_a["rate"] <= 0.01 and a_b["rate"] >= 0.95})
            print(f"{name:<40} steps={n_steps:<4} false alarm {a_a['rate']:6.1%}   "
                  f"detection of -{args.regression:.0%} {a_b['rate']:6.1%}", flush=True)
    result = {"benchmark": "gate_power", "trials": args.trials, "regression": args.regression,
              "max_regression": args.max_regression, "alpha": 0.002,
              "outlier_rate": None if args.run_dir else args.outlier_rate,
              "run_shift": args.run_shift, "source": "run_dir" if args.run_dir else "model",
              "cells": cells, "max_false_alarm": max(c["false_alarm"] for c in cells),
              "min_detection": min(c["detection"] for c in cells),
              "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
