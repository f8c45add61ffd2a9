"""How many launches do the futile and unpromising stops save an alternation in launches, and
which answers do they change?

Modelled alternations as ``benchmarks/alternations.py`` makes them (a level still, walking or
swinging, independent noise of ``--noise`` a launch, the candidate's gain), run as the sweep
runs the claim's check and the threads check in launches: ``A B A B A``, then one pair, ``B A``,
at a time while the interval holds a gain, 9 launches at most. Each is run three times:
stopping only where the interval decides (``decide.paired.alternation_open``: the sweep before
the rules), with the futile stop alone, and with ``decide.stopping.alternation_stop`` (decided,
futile or unpromising). Each is read as the rules read it (``decide.paired.paired``): "won"
where faster beyond noise by more than the noise floor. Printed: the mean launches of each, the
share stopped futile and unpromising, and the answers each rule changed (the futile stop, by
construction, none; the unpromising stop: won without it, not with it, and the other way).

    python benchmarks/alternation_stops.py                  # 2,000 alternations a row
    python benchmarks/alternation_stops.py --trials 5000 --noise 0.03

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
from alternations import level  # noqa: E402
from ddp_profile.profiler.decide import stopping  # noqa: E402
from ddp_profile.profiler.decide.choose import ChoiceThresholds  # noqa: E402
from ddp_profile.profiler.decide.paired import alternation_open, paired  # noqa: E402
from ddp_profile.profiler.decide.stopping import FUTILE, UNPROMISING, alternation_stop  # noqa: E402
from ddp_profile.profiler.store.probes import ProbeRecord  # noqa: E402

MAX_LAUNCHES = 9
DEFAULTS = ChoiceThresholds()


def probes(rates: list[float]) -> list[ProbeRecord]:
    """An alternation in launches, A B A ..., each a launch of its own."""
    return [ProbeRecord.from_json({
        "id": f"p{i:03d}", "kind": "threads", "status": "ok", "launch": f"p{i:03d}",
        "config": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                   "batch_size": 64}, "throughput": rate, "steps_measured": 30,
        "pair": {"role": "candidate" if i % 2 else "reference", "index": i, "group": "x"}})
        for i, rate in enumerate(rates)]


def run(rates: list[float], rule: str) -> tuple[int, str, bool]:
    """The launches one alternation runs under ``rule`` ("none", "futile", "both"), how it
    stopped, and whether it won."""
    end, stopped = 5, ""
    establishes = stopping.establishes
    if rule == "futile":
        stopping.establishes = lambda *args: True  # the unpromising stop never fires
    try:
        while True:
            measured = probes(rates[:end])
            if rule != "none":
                stop = alternation_stop(measured, measured, DEFAULTS, MAX_LAUNCHES)
                stopped = stop or ""
                go_on = stop is None
            else:
                go_on = alternation_open(measured, measured, DEFAULTS)
            if not go_on or end >= MAX_LAUNCHES:
                break
            end += 2
    finally:
        stopping.establishes = establishes
    claim = paired(measured, measured, DEFAULTS.interval_confidence, DEFAULTS.launch_sd)
    won = bool(claim and claim.faster and claim.ratio > 1 + DEFAULTS.noise_floor)
    return end, stopped, won


def row(gain: float, form: str, trials: int, noise: float, walk: float, swing: float,
        seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    launches = {"none": 0, "futile": 0, "both": 0}
    futile = unpromising = changed = lost = gained = won = 0
    for _ in range(trials):
        logs = level(form, MAX_LAUNCHES, rng, walk, swing) + rng.normal(0.0, noise, MAX_LAUNCHES)
        logs += gain * (np.arange(MAX_LAUNCHES) % 2 == 1)
        rates = [1000.0 * math.exp(v) for v in logs]
        runs = {rule: run(rates, rule) for rule in launches}
        for rule, (end, _, _) in runs.items():
            launches[rule] += end
        futile += runs["futile"][1] == FUTILE
        unpromising += runs["both"][1] == UNPROMISING
        changed += runs["none"][2] != runs["futile"][2]
        lost += runs["futile"][2] and not runs["both"][2]
        gained += runs["both"][2] and not runs["futile"][2]
        won += runs["none"][2]
    return {"launches before": round(launches["none"] / trials, 2),
            "launches futile": round(launches["futile"] / trials, 2),
            "launches after": round(launches["both"] / trials, 2),
            "futile": round(futile / trials, 4), "unpromising": round(unpromising / trials, 4),
            "won": round(won / trials, 4), "answers changed": changed,
            "unpromising lost": lost, "unpromising gained": gained}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--noise", type=float, default=0.03, help="per launch, log scale")
    parser.add_argument("--walk", type=float, default=0.02, help="a launch, log scale")
    parser.add_argument("--swing", type=float, default=0.08, help="amplitude, log scale")
    parser.add_argument("--gains", default="0,0.02,0.05,0.1", help="log gains of the B side")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    figures = {}
    for form in ("still", "walking", "swinging"):
        for gain in (float(g) for g in args.gains.split(",")):
            key = f"{form}, gain {math.exp(gain):.2f}x"
            figures[key] = shares = row(gain, form, args.trials, args.noise, args.walk,
                                        args.swing, args.seed)
            print(f"{key:26s} launches {shares['launches before']:4.2f} -> "
                  f"{shares['launches futile']:4.2f} -> {shares['launches after']:4.2f}  "
                  f"futile {shares['futile']:6.1%}  unpromising {shares['unpromising']:6.1%}  "
                  f"won {shares['won']:6.1%}  changed by futile {shares['answers changed']}, "
                  f"by unpromising {shares['unpromising lost']} lost "
                  f"{shares['unpromising gained']} gained", flush=True)
    _bench.finish("alternation_stops", {"noise": args.noise, "walk": args.walk,
                                        "swing": args.swing, "trials": args.trials,
                                        "figures": figures})


if __name__ == "__main__":
    main()
