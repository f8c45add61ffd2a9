"""Every claim checked the way a user would: plain launches of the script, old and new
settings alternating, the whole loop timed.

For each workload (``benchmarks/workloads/bench_train.py`` with costs that make a different
bottleneck, 2 CPU ranks), ``ddp-profile run`` with its defaults gives a recommendation, a
claimed speedup and its interval. Then plain ``torchrun`` launches of the same script run the
script's own settings (A) and the recommendation (B) alternately, ``A B A B ...``
(``--rounds`` of each); each launch times its whole loop after the warm-up (mean step, epoch
restarts included) and the check is the ratio of B's mean throughput to A's. Reported per
workload: the claim, its interval, the plain ratio, whether the interval holds it, and the
tool's probes against plain launches of the same settings: each plain launch is followed by a
ddp-profile probe of the same settings (one launch, the run's default steps and warm-up,
every patch and sampler on), so that the two are read close in time (``probe_vs_plain_a``,
``_b``: mean over mean, target within 10 %); beside it the claim's own windows, measured in
the tool's run minutes before (``claim_vs_plain_a``, ``_b``: the machine's drift in between
is in them). Each DDP option the tool measured (alternated with the script's own) is
checked the same way: plain launches with the script's DDP options and with the option,
alternating, beside the tool's figure, interval and verdict; so is ``persistent_workers=True``
where the tool measured it (the recommendation plainly, and with it).

The file-backed workloads read one file per sample (``benchmarks/peers.py``'s 4,096 files of
128 KiB, written once): ``files_cold`` with every file dropped from the page cache before every
launch and each dropped again once read (``--drop-after-read``), so every epoch reads from
storage, as a job whose data does not fit in memory does (the tool told ``--cache cold``);
``files_warm`` with every file read once before every launch. Plain launches cross epochs of
32 steps, the workers starting again at each unless kept.

**A/A** (``--aa N``): N alternations of one configuration with itself (``A A A A A A A``
labelled as a claim's alternation, one launch each time, the harness's own windows) while
another process loads the CPUs on and off (1 s busy on every core, 1 s idle): how often the
tool's interval for "B over A" excludes 1.0, that is, calls two identical configurations
different beyond noise (target at most 5 %).

    python benchmarks/head_to_head.py --quick     # 2 workloads, 2 rounds, A/A x 6 (~10 min)
    python benchmarks/head_to_head.py             # 7 workloads, 3 rounds, A/A x 10 (~27 min)

``--probe-check [KEY=VALUE ...]``: only the probes against plain launches, of each workload's
own settings (or these over them), ``--rounds`` times (8): a plain launch, then a probe.

    python benchmarks/head_to_head.py --workloads files_warm --probe-check          # ~4 min
    python benchmarks/head_to_head.py --workloads latency_bound --probe-check \
        num_workers=13 prefetch_factor=4                                            # ~4 min

The last line printed is a JSON object. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench  # noqa: E402


@dataclass(frozen=True)
class Workload:
    args: tuple[str, ...]  # bench_train.py's arguments
    steps: int  # a plain launch's loop, warm-up included
    cache: Optional[str] = None  # the files' page-cache state before every launch (_bench)
    tool_args: tuple[str, ...] = ()  # ddp-profile's own, beyond its defaults


FILES = ("--files", _bench.FILES_DIR, "--batch-size", "64")
WORKLOADS: dict[str, Workload] = {
    "latency_bound": Workload(("--load-ms", "3", "--batch-size", "8"), 240),
    "cpu_bound": Workload(("--cpu-ms", "2", "--batch-size", "8"), 160),
    "mixed": Workload(("--load-ms", "1.5", "--cpu-ms", "1.5", "--batch-size", "8"), 200),
    "deep_mlp": Workload(("--hidden", "256", "--layers", "24", "--batch-size", "64",
                          "--num-workers", "2"), 200),
    "comm_bound": Workload(("--hidden", "1024", "--layers", "4", "--batch-size", "4"), 120),
    # one file per sample: every read from storage (as a job whose data does not fit in the
    # page cache reads them: the files dropped before every launch and each once read, the
    # tool told --cache cold), or every file in the page cache; plain launches cross epochs of
    # 32 steps, the workers starting again at each unless kept
    "files_cold": Workload((*FILES, "--drop-after-read"), 200, cache="cold",
                           tool_args=("--cache", "cold")),
    "files_warm": Workload(FILES, 200, cache="warm"),
}
QUICK = ("latency_bound", "deep_mlp")
WARMUP = 10


def settings_args(config: dict[str, Any]) -> list[str]:
    """bench_train.py's own arguments for a configuration."""
    args = ["--num-workers", str(config.get("num_workers") or 0)]
    if config.get("batch_size"):
        args += ["--batch-size", str(config["batch_size"])]
    if config.get("num_workers") and config.get("prefetch_factor"):
        args += ["--prefetch-factor", str(config["prefetch_factor"])]
    if config.get("pin_memory"):
        args.append("--pin-memory")
    return args


