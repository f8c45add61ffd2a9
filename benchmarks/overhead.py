"""Step-time overhead of ddp-profile's instrumentation, next to torch.profiler and gpuprof.

One compute-bound 2-rank DDP workload (``benchmarks/workloads/bench_train.py``, an MLP with
``--hidden 1024 --layers 3 --batch-size 64``, gloo on CPU) times its own steps with
``time.perf_counter`` in four variants:

* ``plain``: ``python -m torch.distributed.run --standalone --nproc-per-node 2``;
* ``ddp_profile``: the same launch as a ddp-profile probe (start-up hook, DataLoader and
  optimizer patches, per-step records, telemetry samplers), with a step budget the script's own
  loop never reaches, so the script ends itself as it does plainly;
* ``torch_profiler``: the loop inside ``torch.profiler.profile`` with
  ``schedule(wait=1, warmup=1, active=3, repeat=0)`` (CPU activities, ``prof.step()`` per step);
* ``gpuprof``: the loop inside ``gpuprof.profile(...)`` (its two-line integration; it runs on a
  machine without a GPU). Left out, with the reason in the JSON, if gpuprof is not installed.

The variants are interleaved: every repetition runs each once, in a rotated order, and the
ratio of each variant's median step time (slowest rank) to the plain run of the same
repetition is taken; the figure is the median of those ratios over the repetitions.

    python benchmarks/overhead.py --quick        # 2 repetitions x 40 steps (~4 min, 2 busy cores)
    python benchmarks/overhead.py                # 5 repetitions x 200 steps

**In one process** (``in_process``): separate launches a minute apart differ by more than the
1 % to resolve, on this kind of machine by up to 30 %. So each repetition also runs the
ddp-profile probe once with ``--toggle-instrumentation 20`` (1000 steps, ``--quick`` 240): the
workload removes and re-applies ddp-profile's patches in blocks of 20 steps, in the order
on-off, off-on, on-off ... (ABBA, so neither kind of block always comes first), and each pair
of neighbouring blocks gives the ratio of their median step times (the mean over the ranks).
``in_process.ratio`` is the median over every pair of every repetition, ``ci95`` its bootstrap
interval (repetitions, then pairs, resampled); ``patched_block_first`` and
``unpatched_block_first`` split it by the order within the pair. The telemetry samplers run
through both kinds of block; their steady CPU (one host and one GPU tick per 0.5 s, measured
in the same run by ``benchmarks/sampler_cost.py``'s functions) is added in
``in_process.with_samplers``; ``in_process.samplers.window`` also counts their start. The
workload also clocks the time spent inside ddp-profile's step hooks while patched:
``hook_share`` of the median step is the direct cost, ``direct_with_samplers`` that plus the
samplers.

    python benchmarks/overhead.py --in-process-only --reps 6    # the A/B alone, ~4 min

``--device cuda`` runs the workload on the GPU (one rank per GPU, DDP over nccl, batches copied
with ``non_blocking=True``; ``benchmarks/gpu_check.py`` runs it so); ``--workload "ARGS"``
replaces the workload's arguments (e.g. a model large enough that the GPU, not the host, sets
the pace).

The last line printed is a JSON object; ``in_process.with_samplers`` is the headline
(target <= 1.01); ``ratio_vs_plain.ddp_profile`` is the same between launches.
``cpu_ratio_vs_plain`` is the same ratio for the median CPU time per step (every thread of the
rank): on a shared, noisy machine the wall-clock ratio of two launches a minute apart swings by
several percent either way, the CPU-time ratio much less.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench  # noqa: E402

TARGET = 1.01
IN_PROCESS_BLOCK = 20  # steps per patched or unpatched block of the in-process A/B
WORKLOAD_ARGS = ["--hidden", "1024", "--layers", "3", "--batch-size", "64"]


WORKLOAD = {"args": list(WORKLOAD_ARGS), "device": "cpu"}  # set once by main()


def workload_args() -> list[str]:
    return [*WORKLOAD["args"], "--device", WORKLOAD["device"]]


def use_workload(device: str, args: str | None) -> None:
    """The workload's arguments and device for this run; on CUDA one rank per GPU (nccl
    allows one rank per device), as many as are visible, 2 at most."""
    if args is not None:
        WORKLOAD["args"] = args.split()
    WORKLOAD["device"] = device
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("overhead.py --device cuda: this machine has no CUDA device")
        _bench.use_ranks(min(2, torch.cuda.device_count()))


def sampler_share() -> dict:
    """The telemetry samplers' CPU as a share of one core (``benchmarks/sampler_cost.py``).

    ``steady``: one host tick (a rank-like process: 32 threads, 4 worker children) plus one GPU
    tick (through the benchmark's NVML stand-in, Python in place of NVML's C calls) per 0.5 s
    interval: what the samplers take from measured steps. ``window``: the process CPU over 5 s
    with the samplers against 5 s without, their start included (once per probe, during warm-up).
    Either is charged wholly to the step time: a pessimistic bound on what they add to it.
    """
    import contextlib
    import io

    import sampler_cost

    with contextlib.redirect_stdout(io.StringIO()):
        measured = sampler_cost.main(["--quick"])
    ticks = measured["per_tick_cpu_us"]
    steady = (ticks["host"] + ticks["gpu_stand_in"]) / 1e6 / measured["interval_s"]
    return {"steady": round(steady, 5),
            "window": round(measured["cpu_percent_of_one_core"] / 100, 5),
            "per_tick_cpu_us": ticks}


def gpuprof_status() -> tuple[bool, str]:
    version = _bench.package_version("gpuprof")
    if version is None:
        return False, "gpuprof is not installed (pip install gpuprof==0.7.1)"
    return True, f"gpuprof {version}"


def run_variant(variant: str, steps: int, warmup: int, pin_core: bool = False) -> dict:
    work = _bench.scratch(f"overhead-{variant}-")
    args = [*workload_args(), "--steps", str(steps), "--warmup", str(warmup),
            *(["--pin-core"] if pin_core else [])]
    try:
        if variant == "ddp_profile":
            result = _bench.run_instrumented(args, work, warmup=warmup)
            result["status"] = result["entry"]["status"]
        else:
            profiler = {"plain": "none", "torch_profiler": "torch", "gpuprof": "gpuprof"}[variant]
            result = _bench.run_plain([*args, "--profiler", profiler], work)
            result["status"] = "ok" if result["returncode"] == 0 else "crash"
            if variant == "gpuprof":
                result["gpuprof_steps_recorded"] = _gpuprof_steps(work)
        result["median_step_s"] = _bench.slowest_median(result)
        result["median_step_cpu_s"] = _bench.slowest(result, "median_step_cpu_s")
        return result
    finally:
        _bench.cleanup(work)


def run_in_process(steps: int, warmup: int, every: int, pin_core: bool) -> dict:
    """One probe whose workload toggles the instrumentation in ABBA blocks of ``every`` steps.

    A pair's ratio is the mean over the ranks of (median patched step / median unpatched step)
    in log terms (the ranks wait for each other at every step, so their ratios are not
    independent); ``hook_share`` is the time inside ddp-profile's step hooks over the median
    patched step, the mean over the ranks.
    """
    work = _bench.scratch("overhead-inproc-")
    args = [*workload_args(), "--steps", str(steps), "--warmup", str(warmup),
            "--toggle-instrumentation", str(every), *(["--pin-core"] if pin_core else [])]
    try:
        result = _bench.run_instrumented(args, work, warmup=warmup)
        toggles = [r["toggle"] for r in result["ranks"] if r.get("toggle")]
        if len(toggles) != _bench.NPROC or not all(t["pair_ratios"] for t in toggles):
            return {"ratio": None, "pair_ratios": [], "pair_on_first": [], "hook_share": None,
                    "error": _failure(result, len(toggles))}
        pairs = min(len(t["pair_ratios"]) for t in toggles)
        pair_ratios = [math.exp(statistics.fmean(math.log(t["pair_ratios"][i]) for t in toggles))
                       for i in range(pairs)]
        return {"ratio": _bench.rnd(statistics.median(pair_ratios)),
                "pair_ratios": [round(r, 4) for r in pair_ratios],
                "pair_on_first": toggles[0]["pair_on_first"][:pairs],
                "hook_us_per_step": _bench.rnd(statistics.fmean(
                    t["hook_us_per_step"] for t in toggles), 2),
                "hook_cpu_us_by_hook": toggles[0].get("hook_cpu_us_by_hook"),
                "hook_share": statistics.fmean(t["hook_share"] for t in toggles)}
    finally:
        _bench.cleanup(work)


def _failure(result: dict, toggled: int) -> str:
    """Why an A/B launch gave no ratio: its exit status, the ranks that toggled, and the end
    of the launcher's log (where a rank's traceback lands)."""
    try:
        with open(os.path.join(result["probe_dir"], "launcher.log")) as fh:
            tail = " | ".join(line.strip() for line in fh.read().splitlines()[-8:])
    except OSError:
        tail = "no launcher.log"
    return (f"exit {result['returncode']}, {toggled} of {_bench.NPROC} rank(s) toggled: "
            f"{tail}")[:1500]


def pooled_in_process(launches: list[dict], seed: int = 0, draws: int = 4000) -> dict:
    """Every launch's block pairs together: the median pair ratio, its 95 % bootstrap interval
    (launches resampled, then pairs within them), the medians by pair order, the hook share."""
    import random

    usable = [launch for launch in launches if launch.get("pair_ratios")]
    ratios = [r for launch in usable for r in launch["pair_ratios"]]
    if not ratios:
        return {"ratio": None}
    rng = random.Random(seed)
    estimates = []
    for _ in range(draws):
        drawn = []
        for launch in rng.choices(usable, k=len(usable)):
            drawn += rng.choices(launch["pair_ratios"], k=len(launch["pair_ratios"]))
        estimates.append(statistics.median(drawn))
    estimates.sort()
    by_order = {first: [r for launch in usable
                        for r, f in zip(launch["pair_ratios"], launch["pair_on_first"])
                        if f == first] for first in (True, False)}
    hook = [launch["hook_share"] for launch in usable if launch.get("hook_share") is not None]
    return {"ratio": _bench.rnd(statistics.median(ratios)),
            "ci95": [_bench.rnd(estimates[int(0.025 * draws)]),
                     _bench.rnd(estimates[int(0.975 * draws) - 1])],
            "pairs": len(ratios), "launches": len(usable),
            "patched_block_first": _bench.rnd(statistics.median(by_order[True]))
            if by_order[True] else None,
            "unpatched_block_first": _bench.rnd(statistics.median(by_order[False]))
            if by_order[False] else None,
            "hook_share": _bench.rnd(statistics.fmean(hook), 5) if hook else None,
            "hook_us_per_step": _bench.rnd(statistics.fmean(
                launch["hook_us_per_step"] for launch in usable), 2)}


def _gpuprof_steps(work: str) -> int:
    import sqlite3

    path = os.path.join(work, "gpuprof-0.db")
    if not os.path.exists(path):
        return 0
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM steps").fetchone()[0]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 repetitions x 40 steps")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="loop steps per launch")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--variants", default="plain,ddp_profile,torch_profiler,gpuprof")
    parser.add_argument("--in-process-only", action="store_true",
                        help="only the in-process A/B launches (no plain or peer variants)")
    parser.add_argument("--in-process-steps", type=int, default=None,
                        help="steps per in-process launch (default 1000, --quick 240)")
    parser.add_argument("--pin-core", action="store_true",
                        help="pin each rank to one core in every variant (less scheduling "
                             "noise; the samplers then share the rank's core)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--workload", default=None,
                        help=f"the workload's arguments (default: {' '.join(WORKLOAD_ARGS)})")
    args = parser.parse_args(argv)
    use_workload(args.device, args.workload)
    reps = args.reps or (2 if args.quick else 5)
    steps = args.steps or (40 if args.quick else 200)
    variants = [v for v in args.variants.split(",") if v]
    have_gpuprof, gpuprof_note = gpuprof_status()
    if not have_gpuprof and "gpuprof" in variants:
        variants.remove("gpuprof")
    others = [v for v in variants if v != "plain"]
    info = _bench.machine()
    per_rep: list[dict] = []
    inproc_steps = args.in_process_steps or (240 if args.quick else 1000)
    for rep in range(reps):
        every = IN_PROCESS_BLOCK if rep % 2 == 0 else -IN_PROCESS_BLOCK
        if args.in_process_only:
            in_process = run_in_process(inproc_steps, args.warmup, every, args.pin_core)
            print(f"rep {rep} in-process on/off: {in_process['ratio']} (hook share "
                  f"{in_process['hook_share']})", file=sys.stderr, flush=True)
            per_rep.append({"in_process": in_process})
            continue
        rotation = others[rep % len(others):] + others[:rep % len(others)] if others else []
        order = ["plain", *rotation] if rep % 2 == 0 else [*rotation, "plain"]
        medians, cpus, statuses = {}, {}, {}
        for variant in order:
            result = run_variant(variant, steps, args.warmup, args.pin_core)
            medians[variant] = result["median_step_s"]
            cpus[variant] = result["median_step_cpu_s"]
            statuses[variant] = result["status"]
            if variant == "gpuprof":
                statuses["gpuprof_steps_recorded"] = result.get("gpuprof_steps_recorded")
            print(f"rep {rep} {variant}: median step {medians[variant]} s ({result['status']})",
                  file=sys.stderr, flush=True)
        in_process = run_in_process(inproc_steps, args.warmup, every, args.pin_core)
        print(f"rep {rep} in-process on/off: {in_process['ratio']} (hook share "
              f"{in_process['hook_share']})", file=sys.stderr, flush=True)
        plain = medians.get("plain")
        ratios = {v: (medians[v] / plain if plain and medians.get(v) else None) for v in others}
        plain_cpu = cpus.get("plain")
        cpu_ratios = {v: (cpus[v] / plain_cpu if plain_cpu and cpus.get(v) else None)
                      for v in others}
        per_rep.append({"order": order, "median_step_s": {k: _bench.rnd(v, 5)
                                                          for k, v in medians.items()},
                        "median_step_cpu_s": {k: _bench.rnd(v, 5) for k, v in cpus.items()},
                        "ratio_vs_plain": {k: _bench.rnd(v) for k, v in ratios.items()},
                        "cpu_ratio_vs_plain": {k: _bench.rnd(v) for k, v in cpu_ratios.items()},
                        "status": statuses, "in_process": in_process})
    pooled = pooled_in_process([r["in_process"] for r in per_rep])
    inproc = pooled["ratio"]
    hook = pooled.get("hook_share")
    samplers = sampler_share()
    share = samplers["steady"]
    in_process = {**pooled, "samplers": samplers,
                  "with_samplers": _bench.rnd(inproc + share) if inproc else None,
                  "within_target": bool(inproc) and inproc + share <= TARGET,
                  "ci95_with_samplers": [_bench.rnd(pooled["ci95"][0] + share),
                                         _bench.rnd(pooled["ci95"][1] + share)]
                  if inproc else None,
                  "direct_with_samplers": _bench.rnd(1 + hook + share, 5)
                  if hook is not None else None,
                  "block_steps": IN_PROCESS_BLOCK, "steps_per_launch": inproc_steps}
    result = {"in_process": in_process, "benchmark": "overhead",
              "mode": "quick" if args.quick else "full",
              "workload": "benchmarks/workloads/bench_train.py " + " ".join(workload_args()),
              "ranks": _bench.NPROC, "reps": reps, "pin_core": args.pin_core,
              "target_ddp_profile": TARGET, "machine": info}
    if not args.in_process_only:
        ratio = {v: _bench.rnd(_bench.median([r["ratio_vs_plain"][v] for r in per_rep]))
                 for v in others}
        cpu_ratio = {v: _bench.rnd(_bench.median([r["cpu_ratio_vs_plain"][v] for r in per_rep]))
                     for v in others}
        spread = {v: [min(vals), max(vals)] if vals else None
                  for v in others
                  for vals in [[r["ratio_vs_plain"][v] for r in per_rep
                                if r["ratio_vs_plain"][v] is not None]]}
        result.update({
            "steps_per_launch": steps, "warmup": args.warmup,
            "median_step_s_plain": _bench.rnd(_bench.median(
                [r["median_step_s"].get("plain") for r in per_rep]), 5),
            "ratio_vs_plain": ratio, "ratio_range": spread,
            "cpu_ratio_vs_plain": cpu_ratio,
            "ddp_profile_within_target": ratio.get("ddp_profile") is not None
            and ratio["ddp_profile"] <= TARGET,
            "gpuprof": gpuprof_note if have_gpuprof else f"not measured: {gpuprof_note}",
            "torch_profiler_schedule": "wait=1, warmup=1, active=3, repeat=0 (CPU activities)"})
    for rep_result in per_rep:  # the pair lists are in the pooled figures; keep the JSON short
        for key in ("pair_ratios", "pair_on_first"):
            rep_result["in_process"].pop(key, None)
    result["per_rep"] = per_rep
    _bench.finish("overhead", result, argv)
    return result


if __name__ == "__main__":
    main()
