"""How ``benchmarks/peers.py`` runs each tool on a workload and reads its answer.

Every runner returns a dict with ``status`` ("ok", or why not), ``wall_s`` (launch to answer)
and, where the tool gives them, ``recommended`` (a configuration of ``peers_train.py``'s
settings: num_workers, prefetch_factor, batch_size, threads) and ``verdicts`` (the tool's own
words, mapped to causes by ``_verdicts``). Each run gets its own scratch directory.

How each is run: ddp-profile on the unmodified script (its CLI); loadtune on
``workloads/peers_loadtune.py``; the SDK peers on ``workloads/peers_train.py`` with their
own lines switched on, 2 ranks under torchrun: traceml-ai (``--traceml``) through
``traceml run``, read from its ``final_summary.json``; fournex (``--fournex``) with each rank
inside its own ``frx collect``, read from ``frx analyze --json`` of each rank's bundle;
datapath-doctor (``--datapath-doctor``), read from the report rank 0 prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Optional

import _bench
import _verdicts

SCRIPT = os.path.join(_bench.REPO, "benchmarks", "workloads", "peers_train.py")
LOADTUNE_FILE = os.path.join(_bench.REPO, "benchmarks", "workloads", "peers_loadtune.py")
FLAGS = {"num_workers": "--num-workers", "prefetch_factor": "--prefetch-factor",
         "batch_size": "--batch-size", "threads": "--threads"}
NOT_APPLICABLE = {
    "gpuprof": "a GPU profiler (kernels, NVML); it names no host-side cause",
}


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DDP_PROFILE", None)
    env.update(extra)
    return env


def _run(cmd: list[str], work: str, timeout_s: float, env: Optional[dict] = None,
         keep: Optional[int] = 600) -> tuple:
    """Exit code, the last ``keep`` characters of stdout then stderr (None: all of them) and
    the wall time of one command."""
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=work, env=env or _env(), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
        text = proc.stdout + proc.stderr
        code, tail = proc.returncode, text if keep is None else text[-keep:]
    except subprocess.TimeoutExpired:
        code, tail = -9, f"timed out after {timeout_s:.0f} s"
    return code, tail, round(time.monotonic() - started, 1)


def default_batch(args: list[str]) -> int:
    return int(args[args.index("--batch-size") + 1]) if "--batch-size" in args else 16


def config_label(config: dict, batch: int = 16) -> str:
    """One name per distinct configuration (the DataLoader's defaults left out)."""
    workers = int(config.get("num_workers") or 0)
    parts = [f"workers={workers}"]
    prefetch = config.get("prefetch_factor")
    if workers and prefetch and int(prefetch) != 2:
        parts.append(f"prefetch={int(prefetch)}")
    if config.get("batch_size") and int(config["batch_size"]) != batch:
        parts.append(f"bs={int(config['batch_size'])}")
    if config.get("threads"):
        parts.append(f"threads={int(config['threads'])}")
    return ",".join(parts)


def config_args(config: dict) -> list[str]:
    out: list[str] = []
    for key, flag in FLAGS.items():
        if config.get(key) is not None and config.get(key) is not False:
            out += [flag, str(int(config[key]))]
    return out


def measure_config(args: list[str], config: dict, nproc: int, steps: int) -> Optional[float]:
    """Global samples/s of one fresh plain launch of the script with ``config``.

    The warm-up drains the batches prefetched while the workers started (``num_workers x
    prefetch_factor``) and the measured steps span at least five rounds of the workers: with
    32 workers and 40 steps, the steps measured would all come from the start-up backlog or
    from one burst of a round, and the configuration would look faster than it runs.
    """
    work = _bench.scratch("peers-h2h-")
    try:
        workers = int(config.get("num_workers") or 0)
        warmup = max(5, workers * int(config.get("prefetch_factor") or 2))
        measured = max(steps, 5 * workers)
        argv = [*args, *config_args(config), "--warmup", str(warmup),
                "--steps", str(warmup + measured)]
        command = [sys.executable, SCRIPT] if nproc == 1 else None
        result = _bench.run_plain(argv, work, timeout_s=300, script=SCRIPT, nproc=nproc,
                                  command=command)
        values = [r["throughput"] for r in result["ranks"]]
        return min(values) if len(values) == nproc else None
    finally:
        _bench.cleanup(work)


def ddp_profile(workload: dict, nproc: int, steps: int, warmup: int) -> dict:
    """``ddp-profile run`` on the unmodified script: recommendation, findings, wall time."""
    work = _bench.scratch("peers-ddp-profile-")
    try:
        out = os.path.join(work, "run")
        launch = (["--launcher", "none"] if workload.get("in_place")
                  else ["--nproc-per-node", str(nproc)])
        script_args = [*workload["args"], *(["--spawn", "2"] if workload.get("in_place")
                                            else []), "--steps", "100000"]
        cmd = [sys.executable, "-m", "ddp_profile", "run", SCRIPT, *launch, "--steps",
               str(steps), "--warmup", str(warmup), "--no-report", "--quiet", "--out", out,
               *workload.get("ddp_profile_args", []), "--", *script_args]
        code, tail, wall = _run(cmd, work, 1800)
        path = os.path.join(out, "summary.json")
        if not os.path.exists(path):
            return {"status": f"exit {code}: {tail[-300:]}", "wall_s": wall}
        with open(path) as handle:
            summary = json.load(handle)
        recommended = summary.get("recommended")
        if recommended is not None:
            recommended = _ddp_profile_config(summary, recommended)
        return {"status": "ok", "wall_s": wall, "recommended": recommended,
                "expected_speedup": summary.get("expected_speedup"),
                "verdicts": _verdicts.ddp_profile_verdicts(summary),
                "probes": len(summary.get("probes") or [])}
    finally:
        _bench.cleanup(work)


def _ddp_profile_config(summary: dict, recommended: dict) -> dict:
    """What ddp-profile tells the user to run: the recommended DataLoader settings, and the
    threads its measured thread-oversubscription finding gives them (the ``threads`` probe of
    those same settings)."""
    keys = ("num_workers", "prefetch_factor", "batch_size")
    config = {k: recommended.get(k) for k in keys}
    threads = recommended.get("threads")
    probes = summary.get("probes") or []
    if threads is None:
        chosen = summary.get("recommended_probe")
        probe = next((p for p in probes if p.get("id") == chosen), {})
        threads = probe.get("threads")
    measured = any(f.get("rule") == "thread-oversubscription" and f.get("severity") != "low"
                   for f in summary.get("findings") or [])
    if threads is None and measured:
        same = [p for p in probes if p.get("kind") == "threads" and p.get("status") == "ok"
                and all((p.get("config") or {}).get(k) == recommended.get(k) for k in keys)]
        threads = same[-1].get("threads") if same else None
    if threads:
        config["threads"] = threads
    return config


def loadtune(workload: dict, steps: int, warmup: int) -> dict:
    """``loadtune tune`` on the workload file: its best configuration and its verdict."""
    from loadtune.experiment import Trial, best_trial
    from loadtune.knobs import Knobs

    work = _bench.scratch("peers-loadtune-")
    try:
        raw = os.path.join(work, "raw.json")
        cmd = [sys.executable, "-c", "import sys; from loadtune.cli import main; "
               "sys.exit(main())", "tune", LOADTUNE_FILE, "--steps", str(steps), "--warmup",
               str(warmup), "--no-plots", "--save-raw", raw, "--out",
               os.path.join(work, "report.md")]
        env = _env(PEERS_WORKLOAD_ARGS=json.dumps(workload["args"]))
        code, tail, wall = _run(cmd, work, 1800, env)
        if not os.path.exists(raw):
            return {"status": f"exit {code}: {tail[-300:]}", "wall_s": wall}
        with open(raw) as handle:
            data = json.load(handle)
        trials = []
        for entry in data.get("trials") or []:
            trial = Trial(knobs=Knobs.from_dict(entry["knobs"]), reason=entry.get("reason", ""))
            trial.result = entry.get("result")
            trials.append(trial)
        best = best_trial(trials)  # loadtune's own choice ("best overall")
        base = data["baseline"]
        knobs = best.knobs if best and best.throughput > base["throughput"] \
            else Knobs.from_dict(base["knobs"])
        config = {"num_workers": knobs.num_workers, "prefetch_factor": knobs.prefetch_factor,
                  "batch_size": knobs.batch_size, "threads": knobs.num_threads}
        return {"status": "ok", "wall_s": wall, "recommended": config,
                "expected_speedup": round(best.throughput / base["throughput"], 3)
                if best and best.throughput > base["throughput"] else 1.0,
                "verdicts": _verdicts.loadtune_verdicts(data.get("narrative", "")),
                "narrative": data.get("narrative"), "trials": len(trials),
                "baseline_cpu_util": base.get("cpu_util_mean")}
    finally:
        _bench.cleanup(work)


def traceml(workload: dict, steps: int) -> dict:
    """``traceml run`` (torchrun, 2 ranks) on the script with its two lines; its verdicts."""
    work = _bench.scratch("peers-traceml-")
    try:
        cmd = [sys.executable, "-c", "import sys; from traceml_ai.launcher.cli import main; "
               "sys.exit(main())", "run", SCRIPT, "--nproc-per-node", "2", "--logs-dir",
               os.path.join(work, "logs"), "--run-name", "peers", "--args",
               *workload["args"], "--traceml", "--steps", str(steps)]
        code, tail, wall = _run(cmd, work, 900, _torchrun_env(workload))
        path = os.path.join(work, "logs", "peers", "final_summary.json")
        if not os.path.exists(path):
            return {"status": f"exit {code}: {tail[-300:]}", "wall_s": wall}
        with open(path) as handle:
            summary = json.load(handle)
        return {"status": "ok", "wall_s": wall, "verdicts": _verdicts.traceml_verdicts(summary)}
    finally:
        _bench.cleanup(work)


def _torchrun_env(workload: dict) -> dict[str, str]:
    """The environment of a peer's torchrun launch; the in-place workload's ranks keep torch's
    default thread count (all CPUs), as they have it when started without a launcher."""
    if workload.get("in_place"):
        return _env(OMP_NUM_THREADS=str(len(os.sched_getaffinity(0))))
    return _env()


def fournex(workload: dict, steps: int) -> dict:
    """The script with fournex's SDK lines (``--fournex``), every torchrun rank under its own
    ``frx collect``; then ``frx analyze --json`` on each rank's run bundle."""
    work = _bench.scratch("peers-fournex-")
    try:
        frx = ["-m", "fournex"]
        script = [sys.executable, SCRIPT, *workload["args"], "--fournex", "--steps", str(steps)]
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node=2", "--max-restarts=0", *frx, "collect", "--name", "peers",
                  "--out", "runs", "--no-zip", "--", *script]
        code, tail, wall = _run(launch, work, 900, _torchrun_env(workload))
        runs = os.path.join(work, "runs")
        bundles = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
        per_run, verdicts = {}, []
        for bundle in bundles:
            got, text, more = _run([sys.executable, *frx, "analyze", "--json",
                                    os.path.join(runs, bundle)], work, 300, keep=None)
            wall = round(wall + more, 1)
            try:
                start = text.index("{")
                per_run[bundle] = _verdicts.fournex_verdicts(
                    json.JSONDecoder().raw_decode(text[start:])[0])
            except ValueError:
                per_run[bundle] = f"analyze exit {got}: {text[-200:]}"
                continue
            verdicts += [v for v in per_run[bundle] if v not in verdicts]
        if code != 0 or len(bundles) != 2 or any(isinstance(v, str) for v in per_run.values()):
            return {"status": f"exit {code}: {tail[-300:]}", "wall_s": wall, "per_run": per_run}
        return {"status": "ok", "wall_s": wall, "verdicts": verdicts, "per_run": per_run}
    finally:
        _bench.cleanup(work)