def plain_rate(args: list[str], steps: int, cache: Optional[str] = None) -> Optional[float]:
    """Global samples/s of a plain launch's whole loop after the warm-up (the slower rank),
    the files put in ``cache``'s state first. A launch whose ranks all wrote their figures
    measured its whole loop, whatever its exit status: a gloo rank here aborts now and then in
    torch's teardown after it ("terminate called without an active exception", 1 launch in
    6), for either side alike. The warm-up also takes the batches prefetched while the workers
    started (``settings.backlog_warmup``), and the loop then times as many steps as with the
    plain warm-up: 24 workers prefetching 4 batches each stock 96 batches, which a 240-step
    loop takes without waiting and reads faster than the job runs after them."""
    from ddp_profile.profiler.settings import backlog_warmup

    def given(flag: str) -> Optional[int]:
        value = _flag(args, flag)
        return int(value) if value is not None else None

    batch = given("--batch-size") or 16
    warmup = backlog_warmup(WARMUP, given("--num-workers"), given("--prefetch-factor"))
    work = _bench.scratch("h2h-plain-")
    try:
        _bench.set_cache(cache)
        result = _bench.run_plain([*args, "--steps", str(steps + warmup - WARMUP),
                                   "--warmup", str(warmup)], work)
        if len(result["ranks"]) < _bench.NPROC:
            return None
        mean_step = max(r["mean_step_s"] for r in result["ranks"])
        return _bench.NPROC * batch / mean_step
    finally:
        _bench.cleanup(work)


def ledger_measurer(work: str, args: list[str], cache: str = "auto") -> Any:
    """The tool's own measurer over a fresh run directory under ``work``: the workload run
    with ``args`` (its loop long enough for any probe), the run's default steps and warm-up."""
    from ddp_profile.commands.project_config import RUN_DEFAULTS
    from ddp_profile.profiler.launch.ranks import LaunchSpec
    from ddp_profile.profiler.store.rundir import RunDir
    from ddp_profile.profiler.sweep.measure import LedgerMeasurer

    run_dir = RunDir(os.path.join(work, "run"))
    run_dir.create({"script": _bench.WORKLOAD})
    spec = LaunchSpec(script=_bench.WORKLOAD, script_args=(*args, "--steps", "100000"),
                      nproc_per_node=_bench.NPROC)
    return LedgerMeasurer(run_dir, spec, steps=RUN_DEFAULTS["steps"],
                          warmup=RUN_DEFAULTS["warmup"], timeout_s=300, cache=cache)


