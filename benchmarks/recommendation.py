"""Recommendation quality of adaptive search against the full grid, and the per-probe fixed cost.

For each scenario (``ddp_profile/examples/demo_train.py`` with costs that make a different
bottleneck) it runs ``ddp-profile run`` twice over the same axes, ``--search grid`` and
``--search adaptive`` (alternating which goes first), and reports:

* ``adaptive_vs_grid_best``: the throughput of adaptive's recommended configuration divided
  by that of the grid's best-measured one (target >= 0.95), measured **head to head**: fresh
  probes of the two configurations alternate (``--h2h-reps`` each, twice the steps) and the
  ratio of their medians is reported. A single grid probe is a noisy sample and the grid's
  maximum is biased upward (the highest of many noisy figures), so the grid run's own figures
  are kept only for reference (``in_grid_run``). 1.0 when both chose the same configuration;
* ``wall_ratio``: adaptive's wall time / the grid's (target <= 0.35);
* ``same_as_grid_recommendation``: whether adaptive recommends what the grid run recommends
  (the grid, too, resolves configurations within noise of its best toward the cheaper one, so
  its recommendation is not always its single highest throughput);
* ``ceiling_share``: the recommended configuration's throughput / the compute-only ceiling
  (``recommendation.ceiling_share`` of the adaptive run's summary).

Scenarios: ``io_bound`` (``--load-ms 2``: storage latency), ``cpu_bound`` (``--cpu-ms 1``:
decoding), ``compute_bound`` (``--hidden 1024 --layers 3 --batch-size 64``), ``small_batch``
(``--batch-size 4 --load-ms 1``).

**Per-probe fixed cost** (``fixed_cost``): interleaved repetitions of the same script
(``benchmarks/workloads/bench_train.py``, 20 ms steps) run plainly under torchrun and as a
ddp-profile probe; *start* = launch -> the first measured step (warm-up steps included on both
sides), *teardown* = the end of the last measured step -> the launcher has exited (plain: the
script's own loop ends and it exits; probe: ddp-profile's stop: records, barrier, exit, stray
check).

**Default runs** (``--defaults``): scenarios run with ddp-profile's defaults (no hand-set
ladder), ``latency_bound`` (``--load-ms 3``), ``cpu_bound`` (``--cpu-ms 2``), ``mixed``
(``--load-ms 1.5 --cpu-ms 1.5``), ``compute_bound``. Reference: the best of a wide grid of worker
counts (``WIDE_GRID``: fresh probes of each), then the default run's choice and that best measured
head to head (``default_vs_wide_best``, target >= 0.9 on latency-bound, within noise elsewhere);
also the default run's launches (target <= 4), its predicted capacity against the measured best
for CPU-bound loading (within 15 %), and a compute-bound run's wall time against a plain run of
the same steps (target <= 1.3x).

    python benchmarks/recommendation.py --defaults --quick   # latency_bound, grid 0,2,8,32
    python benchmarks/recommendation.py --quick   # io_bound, workers 0,2 x prefetch 2,4 (~3 min)
    python benchmarks/recommendation.py           # 4 scenarios, workers 0,1,2,4 x prefetch 2,4

The last line printed is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench  # noqa: E402

TARGET_QUALITY = 0.95
TARGET_WALL = 0.35
SCENARIOS = {
    "io_bound": ["--load-ms", "2"],
    "cpu_bound": ["--cpu-ms", "1"],
    "compute_bound": ["--hidden", "1024", "--layers", "3", "--batch-size", "64"],
    "small_batch": ["--batch-size", "4", "--load-ms", "1"],
}


DEFAULT_SCENARIOS = {
    "latency_bound": ["--load-ms", "3"],
    "cpu_bound": ["--cpu-ms", "2"],
    "mixed": ["--load-ms", "1.5", "--cpu-ms", "1.5"],
    "compute_bound": ["--hidden", "1024", "--layers", "3", "--batch-size", "64"],
}
WIDE_GRID = (0, 1, 2, 4, 8, 16, 32)


def run_sweep(scenario_args: list[str], search: str, axes: list[str], steps: int, warmup: int
              ) -> dict:
    work = _bench.scratch(f"recommend-{search}-")
    try:
        cmd = [sys.executable, "-m", "ddp_profile", "run", _bench.DEMO, *axes, "--search", search,
               "--steps", str(steps), "--warmup", str(warmup), "--no-report", "--quiet",
               "--out", os.path.join(work, "run"), "--", *scenario_args]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=3600)
        wall = time.monotonic() - started
        path = os.path.join(work, "run", "summary.json")
        if proc.returncode != 0 or not os.path.exists(path):
            return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}",
                    "wall_s": wall}
        with open(path) as handle:
            summary = json.load(handle)
        return {"summary": summary, "wall_s": wall}
    finally:
        _bench.cleanup(work)


def _key(config: dict) -> tuple:
    workers = config.get("num_workers") or 0
    return (workers, config.get("prefetch_factor") if workers else None,
            config.get("batch_size"))


def head_to_head(scenario_args: list[str], configs: list[dict], reps: int, steps: int,
                 warmup: int) -> list[list[float]]:
    """Throughputs of fresh probes of each configuration, alternating, ``reps`` each."""
    from ddp_profile.profiler.launch.ranks import LaunchSpec
    from ddp_profile.profiler.settings import LoaderSettings
    from ddp_profile.profiler.store.rundir import RunDir
    from ddp_profile.profiler.sweep.measure import LedgerMeasurer
    from ddp_profile.profiler.sweep.state import Window

    work = _bench.scratch("h2h-")
    try:
        run_dir = RunDir(os.path.join(work, "run"))
        run_dir.create({"benchmark": "head_to_head"})
        measurer = LedgerMeasurer(run_dir, LaunchSpec(_bench.DEMO, tuple(scenario_args),
                                                      nproc_per_node=_bench.NPROC),
                                  steps=steps, warmup=warmup, timeout_s=300.0)
        settings = [LoaderSettings.from_dict(c) for c in configs]
        results: list[list[float]] = [[] for _ in configs]
        for rep in range(reps):
            order = range(len(settings)) if rep % 2 == 0 else reversed(range(len(settings)))
            for index in order:
                entry = measurer.measure(Window(settings[index]))
                if entry.ok and entry.throughput:
                    results[index].append(entry.throughput)
        return results
    finally:
        _bench.cleanup(work)


def compare(grid: dict, adaptive: dict) -> dict:
    gs, ad = grid["summary"], adaptive["summary"]
    measured = [p for p in gs["probes"] if p["kind"] in ("baseline", "sweep")
                and p["status"] == "ok" and p.get("throughput")]
    best = max(measured, key=lambda p: p["throughput"])
    chosen = ad.get("recommended") or {}
    same = [p for p in measured if _key(p["config"]) == _key(chosen)]
    chosen_tp = max((p["throughput"] for p in same), default=None)
    ad_probes = [p for p in ad["probes"] if p["kind"] != "ceiling"]
    return {
        "grid_best": {"config": best["config"], "throughput": _bench.rnd(best["throughput"], 1)},
        "grid_recommended": gs.get("recommended"),
        "adaptive_recommended": chosen,
        "in_grid_run": {"adaptive_vs_grid_best": _bench.rnd(chosen_tp / best["throughput"])
                        if chosen_tp else None},
        "same_as_grid_recommendation": _key(chosen) == _key(gs.get("recommended") or {}),
        "grid_wall_s": round(grid["wall_s"], 1), "adaptive_wall_s": round(adaptive["wall_s"], 1),
        "wall_ratio": _bench.rnd(adaptive["wall_s"] / grid["wall_s"]),
        "grid_probes": len(gs["probes"]), "adaptive_probes": len(ad["probes"]),
        "adaptive_sweep_probes": len(ad_probes),
        "ceiling_share": _bench.rnd((ad.get("recommendation") or {}).get("ceiling_share")),
        "expected_speedup": _bench.rnd(ad.get("expected_speedup")),
    }


def fixed_cost(reps: int) -> dict:
    """Launch -> first measured step, and teardown: plain torchrun vs a ddp-profile probe."""
    from ddp_profile.profiler.store.probedir import read_probe_dir

    warmup, steps = 5, 20
    base = ["--hidden", "32", "--layers", "1", "--step-sleep-ms", "20", "--warmup", str(warmup)]
    rows = []
    for rep in range(reps):
        order = ("plain", "probe") if rep % 2 == 0 else ("probe", "plain")
        row = {}
        for variant in order:
            work = _bench.scratch(f"fixed-{variant}-")
            try:
                if variant == "plain":
                    res = _bench.run_plain([*base, "--steps", str(warmup + steps)], work)
                    first = min(r["first_measured_step_ns"] for r in res["ranks"])
                    last_end = max(r["loop_end_ns"] for r in res["ranks"])
                else:
                    res = _bench.run_instrumented([*base, "--steps", "1000000"], work,
                                                  warmup=warmup, steps=steps, with_out=False)
                    ranks = read_probe_dir(res["probe_dir"])
                    measured = [s for r in ranks for s in r.training_steps() if s.get("measured")]
                    first = min(s["t_ns"] for s in measured)
                    last_end = max(s["t_ns"] + int(1e9 * (s["data_wait_s"] + s["compute_s"]
                                                          + s["other_s"])) for s in measured)
                row[variant] = {"start_s": (first - res["started_ns"]) / 1e9,
                                "teardown_s": (res["ended_ns"] - last_end) / 1e9,
                                "total_s": (res["ended_ns"] - res["started_ns"]) / 1e9}
            finally:
                _bench.cleanup(work)
        rows.append(row)

    def med(variant: str, key: str) -> float | None:
        return _bench.rnd(_bench.median([r[variant][key] for r in rows]), 3)

    out = {v: {k: med(v, k) for k in ("start_s", "teardown_s", "total_s")}
           for v in ("plain", "probe")}
    out["extra_s"] = {k: _bench.rnd(_bench.median([r["probe"][k] - r["plain"][k] for r in rows]),
                                    3) for k in ("start_s", "teardown_s", "total_s")}
    out["reps"] = reps
    out["per_rep"] = [{v: {k: round(x, 3) for k, x in r[v].items()} for v in r} for r in rows]
    return out


def _head_to_head_row(name: str, row: dict, reps: int, steps: int, warmup: int) -> dict:
    best = dict(row["grid_best"]["config"])
    chosen = dict(row["adaptive_recommended"])
    if _key(best) == _key(chosen) or reps <= 0:
        return {"adaptive_vs_grid_best": 1.0 if _key(best) == _key(chosen) else None}
    grid_tp, adaptive_tp = head_to_head(SCENARIOS[name], [best, chosen], reps, 2 * steps,
                                        warmup)
    if not grid_tp or not adaptive_tp:
        return {"adaptive_vs_grid_best": None, "head_to_head": "a probe failed"}
    return {"adaptive_vs_grid_best": _bench.rnd(_bench.median(adaptive_tp)
                                                / _bench.median(grid_tp)),
            "head_to_head": {"grid_best": [round(x, 1) for x in grid_tp],
                             "adaptive": [round(x, 1) for x in adaptive_tp]}}


def default_run_row(name: str, wide: tuple[int, ...], reps: int, steps: int,
                    warmup: int) -> dict:
    """One scenario run with defaults, against the best of a wide grid, head to head."""
    scenario = DEFAULT_SCENARIOS[name]
    run = run_sweep(scenario, "adaptive", [], steps, warmup)
    if "error" in run:
        return {"scenario": name, "error": run["error"]}
    summary = run["summary"]
    chosen = summary.get("recommended") or {}
    launches = {p.get("launch") or p["id"] for p in summary["probes"]}
    grid = head_to_head(scenario, [{"num_workers": w} for w in wide], 1, steps, warmup)
    grid_tp = {w: tp[0] for w, tp in zip(wide, grid) if tp}
    best_w = max(grid_tp, key=grid_tp.get)
    row = {"scenario": name, "args": " ".join(scenario), "wall_s": round(run["wall_s"], 1),
           "launches": len(launches), "chosen": chosen,
           "measured_workers": sorted({p["config"]["num_workers"] for p in summary["probes"]
                                       if p["status"] == "ok"}),
           "wide_grid": {str(w): round(tp, 1) for w, tp in grid_tp.items()},
           "wide_best_workers": best_w, "capacity": summary.get("capacity") and {
               k: summary["capacity"][k] for k in ("bound", "cpu_limit", "demand",
                                                    "workers_for_demand")}}
    if (chosen.get("num_workers") or 0) == best_w:
        row["default_vs_wide_best"] = 1.0
    else:
        pair = head_to_head(scenario, [{**chosen, "num_workers": best_w}, chosen], reps,
                            steps, warmup)
        if pair[0] and pair[1]:
            row["default_vs_wide_best"] = _bench.rnd(_bench.median(pair[1])
                                                     / _bench.median(pair[0]))
            row["head_to_head"] = {"wide_best": [round(x, 1) for x in pair[0]],
                                   "default": [round(x, 1) for x in pair[1]]}
    if name == "compute_bound":
        plain = [plain_wall(scenario, warmup + steps) for _ in range(2)]
        plain = [w for w in plain if w is not None]
        if plain:
            row["plain_wall_s"] = round(_bench.median(plain), 1)
            row["wall_vs_plain"] = _bench.rnd(run["wall_s"] / _bench.median(plain))
    cap = row["capacity"]
    if cap and cap["bound"] == "cpu" and cap.get("cpu_limit") \
            and cap["cpu_limit"] < (cap.get("demand") or 0):  # loading is the limit
        row["predicted_vs_measured_capacity"] = _bench.rnd(cap["cpu_limit"]
                                                           / max(grid_tp.values()))
    return row


def plain_wall(scenario_args: list[str], steps: int) -> float | None:
    """Wall time of a plain torchrun of the demo for ``steps`` steps (one epoch of exactly
    that many batches per rank), launch to exit; None when it failed."""
    batch = int(scenario_args[scenario_args.index("--batch-size") + 1]) \
        if "--batch-size" in scenario_args else 16
    work = _bench.scratch("plain-")
    try:
        args = [*scenario_args, "--epochs", "1", "--samples", str(steps * batch * _bench.NPROC)]
        started = time.monotonic()
        proc = subprocess.run(_bench.torchrun_command(_bench.DEMO, args), cwd=work,
                              capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
        wall = time.monotonic() - started
        return wall if proc.returncode == 0 else None
    finally:
        _bench.cleanup(work)


def defaults_main(args: argparse.Namespace) -> dict:
    names = (args.scenarios or ("latency_bound" if args.quick
                                else ",".join(DEFAULT_SCENARIOS))).split(",")
    wide = (0, 2, 8, 32) if args.quick else WIDE_GRID
    steps = args.steps or (12 if args.quick else 20)
    warmup = args.warmup or (2 if args.quick else 3)
    reps = args.h2h_reps if args.h2h_reps is not None else (1 if args.quick else 2)
    rows = []
    for name in names:
        rows.append(default_run_row(name, wide, reps, steps, warmup))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {"benchmark": "recommendation-defaults", "mode": "quick" if args.quick else "full",
              "wide_grid": list(wide), "steps": steps, "warmup": warmup, "ranks": _bench.NPROC,
              "scenarios": rows, "machine": _bench.machine()}
    _bench.finish("recommendation", result)
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--scenarios", default=None, help="comma list of " + ",".join(SCENARIOS))
    parser.add_argument("--num-workers", default=None)
    parser.add_argument("--prefetch-factor", default="2,4")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--fixed-reps", type=int, default=None)
    parser.add_argument("--h2h-reps", type=int, default=None,
                        help="head-to-head probes of each choice when they differ")
    parser.add_argument("--defaults", action="store_true",
                        help="default-run scenarios against a wide worker grid")
    args = parser.parse_args(argv)
    if args.defaults:
        return defaults_main(args)
    scenarios = (args.scenarios or ("io_bound" if args.quick else ",".join(SCENARIOS))).split(",")
    workers = args.num_workers or ("0,2" if args.quick else "0,1,2,4")
    steps = args.steps or (15 if args.quick else 30)
    warmup = args.warmup or (3 if args.quick else 5)
    fixed_reps = args.fixed_reps or (1 if args.quick else 3)
    if args.h2h_reps is None:
        args.h2h_reps = 2 if args.quick else 4
    axes = ["--num-workers", workers, "--prefetch-factor", args.prefetch_factor]
    info = _bench.machine()
    rows = []
    for index, name in enumerate(scenarios):
        order = ("grid", "adaptive") if index % 2 == 0 else ("adaptive", "grid")
        runs = {s: run_sweep(SCENARIOS[name], s, axes, steps, warmup) for s in order}
        errors = {s: r["error"] for s, r in runs.items() if "error" in r}
        row = {"scenario": name, "args": " ".join(SCENARIOS[name])}
        row.update({"errors": errors} if errors else compare(runs["grid"], runs["adaptive"]))
        if not errors:
            row.update(_head_to_head_row(name, row, args.h2h_reps, steps, warmup))
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    fixed = fixed_cost(fixed_reps)
    print(json.dumps({"fixed_cost": fixed}), file=sys.stderr, flush=True)
    quality = [r["adaptive_vs_grid_best"] for r in rows if r.get("adaptive_vs_grid_best")]
    walls = [r["wall_ratio"] for r in rows if r.get("wall_ratio")]
    result = {
        "benchmark": "recommendation", "mode": "quick" if args.quick else "full",
        "axes": " ".join(axes), "steps": steps, "warmup": warmup, "ranks": _bench.NPROC,
        "min_adaptive_vs_grid_best": min(quality) if quality else None,
        "max_wall_ratio": max(walls) if walls else None,
        "targets": {"adaptive_vs_grid_best": TARGET_QUALITY, "wall_ratio": TARGET_WALL},
        "quality_within_target": bool(quality) and min(quality) >= TARGET_QUALITY,
        "wall_within_target": bool(walls) and max(walls) <= TARGET_WALL,
        "scenarios": rows, "fixed_cost": fixed, "machine": info,
    }
    _bench.finish("recommendation", result, argv)
    return result


if __name__ == "__main__":
    main()
