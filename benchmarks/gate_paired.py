"""How often does the paired gate (``gate --against REF``) cry wolf, and how often does it catch
a real 10 % regression, on a quiet machine and under on/off CPU load?

For each load (``quiet``; ``onoff``: every core busy for a second, idle for a second, the
head-to-head's load) and each pair of sides (``aa``: the reference and the current side the
same code; ``ab``: the current side does more CPU work a step, so that it runs at about 0.90
of the reference), one long alternation of real launches ``A B A B ...`` is measured with
the gate's own machinery (``commands.against.measure_alternation``: 2 torchrun ranks of the
built-in workload, the gate's warm-up by time, each side a script of its own). Then the gate's
sequential rule (``decide.gate.judge`` and ``more``, the default budget) is replayed from every
reference launch of the sequence on: each start is the job the gate would have run had it
started there, with the launches it would have measured. Nothing is modelled; the jobs
overlap (they share launches), so their verdicts are not independent draws, and the figures
say how many launches and starts they rest on.

``--scaled``: also replays the ``aa`` sequences with the current side's rates times 0.90, the
regression on the same real noise.

    python benchmarks/gate_paired.py --launches 31                # 4 sequences x 31 launches
    python benchmarks/gate_paired.py --loads onoff --pairs aa --launches 41
    python benchmarks/gate_paired.py --sequences-in seq.json       # replay stored sequences

The last line printed is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench  # noqa: E402  (puts the repository on the path)
from ddp_profile.commands.against import MEASURE_S  # noqa: E402
from ddp_profile.profiler.decide import gate  # noqa: E402
from ddp_profile.profiler.decide.paired import CANDIDATE, REFERENCE  # noqa: E402
from head_to_head import on_off_load  # noqa: E402

WORKLOAD = ["--hidden", "64", "--layers", "2", "--batch-size", "16", "--num-workers", "0"]
CPU_MS = 1.0  # per sample, in the main process: most of a step is CPU work the load contends for
SLOWER_CPU_MS = 1.25  # the current side of ``ab``: about 10 % slower (1.125 gave 5 %)
WRAPPER = """import runpy
import sys

sys.argv = [{demo!r}, *sys.argv[1:], "--cpu-ms", "{cpu_ms}"]
runpy.run_path({demo!r}, run_name="__main__")
"""


def sequence(pair: str, launches: int, steps: int, warmup: int, measure_s: float
             ) -> list[dict[str, Any]]:
    """One alternation of ``launches`` real launches of the two sides of ``pair``."""
    from ddp_profile.commands.against import PairedRequest, measure_alternation
    from ddp_profile.profiler.settings import LoaderSettings

    work = tempfile.mkdtemp(prefix="gate-paired-")
    try:
        scripts = {}
        for side, cpu_ms in (("reference", CPU_MS),
                             ("current", SLOWER_CPU_MS if pair == "ab" else CPU_MS)):
            scripts[side] = os.path.join(work, f"{side}.py")
            with open(scripts[side], "w", encoding="utf-8") as handle:
                handle.write(WRAPPER.format(demo=_bench.DEMO, cpu_ms=cpu_ms))
        request = PairedRequest(against=scripts["reference"], script=scripts["current"],
                                script_args=tuple(WORKLOAD), out=os.path.join(work, "out"),
                                config=LoaderSettings(), nproc_per_node=_bench.NPROC,
                                steps=steps, warmup=warmup, measure_s=measure_s)
        result = measure_alternation(request, scripts["reference"], "reference", None,
                                     lambda text: print(f"  {text}", flush=True),
                                     fixed=launches)
        return [{"side": launch.side, "rate": launch.rate} for launch in result.launches]
    finally:
        _bench.cleanup(work)


def replay(launches: list[dict[str, Any]], max_launches: int, max_regression: float,
           scale: float = 1.0) -> list[dict[str, Any]]:
    """The gate's job from every reference launch on that leaves room for ``A B A B A``."""
    jobs = []
    for start in range(0, len(launches) - gate.MIN_LAUNCHES + 1, 2):
        window = [gate.Launch(item["side"], index, item["rate"] * (
            scale if item["side"] == CANDIDATE else 1.0))
            for index, item in enumerate(launches[start:])]
        used = gate.MIN_LAUNCHES
        while True:
            verdict = gate.judge(window[:used], max_regression=max_regression)
            if not gate.more(verdict, used, max_launches) or used + 2 > len(window):
                break
            used += 2
        truncated = verdict.basis == gate.STRADDLES and used < max_launches
        jobs.append({"start": start, "launches": used, "status": verdict.status,
                     "ratio": round(verdict.ratio, 4), "truncated": truncated})
    return jobs