def probe_rate(args: list[str], config: dict[str, Any], cache: Optional[str],
               persistent: bool = False, samples_s: Optional[float] = None) -> Optional[float]:
    """Global samples/s of one ddp-profile probe of ``config`` (the script run with ``args``,
    its settings overridden as the tool does; the run's default steps and warm-up, every
    patch and sampler on), the files put in ``cache``'s state first; None where it failed.
    ``samples_s``: the rate it is expected to run at (the plain launch's), from which the
    probe sizes its measurement as the tool does from its prediction (``burst_steps``)."""
    from ddp_profile.profiler.settings import LoaderSettings
    from ddp_profile.profiler.store.probes import Kind
    from ddp_profile.profiler.sweep.state import Window

    work = _bench.scratch("h2h-probe-")
    try:
        measurer = ledger_measurer(work, args, "cold" if cache == "cold" else "auto")
        _bench.set_cache(cache)
        batch = config.get("batch_size") or 16
        entry = measurer.measure(Window(
            LoaderSettings.from_dict(config), Kind.SWEEP,
            steps_per_s=samples_s / (_bench.NPROC * batch) if samples_s else None,
            persistent_workers=True if persistent else None))
        return float(entry.throughput) if entry.ok and entry.throughput else None
    finally:
        _bench.cleanup(work)


def alternate(a_args: list[str], b_args: list[str], steps: int, rounds: int,
              cache: Optional[str], probes: Optional[tuple[list[str], dict, dict, bool]] = None
              ) -> dict[str, Any]:
    """Plain launches of A and B alternating, ``rounds`` of each: the ratio of B's mean
    throughput to A's. With ``probes`` (the script's own arguments, A's settings, B's, and
    whether B keeps its workers), a ddp-profile probe of each side follows that side's plain
    launch, so the tool's probes are read against plain launches of the same settings close
    in time (``probe_vs_plain_a``, ``_b``: mean over mean)."""
    a_rates, b_rates, a_probes, b_probes = [], [], [], []
    for _ in range(rounds):  # A B A B ..., each plain launch followed by its probe
        a_rates.append(plain_rate(a_args, steps, cache))
        if probes:
            a_probes.append(probe_rate(probes[0], probes[1], cache, samples_s=a_rates[-1]))
        b_rates.append(plain_rate(b_args, steps, cache))
        if probes:
            b_probes.append(probe_rate(probes[0], probes[2], cache, probes[3], b_rates[-1]))
    if None in a_rates or None in b_rates:
        return {"error": "a plain launch failed", "a": a_rates, "b": b_rates}
    result = {"a_samples_s": [round(r, 1) for r in a_rates],
              "b_samples_s": [round(r, 1) for r in b_rates],
              "ratio": round(statistics.fmean(b_rates) / statistics.fmean(a_rates), 3)}
    for side, rates, plain in (("a", a_probes, a_rates), ("b", b_probes, b_rates)):
        if rates and None not in rates:
            result[f"probe_samples_s_{side}"] = [round(r, 1) for r in rates]
            result[f"probe_vs_plain_{side}"] = round(
                statistics.fmean(rates) / statistics.fmean(plain), 3)
    return result


def judged(check: dict[str, Any], interval: Optional[list[float]]) -> dict[str, Any]:
    """``check`` with ``inside``: whether the tool's interval holds the plain ratio."""
    if "ratio" in check:
        check["inside"] = bool(interval) and interval[0] <= check["ratio"] <= interval[1]
    return check


