"""How often does the gate cry wolf, and how often does it catch a real 10 % regression?

Draws many baseline/current pairs and runs the gate's rule (``rules.gate.verdict.compare``,
with its production settings) on each:

- **A/A** pairs (no change): the share judged "regression" is the false-alarm rate
  (target <= 1 %).
- **A/B** pairs (current throughput 10 % lower): the share judged "regression" is the
  detection rate (target >= 95 %).

Samples are per-step global throughput, from one of three sources:

- ``--real-runs K``: K real runs of the built-in demo workload, one fixed configuration each
  (``ddp-profile run demo_train.py --num-workers 2 --steps N --no-ceiling ...`` in a
  subprocess, 2 ranks), read back with ``profiler.baseline.step_throughput_samples``. A pair is
  a window of n consecutive steps from run i against a window of n steps from another run j:
  real step-to-step noise, real autocorrelation and the real run-to-run drift of this machine,
  nothing modelled. For A/B the current window is multiplied by 0.90. The pairs share K runs,
  so the false-alarm rate rests on K (K - 1) / 2 pairs of runs, whatever the trial count.
  ``--pairing`` also pairs only runs made one after the other (``adjacent``) and two disjoint
  windows of one run (``same-run``), which separates run-to-run drift from within-run noise.
  ``--launches 2,3`` also draws K distinct runs per side (the gate's launch-level rule,
  ``ddp-profile run --repeat K``); the A/A and A/B pairs then never share a run.
  ``--samples-out FILE`` keeps the runs' samples; ``--samples-in FILE`` reuses them.
- ``--run-dir RUN``: bootstrap resamples of the real per-step samples of a run's probes, plus a
  modelled run-to-run level shift.
- default: a noise model of CPU training steps: lognormal step-time noise (coefficient of
  variation ``--cv``), a few outlier steps (``--outlier-rate`` of steps 1.3-2.5x slower: GC,
  page-cache misses, a noisy neighbour) and a run-to-run level shift (``--run-shift``, SD of
  each run's mean level) since two runs on the same machine never match exactly.

    python benchmarks/gate_power.py --quick                       # model, seconds
    python benchmarks/gate_power.py --cv 0.073 --steps 30,60,100,150,200,300 --trials 1000
    python benchmarks/gate_power.py --real-runs 4 --quick         # 4 x 160 steps, ~2 min
    python benchmarks/gate_power.py --real-runs 10 --samples-out runs.json   # ~7 min
    python benchmarks/gate_power.py --samples-in runs.json --max-regression 0.1 --regression 0.2
    python benchmarks/gate_power.py --real-runs 16 --run-steps 160 --steps 150 --launches 1,2,3
    python benchmarks/gate_power.py --run-dir RUN_DIR --steps 30,60

Each cell also reports the gate's own ``min_detectable`` (median over the A/A pairs), to set
against the measured detection. The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from typing import Callable, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import _bench  # noqa: E402  (records the run)
from ddp_profile.defaults import ALPHA, MAX_REGRESSION  # noqa: E402
from ddp_profile.rules.gate.verdict import INCONCLUSIVE, REGRESSION, compare, compare_launches  # noqa: E402

Sampler = Callable[[np.random.Generator, int], np.ndarray]
PairDrawer = Callable[[np.random.Generator, int], tuple[np.ndarray, np.ndarray]]
DEFAULT_WORKLOAD = "--load-ms 1 --batch-size 16"
PAIRING_LABELS = {"any": "real: any two runs", "adjacent": "real: adjacent runs",
                  "same-run": "real: one run, 2 windows"}


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


def independent_pairs(draw: Sampler) -> PairDrawer:
    """Baseline and current drawn independently from the same sampler."""
    return lambda rng, n: (draw(rng, n), draw(rng, n))


def run_windows(runs: list[np.ndarray], pairing: str = "any") -> PairDrawer:
    """Windows of n consecutive steps from two real runs (or two parts of one run).

    ``pairing``: ``"any"``, run i against any run j != i (the committed-baseline case: the two
    runs may be far apart in time); ``"adjacent"``, run i against run i + 1, made one after the
    other (a baseline re-measured in the same CI job); ``"same-run"``, two non-overlapping
    windows of one run (step noise and within-run drift only, no run-to-run change).
    """
    def window(rng: np.random.Generator, run: np.ndarray, n: int, low: int = 0,
               high: Optional[int] = None) -> tuple[np.ndarray, int]:
        high = len(run) - n if high is None else high
        start = int(rng.integers(low, high + 1))
        return run[start:start + n], start

    def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        if pairing == "same-run":
            run = runs[int(rng.integers(0, len(runs)))]
            first, start = window(rng, run, n, 0, len(run) - 2 * n)
            second, _ = window(rng, run, n, start + n)
            return (first, second) if rng.random() < 0.5 else (second, first)
        if pairing == "adjacent":
            i = int(rng.integers(0, len(runs) - 1))
            i, j = (i, i + 1) if rng.random() < 0.5 else (i + 1, i)
        else:
            i, j = (int(k) for k in rng.choice(len(runs), size=2, replace=False))
        return window(rng, runs[i], n)[0], window(rng, runs[j], n)[0]

    return draw


def launch_groups(runs: list[np.ndarray], launches: int) -> PairDrawer:
    """``launches`` distinct real runs per side, each giving a window of n steps: the gate with
    ``ddp-profile run --repeat K`` on both sides (no run appears on both sides)."""
    def draw(rng: np.random.Generator, n: int) -> tuple[list, list]:
        chosen = rng.choice(len(runs), size=2 * launches, replace=False)
        windows = []
        for i in chosen:
            start = int(rng.integers(0, len(runs[i]) - n + 1))
            windows.append(runs[i][start:start + n])
        return windows[:launches], windows[launches:]

    return draw


def model_launches(draw: Sampler, launches: int) -> PairDrawer:
    """``launches`` independent simulated runs per side (each with its own level shift)."""
    def pair(rng: np.random.Generator, n: int) -> tuple[list, list]:
        return ([draw(rng, n) for _ in range(launches)], [draw(rng, n) for _ in range(launches)])

    return pair


def wilson(hits: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a rate."""
    if trials == 0:
        return math.nan, math.nan
    rate = hits / trials
    centre = (rate + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials ** 2)) / (
        1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def simulate(draw_pair: PairDrawer, n_steps: int, trials: int, slowdown: float, seed: int,
             max_regression: float) -> dict:
    """Share of pairs judged regression / inconclusive when current is ``slowdown`` slower."""
    rng = np.random.default_rng(seed)
    regressions = inconclusive = 0
    detectable = []
    for _ in range(trials):
        baseline, current = draw_pair(rng, n_steps)
        if isinstance(baseline, list):  # launches per side
            verdict = compare_launches(baseline, [c * (1.0 - slowdown) for c in current],
                                       max_regression=max_regression)
        else:
            verdict = compare(baseline, current * (1.0 - slowdown),
                              max_regression=max_regression)
        regressions += verdict.status == REGRESSION
        inconclusive += verdict.status == INCONCLUSIVE
        detectable.append(verdict.min_detectable)
    low, high = wilson(regressions, trials)
    return {"rate": regressions / trials, "rate_ci95": [round(low, 4), round(high, 4)],
            "inconclusive": inconclusive / trials, "trials": trials,
            "median_min_detectable": round(float(np.nanmedian(detectable)), 4)
            if not all(math.isnan(d) for d in detectable) else None}


def _real_samples(run_dir: str, probe_id: Optional[str]) -> dict[str, np.ndarray]:
    from ddp_profile.profiler.store.baseline import step_throughput_samples
    from ddp_profile.profiler.store.results import load_run

    run = load_run(run_dir)
    ids = [probe_id] if probe_id else [p["id"] for p in run.summary.get("probes", [])
                                       if p.get("status") == "ok" and p.get("kind") != "ceiling"]
    found = {pid: np.asarray(step_throughput_samples(run, pid)) for pid in ids}
    return {pid: s for pid, s in found.items() if len(s) >= 8}


def _cv(samples: np.ndarray) -> float:
    return float(samples.std() / samples.mean())


def _lag1(samples: np.ndarray) -> float:
    """Lag-1 autocorrelation of the step samples (0 for independent steps)."""
    centred = samples - samples.mean()
    denominator = float((centred * centred).sum())
    return float((centred[:-1] * centred[1:]).sum() / denominator) if denominator else 0.0


def real_runs(count: int, run_steps: int, warmup: int, num_workers: int, workload: list[str],
              timeout_s: float) -> tuple[list[np.ndarray], list[dict]]:
    """``count`` real single-probe runs of the demo workload via the CLI; their step samples."""
    from _bench import DEMO, cleanup, scratch
    from ddp_profile.profiler.store.baseline import step_throughput_samples
    from ddp_profile.profiler.store.results import load_run

    work = scratch("gate-power-")
    env = dict(os.environ)
    env.pop("DDP_PROFILE", None)
    samples, described = [], []
    try:
        for index in range(count):
            out = os.path.join(work, f"run-{index}")
            command = [sys.executable, "-m", "ddp_profile", "run", DEMO, "--out", out,
                       "--num-workers", str(num_workers), "--steps", str(run_steps),
                       "--warmup", str(warmup), "--no-ceiling", "--no-report", "--quiet",
                       "--", *workload]
            started = time.perf_counter()
            # cwd is the scratch directory, so no project file of the caller is picked up
            proc = subprocess.run(command, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout_s)
            wall = time.perf_counter() - started
            if proc.returncode != 0:
                raise SystemExit(f"real run {index} failed (exit {proc.returncode}): "
                                 f"{(proc.stderr or proc.stdout).strip()[-800:]}")
            run = load_run(out)
            probe = run.summary["probes"][0]
            steps = np.asarray(step_throughput_samples(run, str(probe["id"])), dtype=float)
            samples.append(steps)
            described.append({"steps": len(steps), "median": round(float(np.median(steps)), 1),
                              "cv": round(_cv(steps), 4), "lag1_autocorrelation":
                              round(_lag1(steps), 3), "wall_s": round(wall, 1)})
            print(f"real run {index + 1}/{count}: {len(steps)} steps, median "
                  f"{np.median(steps):,.0f} samples/s, CV {_cv(steps):.1%}, lag-1 "
                  f"autocorrelation {_lag1(steps):+.2f}, {wall:.0f} s", flush=True)
    finally:
        cleanup(work)
    return samples, described


def _run_pairs_summary(samples: list[np.ndarray], max_regression: float) -> dict:
    """Run-to-run drift: SD of log median level, and the pairs of runs apart by > tolerance."""
    levels = np.log([np.median(s) for s in samples])
    gaps = [abs(a - b) for i, a in enumerate(levels) for b in levels[i + 1:]]
    return {"run_level_sd": round(float(np.std(levels, ddof=1)), 4) if len(levels) > 1 else None,
            "run_pairs": len(gaps),
            "max_run_level_gap": round(float(math.expm1(max(gaps))), 4) if gaps else None,
            "run_pairs_beyond_tolerance": int(sum(g > -math.log(1 - max_regression)
                                                  for g in gaps))}


def _parse_list(text: str, kind: type) -> list:
    return [kind(item) for item in text.split(",") if item.strip()]


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real-runs", type=int, default=0, metavar="K",
                        help="make K real runs of the demo workload and pair their windows")
    parser.add_argument("--run-steps", type=int, default=400,
                        help="measured steps of each real run (--real-runs)")
    parser.add_argument("--run-warmup", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=2, help="real runs' num_workers")
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD,
                        help="demo_train.py arguments of the real runs")
    parser.add_argument("--run-timeout", type=float, default=300.0)
    parser.add_argument("--samples-out", help="real runs: also save their step samples (JSON)")
    parser.add_argument("--samples-in", help="use the real runs saved by --samples-out "
                        "instead of making new ones")
    parser.add_argument("--pairing", default="any,adjacent,same-run",
                        help="real runs: which windows are paired (any, adjacent, same-run; "
                        "see run_windows)")
    parser.add_argument("--launches", default="",
                        help="also compare K runs per side, e.g. 2,3,5 (the gate with "
                        "--repeat K): K distinct real runs (needs 2K), or K model runs")
    parser.add_argument("--run-dir", help="resample real per-step samples from this run")
    parser.add_argument("--probe", help="only this probe of --run-dir (default: every ok probe)")
    parser.add_argument("--steps", default=None,
                        help="measured steps per side, e.g. 30,60 (default 30,60; with "
                        "--real-runs 30,60,100,150,200,300)")
    parser.add_argument("--cv", default="0.03,0.05,0.08", help="step-time CVs of the model")
    parser.add_argument("--outlier-rate", type=float, default=0.02)
    parser.add_argument("--run-shift", type=float, default=0.015,
                        help="SD of the run-to-run throughput level (fraction)")
    parser.add_argument("--regression", type=float, default=0.10, help="A/B slowdown")
    parser.add_argument("--max-regression", type=float, default=MAX_REGRESSION)
    parser.add_argument("--trials", type=int, default=None,
                        help="pairs per cell (default 500; 1000 with --real-runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true",
                        help="model: 150 trials, 40 steps, CV 5 %%; real runs: 160 steps "
                        "each, windows 30,60,100,150, 300 trials")
    args = parser.parse_args(argv)
    real = args.real_runs > 0 or bool(args.samples_in)
    if args.real_runs == 1:
        raise SystemExit("--real-runs needs at least 2 runs")
    if args.quick and real:
        args.run_steps = min(args.run_steps, 160)
        args.trials = args.trials or 300
        args.steps = args.steps or "30,60,100,150"
    elif args.quick:
        args.trials, args.steps, args.cv = args.trials or 150, args.steps or "40", "0.05"
    args.trials = args.trials or (1000 if real else 500)
    args.steps = args.steps or ("30,60,100,150,200,300" if real else "30,60")
    wanted_steps = _parse_list(args.steps, int)

    started = time.perf_counter()
    extra: dict = {}
    max_steps: dict = {}
    if real:
        if args.samples_in:
            with open(args.samples_in, encoding="utf-8") as handle:
                saved = json.load(handle)
            samples = [np.asarray(s, dtype=float) for s in saved["samples"]]
            described, args.workload = saved["runs"], saved["workload"]
            args.num_workers, args.run_steps = saved["num_workers"], saved["run_steps"]
            machine = saved.get("machine")
        else:
            from _bench import machine as describe_machine

            machine = describe_machine()
            samples, described = real_runs(args.real_runs, args.run_steps, args.run_warmup,
                                           args.num_workers, shlex.split(args.workload),
                                           args.run_timeout)
        if args.samples_out:
            with open(args.samples_out, "w", encoding="utf-8") as handle:
                json.dump({"runs": described, "workload": args.workload,
                           "num_workers": args.num_workers, "run_steps": args.run_steps,
                           "machine": machine, "samples": [s.tolist() for s in samples]},
                          handle)
        shortest = min(len(s) for s in samples)
        samples = [s[:shortest] for s in samples]  # every run offers the same windows
        wanted_steps = [n for n in wanted_steps if n <= shortest]
        pooled = np.concatenate([s / np.median(s) for s in samples])
        pairings = _parse_list(args.pairing, str)
        if not set(pairings) <= set(PAIRING_LABELS):
            raise SystemExit(f"--pairing: choose from {', '.join(PAIRING_LABELS)}")
        sources = {PAIRING_LABELS[p]: run_windows(samples, p) for p in pairings}
        for k in _parse_list(args.launches, int):
            if 2 * k > len(samples):
                raise SystemExit(f"--launches {k}: needs {2 * k} real runs, got {len(samples)}")
            sources[f"real: {k} launches per side"] = launch_groups(samples, k)
        # two disjoint windows of one run must fit in it
        max_steps = {PAIRING_LABELS["same-run"]: shortest // 2}
        extra = {"runs": described, "workload": args.workload, "num_workers": args.num_workers,
                 "pairing": _parse_list(args.pairing, str),
                 "run_steps": args.run_steps, "pooled_cv": round(_cv(pooled), 4),
                 **_run_pairs_summary(samples, args.max_regression), "machine": machine}
    elif args.run_dir:
        sources = {f"probe={pid} (cv={s.std() / s.mean():.3f}, n={len(s)})":
                   independent_pairs(resampler(s, args.run_shift))
                   for pid, s in _real_samples(args.run_dir, args.probe).items()}
        if not sources:
            raise SystemExit(f"no probe with >= 8 measured steps in {args.run_dir}")
    else:
        sources = {}
        for cv in _parse_list(args.cv, float):
            model = noise_model(cv, args.outlier_rate, args.run_shift)
            sources[f"model cv={cv:g}"] = independent_pairs(model)
            for k in _parse_list(args.launches, int):
                sources[f"model cv={cv:g}, {k} launches per side"] = model_launches(model, k)

    cells = []
    for name, draw_pair in sources.items():
        for n_steps in wanted_steps:
            if n_steps > max_steps.get(name, n_steps):
                continue
            a_a = simulate(draw_pair, n_steps, args.trials, 0.0, args.seed, args.max_regression)
            a_b = simulate(draw_pair, n_steps, args.trials, args.regression, args.seed + 1,
                           args.max_regression)
            cells.append({"source": name, "steps": n_steps, "false_alarm": a_a["rate"],
                          "false_alarm_ci95": a_a["rate_ci95"], "detection": a_b["rate"],
                          "detection_ci95": a_b["rate_ci95"],
                          "inconclusive": max(a_a["inconclusive"], a_b["inconclusive"]),
                          "median_min_detectable": a_a["median_min_detectable"],
                          "meets_targets": a_a["rate"] <= 0.01 and a_b["rate"] >= 0.95})
            print(f"{name:<44} steps={n_steps:<4} false alarm {a_a['rate']:6.1%} "
                  f"[{a_a['rate_ci95'][0]:.1%}, {a_a['rate_ci95'][1]:.1%}]   detection of "
                  f"-{args.regression:.0%} {a_b['rate']:6.1%} [{a_b['rate_ci95'][0]:.1%}, "
                  f"{a_b['rate_ci95'][1]:.1%}]   gate's detectable "
                  f"{a_a['median_min_detectable']:.1%}", flush=True)
    meeting = {}
    for name in sources:  # the fewest steps per side meeting both targets, if any
        passing = [c["steps"] for c in cells if c["source"] == name and c["meets_targets"]]
        meeting[name] = min(passing) if passing else None
    source = "real_runs" if real else ("run_dir" if args.run_dir else "model")
    result = {"benchmark": "gate_power", "source": source, "trials": args.trials,
              "regression": args.regression, "max_regression": args.max_regression,
              "alpha": ALPHA, "outlier_rate": args.outlier_rate if source == "model" else None,
              "run_shift": args.run_shift if source != "real_runs" else None, **extra,
              "cells": cells, "max_false_alarm": max(c["false_alarm"] for c in cells),
              "min_detection": min(c["detection"] for c in cells),
              "min_steps_meeting_targets": meeting,
              "seconds": round(time.perf_counter() - started, 1)}
    _bench.finish("gate_power", result, argv)
    return result


if __name__ == "__main__":
    main()