def tally(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    whole = [job for job in jobs if not job["truncated"]]  # ran out of sequence, not budget
    count = len(whole)

    def share(status: str) -> Optional[float]:
        return round(sum(job["status"] == status for job in whole) / count, 3) if count else None

    return {"jobs": count, "pass": share(gate.PASS), "regression": share(gate.REGRESSION),
            "inconclusive": share(gate.INCONCLUSIVE),
            "launches_mean": round(statistics.mean(j["launches"] for j in whole), 1)
            if whole else None,
            "launches_max": max((j["launches"] for j in whole), default=None)}


def modelled(sigma: float, ratio: float, trials: int, max_launches: int,
             max_regression: float, seed: int = 0) -> dict[str, Any]:
    """The sequential rule on ``trials`` modelled jobs: each launch's level off by ``sigma``
    (lognormal, the per-launch spread a real sequence showed) on a runner drifting by a
    random walk of ``sigma / 2`` a launch; the current side at ``ratio``. A model, grounded
    on the measured spread: it gives the rates the real sequences are too short to."""
    import numpy as np

    rng = np.random.default_rng(seed)
    jobs = []
    for _ in range(trials):
        drift = np.cumsum(rng.normal(0.0, sigma / 2, max_launches))
        noise = rng.normal(0.0, sigma, max_launches)
        seq = [{"side": REFERENCE if i % 2 == 0 else CANDIDATE,
                "rate": 1000.0 * float(np.exp(drift[i] + noise[i]))
                * (ratio if i % 2 else 1.0)} for i in range(max_launches)]
        jobs += replay(seq, max_launches, max_regression)[:1]
    return tally(jobs)


def fitted_ratio(launches: list[dict[str, Any]]) -> Optional[float]:
    """The whole sequence's fit: the sides' true ratio, as near as this run can tell."""
    verdict = gate.judge([gate.Launch(item["side"], i, item["rate"])
                          for i, item in enumerate(launches)])
    return round(verdict.ratio, 4) if verdict.ratio == verdict.ratio else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="quiet,onoff")
    parser.add_argument("--pairs", default="aa,ab")
    parser.add_argument("--launches", type=int, default=31, help="launches per sequence (odd)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--measure-s", type=float, default=None,
                        help="seconds a launch measures at least (default: the gate's)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--max-launches", type=int, default=gate.DEFAULT_MAX_LAUNCHES)
    parser.add_argument("--max-regression", type=float, default=0.05)
    parser.add_argument("--scaled", action="store_true")
    parser.add_argument("--model-sigma", help="comma list of per-launch spreads: the rule "
                        "on modelled jobs (A/A and a 10 %% regression), no launches")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--sequences-out")
    parser.add_argument("--sequences-in")
    args = parser.parse_args()
    if args.model_sigma:
        rows = {}
        for sigma in (float(v) for v in args.model_sigma.split(",")):
            for label, ratio in (("aa", 1.0), ("10 % slower", 0.90)):
                rows[f"sigma {sigma:g} {label}"] = modelled(
                    sigma, ratio, args.trials, args.max_launches, args.max_regression)
                print(f"sigma {sigma:.3f} {label:12s} {rows[f'sigma {sigma:g} {label}']}")
        _bench.finish("gate_paired", {"modelled": rows, "max_launches": args.max_launches,
                                      "trials": args.trials})
        return
    if args.sequences_in:
        with open(args.sequences_in, encoding="utf-8") as handle:
            sequences = json.load(handle)
    else:
        sequences = {}
        for load in args.loads.split(","):
            for pair in args.pairs.split(","):
                print(f"{load} {pair}: {args.launches} launches", flush=True)
                stop = multiprocessing.Event()
                burner = multiprocessing.Process(target=on_off_load, args=(stop,)) \
                    if load == "onoff" else None
                if burner is not None:
                    burner.start()
                started = time.monotonic()
                try:
                    seq = sequence(pair, args.launches, args.steps, args.warmup,
                                   MEASURE_S if args.measure_s is None else args.measure_s)
                finally:
                    if burner is not None:
                        stop.set()
                        burner.join()
                sequences[f"{load}/{pair}"] = {"launches": seq,
                                               "wall_s": round(time.monotonic() - started, 1)}
        if args.sequences_out:
            with open(args.sequences_out, "w", encoding="utf-8") as handle:
                json.dump(sequences, handle)
    figures: dict[str, Any] = {}
    for key, data in sequences.items():
        seq = data["launches"]
        per_launch = data["wall_s"] / len(seq) if data.get("wall_s") else None
        rows = {"as measured": replay(seq, args.max_launches, args.max_regression)}
        if args.scaled and key.endswith("/aa"):
            rows["current x 0.90"] = replay(seq, args.max_launches, args.max_regression, 0.90)
        for label, jobs in rows.items():
            counted = tally(jobs)
            figures[f"{key} {label}"] = {**counted, "sequence": len(seq),
                                         "sequence_ratio": fitted_ratio(seq),
                                         "wall_s_per_launch": round(per_launch, 1)
                                         if per_launch else None}
            print(f"{key:12s} {label:15s} {counted}  (sequence of {len(seq)}, its ratio "
                  f"{fitted_ratio(seq)})", flush=True)
    _bench.finish("gate_paired", {"max_launches": args.max_launches,
                                  "max_regression": args.max_regression, "steps": args.steps,
                                  "figures": figures})


if __name__ == "__main__":
    main()