def run_tool(work_load: Workload) -> dict[str, Any]:
    """``ddp-profile run`` with its defaults; its summary, and the persistent-workers effect
    it measured (``rules.alternations.persistent_effect``, read from the run directory)."""
    from ddp_profile.profiler.settings import GRADIENT_SYNC
    from ddp_profile.profiler.store.results import load_run
    from ddp_profile.rules.alternations import alternated_effects, persistent_effect, sides
    from ddp_profile.rules.base import Thresholds

    work = _bench.scratch("h2h-run-")
    out = os.path.join(work, "run")
    command = [sys.executable, "-m", "ddp_profile", "run", _bench.WORKLOAD, "--out", out,
               "--no-report", "--quiet", *work_load.tool_args, "--", *work_load.args,
               "--steps", "100000"]
    _bench.set_cache(work_load.cache)
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:], "wall_s": round(wall, 1)}
    with open(os.path.join(out, "summary.json")) as handle:
        summary = json.load(handle)
    summary["_wall_s"] = wall
    thresholds = Thresholds()
    run = load_run(out)
    kept = persistent_effect(run, thresholds.interval_confidence, thresholds.launch_sd)
    summary["_persistent"] = None if kept is None else {
        "claim": round(kept.ratio, 3), "interval": [round(v, 3) for v in kept.interval],
        "faster_beyond_noise": kept.faster,
        # the script's settings against another configuration kept alive: where faster, the
        # recommendation and its claim (checked as the claim)
        "against_own": len({json.dumps(side, sort_keys=True) for side in sides(run, kept)}) > 1}
    summary["_ddp_effects"] = [  # every DDP option alternated with the script's own
        {"options": effect.options, "claim": round(effect.ratio, 3),
         "interval": [round(v, 3) for v in effect.interval or ()],
         "faster_beyond_noise": effect.faster}
        for effect in alternated_effects(run, thresholds.interval_confidence,
                                         thresholds.launch_sd).values()
        if GRADIENT_SYNC not in effect.options]
    _bench.cleanup(work)
    return summary


def workload(name: str, rounds: int) -> dict[str, Any]:
    spec = WORKLOADS[name]
    summary = run_tool(spec)
    if "error" in summary:
        return {"workload": name, **summary}
    own, new = summary["baseline"], summary["recommended"]
    base_args = _without_settings(list(spec.args))
    result: dict[str, Any] = {
        "workload": name, "baseline": own, "recommended": new,
        "claim": _bench.rnd(summary.get("expected_speedup"), 3),
        "interval": [_bench.rnd(v, 3) for v in summary.get("expected_speedup_interval") or []],
        "basis": (summary.get("recommendation") or {}).get("speedup_basis"),
        "tool_wall_s": round(summary["_wall_s"], 1), "probes": len(summary["probes"])}
    a_args, b_args = base_args + settings_args(own), base_args + settings_args(new)
    kept = summary["_persistent"]
    as_claim = bool(kept and kept["against_own"]
                    and (summary.get("recommendation") or {}).get("persistent_workers"))
    if as_claim:  # the recommendation keeps its workers alive: so do its plain launches
        b_args.append("--persistent-workers")
        result["recommended"] = {**new, "persistent_workers": True}
    if own == new:
        result["plain"] = "same settings: nothing to check"
    else:
        result["plain"] = judged(alternate(
            a_args, b_args, spec.steps, rounds, spec.cache,
            probes=(a_args, dict(own), dict(new), as_claim)), result["interval"])
        if "ratio" in result["plain"]:
            result["plain"].update(probes_vs_plain(summary, result["plain"],
                                                   "persistent" if as_claim else "paired"))
    result["ddp_options"] = ddp_checks(summary, a_args, spec.steps, rounds)
    if kept is not None and not kept["against_own"]:  # the recommendation, and with it
        result["persistent_workers"] = {**kept, "plain": judged(alternate(
            b_args, b_args + ["--persistent-workers"], spec.steps, rounds, spec.cache),
            kept["interval"])}
    return result


def probes_vs_plain(summary: dict[str, Any], plain: dict[str, Any], kind: str = "paired"
                    ) -> dict[str, Any]:
    """The tool's own alternation (its probes of ``kind``, in its run, minutes before) against
    plain launches of the same settings (``claim_vs_plain_a``, ``_b``)."""
    paired = [p for p in summary["probes"] if p["kind"] == kind and p["status"] == "ok"]
    out = {}
    for side, role, rates in (("a", "reference", plain["a_samples_s"]),
                              ("b", "candidate", plain["b_samples_s"])):
        probes = [p["throughput"] for p in paired if p["pair"]["role"] == role]
        out[f"claim_vs_plain_{side}"] = _bench.rnd(
            statistics.fmean(probes) / statistics.fmean(rates), 3) if probes else None
    return out


def _flag(args: list[str], flag: str) -> Optional[str]:
    """The value given to ``flag`` in bench_train.py's ``args``, or None."""
    return args[args.index(flag) + 1] if flag in args else None