def datapath_doctor(workload: dict, steps: int) -> dict:
    """The script with datapath-doctor's SDK lines (``--datapath-doctor``) under torchrun (2
    ranks); rank 0 prints the tool's report of every rank and its straggler check, read here."""
    work = _bench.scratch("peers-datapath-doctor-")
    try:
        cmd = _bench.torchrun_command(SCRIPT, [*workload["args"], "--datapath-doctor",
                                               "--steps", str(steps)])
        code, text, wall = _run(cmd, work, 900, _torchrun_env(workload), keep=None)
        verdicts = _verdicts.datapath_doctor_verdicts(text)
        if code != 0 or verdicts is None:
            return {"status": f"exit {code}: {_first_error(text)}", "wall_s": wall}
        return {"status": "ok", "wall_s": wall, "verdicts": verdicts}
    finally:
        _bench.cleanup(work)


def _first_error(text: str) -> str:
    """The first line of a failed launch's output that says what failed, else its tail."""
    for line in text.splitlines():
        if re.search(r"Error|Exception|terminate called", line):
            return line.strip()[:300]
    return text[-300:]


def overhead(quick: bool, have: dict) -> dict[str, Any]:
    """Per-step overhead: ddp-profile (in process and between launches) and the peers."""
    import overhead as oh

    reps = 1 if quick else 3
    steps = 40 if quick else 200
    inproc = [oh.run_in_process(240 if quick else 1000, 5,
                                oh.IN_PROCESS_BLOCK * (1 if r % 2 == 0 else -1), False)
              for r in range(reps)]
    pooled = oh.pooled_in_process(inproc)
    share = oh.sampler_share()["steady"]
    variants = ["plain", "ddp_profile", *(["gpuprof"] if have.get("gpuprof") else [])]
    ratios: dict[str, list[float]] = {v: [] for v in variants if v != "plain"}
    for rep in range(reps):
        medians = {v: oh.run_variant(v, steps, 5)["median_step_s"]
                   for v in (variants if rep % 2 == 0 else variants[::-1])}
        for v in ratios:
            if medians.get(v) and medians.get("plain"):
                ratios[v].append(medians[v] / medians["plain"])
    out = {"ddp_profile": {"in_process": pooled.get("ratio"),
                           "in_process_with_samplers": _bench.rnd(pooled["ratio"] + share)
                           if pooled.get("ratio") else None,
                           "between_launches": _bench.rnd(_bench.median(ratios["ddp_profile"]))},
           "workload": "bench_train.py " + " ".join(oh.WORKLOAD_ARGS), "reps": reps}
    if have.get("gpuprof"):
        out["gpuprof"] = {"between_launches": _bench.rnd(_bench.median(ratios["gpuprof"]))}
    out["traceml"] = traceml_overhead(reps, steps) if have.get("traceml") else "not installed"
    out["loadtune"] = "n/a: loadtune runs its own loop, not the script's"
    return out


def traceml_overhead(reps: int, steps: int) -> dict:
    """traceml-ai's two lines under ``traceml run`` against plain torchrun (median step)."""
    args = ["--hidden", "1024", "--layers", "3", "--batch-size", "64", "--steps", str(steps)]
    ratios = []
    for rep in range(reps):
        medians = {}
        for variant in (("plain", "traceml") if rep % 2 == 0 else ("traceml", "plain")):
            work = _bench.scratch("peers-oh-")
            try:
                command = None if variant == "plain" else [
                    sys.executable, "-c", "import sys; from traceml_ai.launcher.cli import "
                    "main; sys.exit(main())", "run", SCRIPT, "--nproc-per-node", "2",
                    "--logs-dir", os.path.join(work, "logs"), "--run-name", "oh", "--args",
                    "--traceml"]
                result = _bench.run_plain(args, work, script=SCRIPT, command=command)
                values = [r["median_step_s"] for r in result["ranks"]]
                medians[variant] = max(values) if len(values) == 2 else None
            finally:
                _bench.cleanup(work)
        if medians["plain"] and medians["traceml"]:
            ratios.append(medians["traceml"] / medians["plain"])
    return {"between_launches": _bench.rnd(_bench.median(ratios)), "reps": reps}
