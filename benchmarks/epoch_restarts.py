"""Workers restarted every epoch: what ddp-profile reads for each configuration against plain
launches timed over whole epochs.

The built-in workload (2 ms asleep per sample, batch 16, 4,096 samples: 128-step epochs on 2
ranks) starts its DataLoader workers again at every epoch. One `ddp-profile run` measures
0, 5 and 11 workers (grid, no ceiling or communication probes); each configuration's figure as
the script runs it (steady steps plus one restart per epoch, ``store.epochs``) and its rate
between restarts (the prediction for ``persistent_workers=True``) are then compared with plain
torchrun launches of the same script: a launch of 1 epoch and one of EPOCHS, alternating, whose
difference over EPOCHS - 1 epochs is the per-epoch time (start-up and teardown cancel).

    python benchmarks/epoch_restarts.py [--reps 2] [--epochs 5]

``--claim``: the persistent-workers claim checked as a user would. The same workload with
32-step epochs (1,024 samples) and the script's own 2 workers: ``ddp-profile run`` with its
defaults measures ``persistent_workers=True`` against the settings as they are (``A B A B A``
in launches, ``sweep.claim.confirm_persistence``, with the best settings it found); then plain
torchrun launches of the script with those workers, with and without
``--persistent-workers``, alternating, ``--reps`` rounds, each timed over
whole epochs as above. The tool's ratio and interval beside the plain ratio.

    python benchmarks/epoch_restarts.py --claim [--reps 3] [--epochs 6]   (~5 min)

Prints one line per configuration, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import _bench

ARGS = ["--load-ms", "2", "--batch-size", "16"]  # as `ddp-profile demo` runs it
SAMPLES = 4096  # the workload's default dataset: one epoch, all ranks together
WORKERS = (0, 5, 11)


CLAIM_ARGS = ["--load-ms", "2", "--batch-size", "16", "--samples", "1024"]  # 32-step epochs
CLAIM_WORKERS = 2


def plain_seconds(workers: int, epochs: int, persistent: bool, base: list[str] = ARGS
                  ) -> float:
    args = [*base, "--num-workers", str(workers), "--epochs", str(epochs)]
    if persistent:
        args.append("--persistent-workers")
    started = time.perf_counter()
    subprocess.run(_bench.torchrun_command(_bench.DEMO, args), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - started


def plain_rate(workers: int, epochs: int, reps: int, persistent: bool = False) -> float:
    """Samples/s over whole epochs, restarts included: (T(epochs) - T(1)) / (epochs - 1)."""
    per_epoch = []
    for _ in range(reps):
        one = plain_seconds(workers, 1, persistent)
        many = plain_seconds(workers, epochs, persistent)
        per_epoch.append((many - one) / (epochs - 1))
    return SAMPLES / statistics.median(per_epoch)


def tool_rates(out: str) -> dict[int, dict]:
    command = [sys.executable, "-m", "ddp_profile", "run", _bench.DEMO, "--out", out,
               "--num-workers", ",".join(map(str, WORKERS)), "--pin-memory", "false",
               "--prefetch-factor", "2", "--search", "grid", "--no-ceiling", "--no-comm",
               "--no-report", "--quiet", "--", *ARGS]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=900)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    rates: dict[int, dict] = {}
    for probe in summary["probes"]:
        if probe["status"] == "ok" and probe["kind"] in ("baseline", "sweep"):
            rates.setdefault(probe["config"]["num_workers"], probe)
    return rates


def claim(reps: int, epochs: int) -> dict:
    """The tool's measured persistent-workers figure against plain launches, alternating."""
    work = _bench.scratch("ddp-profile-persistent-")
    try:
        out = os.path.join(work, "run")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ddp_profile", "run", _bench.DEMO, "--out", out,
                        "--no-report", "--quiet", "--", *CLAIM_ARGS, "--num-workers",
                        str(CLAIM_WORKERS)], check=True, stdout=subprocess.DEVNULL, timeout=1800)
        tool_s = time.perf_counter() - started
        from ddp_profile.profiler.store.results import load_run
        from ddp_profile.rules import Thresholds, measured_thresholds
        from ddp_profile.rules.alternations import persistent_effect

        run = load_run(out)
        thresholds = measured_thresholds(run, Thresholds())
        effect = persistent_effect(run, thresholds.interval_confidence, thresholds.launch_sd)
        samples = 1024
        # the user's check: the settings the tool measured it with (its recommendation's)
        workers = run.probe(effect.probes[0]).config.num_workers if effect else CLAIM_WORKERS
        per_epoch: dict[bool, list[float]] = {False: [], True: []}
        for rep in range(reps):  # alternating: as is, persistent, as is, ...
            for persistent in ((False, True) if rep % 2 == 0 else (True, False)):
                one = plain_seconds(workers, 1, persistent, CLAIM_ARGS)
                many = plain_seconds(workers, epochs, persistent, CLAIM_ARGS)
                per_epoch[persistent].append((many - one) / (epochs - 1))
        rates = {k: samples / statistics.median(v) for k, v in per_epoch.items()}
        plain = rates[True] / rates[False]
        row = {"num_workers": workers,
               "tool_ratio": _bench.rnd(effect.ratio, 3) if effect else None,
               "tool_interval": [_bench.rnd(x, 3) for x in effect.interval] if effect else None,
               "tool_probes": list(effect.probes) if effect else None,
               "tool_wall_s": _bench.rnd(tool_s, 1),
               "plain_as_is": _bench.rnd(rates[False], 1),
               "plain_persistent": _bench.rnd(rates[True], 1), "plain_ratio": _bench.rnd(plain, 3),
               "inside": bool(effect and effect.interval[0] <= plain <= effect.interval[1])}
        print(f"persistent_workers=True with {workers} workers: tool "
              + (f"{effect.ratio:.2f}x [{effect.interval[0]:.2f}-{effect.interval[1]:.2f}]"
                 if effect else "not measured")
              + f"; plain launches {plain:.2f}x ({rates[True]:,.0f} / {rates[False]:,.0f})",
              flush=True)
        return row
    finally:
        _bench.cleanup(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--claim", action="store_true",
                        help="the persistent-workers claim against plain launches")
    args = parser.parse_args()
    if args.claim:
        _bench.finish("epoch_restarts", {"benchmark": "epoch_restarts", "mode": "claim",
                                         "machine": _bench.machine(), "epochs": args.epochs,
                                         "reps": args.reps,
                                         "claim": claim(args.reps, args.epochs)})
        return
    work = _bench.scratch("ddp-profile-epochs-")
    try:
        tool = tool_rates(os.path.join(work, "run"))
        rows = []
        for workers in WORKERS:
            probe = tool[workers]
            plain = plain_rate(workers, args.epochs, args.reps)
            row = {"num_workers": workers, "tool_as_run": _bench.rnd(probe["throughput"], 1),
                   "plain": _bench.rnd(plain, 1),
                   "ratio": _bench.rnd(probe["throughput"] / plain, 3),
                   "restart_s_per_epoch": probe.get("epoch_restart_s")}
            if workers and probe.get("steady_throughput"):
                persistent = plain_rate(workers, args.epochs, args.reps, persistent=True)
                row.update(tool_between_restarts=_bench.rnd(probe["steady_throughput"], 1),
                           plain_persistent=_bench.rnd(persistent, 1),
                           persistent_ratio=_bench.rnd(probe["steady_throughput"] / persistent,
                                                       3))
            rows.append(row)
            print(f"{workers:>2} workers: tool {row['tool_as_run']:,.0f} as run, plain "
                  f"{row['plain']:,.0f} ({row['ratio']:.2f})"
                  + (f"; between restarts {row['tool_between_restarts']:,.0f}, plain "
                     f"persistent {row['plain_persistent']:,.0f} ({row['persistent_ratio']:.2f})"
                     if "tool_between_restarts" in row else ""), flush=True)
        _bench.finish("epoch_restarts", {"benchmark": "epoch_restarts",
                                         "machine": _bench.machine(), "epochs": args.epochs,
                                         "reps": args.reps, "rows": rows})
    finally:
        _bench.cleanup(work)


if __name__ == "__main__":
    main()