def own_settings(args: list[str]) -> dict[str, Any]:
    """The loader settings bench_train.py runs with ``args``."""
    workers = int(_flag(args, "--num-workers") or 0)
    prefetch = _flag(args, "--prefetch-factor")
    return {"num_workers": workers, "pin_memory": "--pin-memory" in args,
            "prefetch_factor": int(prefetch) if prefetch and workers else None,
            "batch_size": int(_flag(args, "--batch-size") or 16)}


def probe_check(name: str, rounds: int, settings: dict[str, Any]) -> dict[str, Any]:
    """The tool's probe of one configuration (the workload's own settings, ``settings`` over
    them) against plain launches of it: ``rounds`` times a plain launch, then a probe sized
    from its rate; mean over mean (``probe_vs_plain``) and each round's ratio. Longer than the
    three rounds of a claim's check, it tells a bias of the probes from launch noise."""
    spec = WORKLOADS[name]
    script_args = list(spec.args)
    config = {**own_settings(script_args), **settings}
    plain_args = _without_settings(script_args) + settings_args(config)
    plain, probes = [], []
    for _ in range(rounds):
        plain.append(plain_rate(plain_args, spec.steps, spec.cache))
        probes.append(probe_rate(script_args, config, spec.cache, samples_s=plain[-1]))
    pairs = [(p, q) for p, q in zip(plain, probes) if p and q]
    result: dict[str, Any] = {"workload": name, "config": config, "rounds": rounds,
                              "plain_samples_s": [_bench.rnd(r, 1) for r in plain],
                              "probe_samples_s": [_bench.rnd(r, 1) for r in probes]}
    if len(pairs) < rounds:
        result["error"] = f"{rounds - len(pairs)} round(s) failed"
    if pairs:
        result["probe_vs_plain"] = round(statistics.fmean(q for _, q in pairs)
                                         / statistics.fmean(p for p, _ in pairs), 3)
        result["round_ratios"] = [round(q / p, 3) for p, q in pairs]
    return result


def _setting(text: str) -> tuple[str, Any]:
    from ddp_profile.profiler.settings import SETTING_KEYS

    key, _, value = text.partition("=")
    if key not in SETTING_KEYS:
        raise argparse.ArgumentTypeError(f"not a loader setting: {key}")
    if key == "pin_memory":
        return key, value.lower() in ("1", "true")
    return key, None if value.lower() in ("", "none") else int(value)


def option_args(options: dict[str, Any]) -> Optional[list[str]]:
    """bench_train.py's arguments for DDP options (None: one it cannot set)."""
    args: list[str] = []
    for key, value in options.items():
        if key == "bucket_cap_mb":
            args += ["--bucket-cap-mb", str(value)]
        elif key == "gradient_as_bucket_view" and value is True:
            args.append("--gradient-as-bucket-view")
        else:
            return None
    return args


def ddp_checks(summary: dict[str, Any], args: list[str], steps: int, rounds: int
               ) -> list[dict[str, Any]]:
    """Every DDP option the tool alternated with the script's own: its figure, interval and
    verdict (``rules.alternations.alternated_effects``, as the rules read them) beside plain
    launches with and without it, alternating."""
    checks = []
    for effect in summary["_ddp_effects"]:
        extra = option_args(effect["options"])
        if extra is not None:
            checks.append({**effect, "plain": judged(
                alternate(args, args + extra, steps, rounds, None), effect["interval"])})
    return checks


def _without_settings(args: list[str]) -> list[str]:
    """``args`` without the loader settings a configuration sets (they follow it)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--num-workers", "--batch-size", "--prefetch-factor"):
            skip = True
            continue
        if arg != "--pin-memory":
            out.append(arg)
    return out


def _burn(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def on_off_load(stop: Any) -> None:
    """Every core busy for a second, then idle for a second, until ``stop`` is set."""
    cores = len(os.sched_getaffinity(0))
    while not stop.is_set():
        burners = [multiprocessing.Process(target=_burn, args=(time.monotonic() + 1.0,))
                   for _ in range(cores)]
        for burner in burners:
            burner.start()
        for burner in burners:
            burner.join()
        stop.wait(1.0)


def aa_trial(index: int, args: list[str]) -> Optional[bool]:
    """One alternation of a configuration with itself; True where the tool's interval of the
    'speedup' excludes 1.0 (a false claim), None where a window failed."""
    from ddp_profile.profiler.decide.paired import order
    from ddp_profile.profiler.settings import LoaderSettings
    from ddp_profile.profiler.store.results import load_run
    from ddp_profile.profiler.sweep.state import Window
    from ddp_profile.rules.alternations import paired_claim
    from ddp_profile.rules.base import Thresholds

    work = _bench.scratch("h2h-aa-")
    try:
        measurer = ledger_measurer(work, args)  # 30 steps, 5 of warm-up
        config = LoaderSettings(num_workers=2, pin_memory=False, prefetch_factor=2)
        entries = measurer.measure_screen([
            Window(config, "paired", pair={"role": role, "index": i, "group": f"aa{index}"})
            for i, role in enumerate(order(3))])
        if len(entries) < 7 or any(not e.ok for e in entries):
            return None
        run = load_run(measurer.run_dir.path)
        claim = paired_claim(run, entries[0], entries[1], Thresholds().interval_confidence)
        if claim is None:
            return None
        return not claim.interval[0] <= 1.0 <= claim.interval[1]
    finally:
        _bench.cleanup(work)


def aa(trials: int) -> dict[str, Any]:
    stop = multiprocessing.Event()
    load = multiprocessing.Process(target=on_off_load, args=(stop,))
    load.start()
    try:
        outcomes = [aa_trial(i, ["--load-ms", "1", "--batch-size", "8"]) for i in range(trials)]
    finally:
        stop.set()
        load.join()
    judged = [o for o in outcomes if o is not None]
    return {"trials": trials, "judged": len(judged), "false_claims": sum(judged),
            "false_claim_rate": round(sum(judged) / len(judged), 3) if judged else None,
            "target": 0.05}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--aa", type=int, default=None, help="A/A trials (0: none)")
    parser.add_argument("--workloads", default=None, help="comma list of " + ",".join(WORKLOADS))
    parser.add_argument("--probe-check", nargs="*", type=_setting, default=None,
                        metavar="KEY=VALUE", help="only the probes against plain launches of "
                        "each workload's settings (these over them), --rounds times (8)")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n] if args.workloads is not None \
        else list(QUICK if args.quick else WORKLOADS)  # --workloads "": the A/A alone
    rounds = args.rounds or (2 if args.quick else 3)
    if any(WORKLOADS[n].cache for n in names):
        _bench.ensure_files()
    if args.probe_check is not None:
        checks = [probe_check(name, args.rounds or 8, dict(args.probe_check)) for name in names]
        _bench.finish("head_to_head", {"benchmark": "head_to_head", "mode": "probe_check",
                                       "machine": _bench.machine(), "checks": checks})
        return
    results = []
    for name in names:
        results.append(workload(name, rounds))
        print(json.dumps(results[-1]), flush=True)
    checks = [r["plain"]["inside"] for r in results
              if isinstance(r.get("plain"), dict) and "inside" in r["plain"]]
    checks += [c["plain"]["inside"] for r in results for c in r.get("ddp_options") or []
               if "inside" in c["plain"]]
    checks += [r["persistent_workers"]["plain"]["inside"] for r in results
               if "inside" in (r.get("persistent_workers") or {}).get("plain", {})]
    trials = args.aa if args.aa is not None else (6 if args.quick else 10)
    aa_result = aa(trials) if trials else None
    _bench.finish("head_to_head", {"benchmark": "head_to_head", "machine": _bench.machine(),
                                   "workloads": results, "claims_inside": sum(checks),
                                   "claims_checked": len(checks), "aa": aa_result})


if __name__ == "__main__":
    main()
