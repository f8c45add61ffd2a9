"""The CUDA and NVML paths of ddp-profile, run for real on a GPU and checked against construction.

One command; each check runs the real CLI (``python -m ddp_profile run``) on a real workload on
the GPU, reads what the tool recorded, and compares it with what the workload constructs, as
pass/fail with the figures:

``demo``            ``ddp-profile demo`` (the built-in workload, on the GPU: one rank per GPU,
                    nccl): NVML samples present and in range, GPU name and driver in the
                    environment, ``gpu_idle_fraction`` on every probe, ``cuda_memory`` events;
``idle``            a fixed GPU workload per step and a fixed host sleep after reading the
                    loss: the tool's ``gpu_idle_fraction`` against 1 - GPU time / step time,
                    both from plain launches (the GPU's time per step: the same loop without
                    the wait, the host running ahead, so the GPU never idles);
``utilisation``     the same model queued back to back reads >= 90 % utilisation and no
                    loading or utilisation finding; the same model starved by slow loading reads
                    far less, with ``data-loader-bound`` and a GPU idle share to match;
``hidden_wait``     a batch made in about a third of the GPU's step: the host waits for data
                    while the GPU stays busy (its queue covers the wait), so the loader does not
                    bound the job and ``data-loader-bound`` must stay silent;
``pinning``         batches of 3x224x224 floats, 4 workers, pin_memory both ways with
                    ``non_blocking`` copies: the pinned probe's pinning timed, the ``pin-memory``
                    finding present exactly when plain launches (mean steps, prefetch 2 and 4)
                    show pinning faster;
``oom``             a batch size too large for the GPU: recorded as ``oom``, the larger size
                    skipped, the run still answers;
``backend``         2 ranks on the one GPU with gloo on CUDA tensors: ``backend-mismatch``,
                    and DDP's timers read on CUDA;
``syncs``           ``.item()``, ``torch.cuda.synchronize()`` and a blocking copy of x and y
                    every step, then a host sleep: 4 host syncs a step counted, each at the
                    workload's own line, and ``host-sync-per-step``; the same loop without
                    them: none counted, no finding;
``nccl``            DDP on nccl (one rank) with the script's own ``dist.all_reduce`` of the
                    loss every step: DDP's reducer timers read through CUDA events, the
                    all-reduce counted at its line;
``overhead``        ``benchmarks/overhead.py``'s in-process A/B on CUDA (target <= 1.01).

    python benchmarks/gpu_check.py                 # every check (~6 min on an H100)
    python benchmarks/gpu_check.py --only idle,oom
    python benchmarks/gpu_check.py --keep DIR      # also DIR/runs.tar.gz: every run directory

The last line printed is a JSON object: ``{"passed": bool, "checks": {name: {"passed", ...}},
"device": ...}``. Exit status 0 when every check passed, 1 when one failed, 3 on a machine
without CUDA (at once, with one line saying so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _bench  # noqa: E402  (puts the repository on sys.path)

EXIT_NO_CUDA = 3
WORKLOAD = os.path.join(_bench.REPO, "benchmarks", "workloads", "gpu_train.py")
# a GPU-bound step: ~1.3 TFLOP of fp32 matrix products (tens of ms on an H100)
GPU_MODEL = ["--features", "1024", "--width", "8192", "--layers", "4", "--batch-size", "1024"]
IDLE_TOLERANCE = 0.05  # |measured - constructed| GPU idle share
BUSY_UTIL = 90.0  # a GPU-bound loop's median utilisation at least this (percent)
PIN_MARGIN = 0.03  # plain-launch ratios within this of the rule's threshold: either answer


class Context:
    """Where the check's run directories go, and the runs made so far (for ``--keep``)."""

    def __init__(self, work: str):
        self.work = work
        self.runs: list[str] = []

    def tool(self, name: str, script: str, options: list[str], script_args: list[str],
             command: str = "run", timeout_s: float = 900.0) -> dict[str, Any]:
        """``python -m ddp_profile run SCRIPT OPTIONS -- SCRIPT_ARGS``: exit code, console,
        summary and the loaded run."""
        out = os.path.join(self.work, name)
        argv = [sys.executable, "-m", "ddp_profile", command, "--out", out, *options]
        if command == "run":
            argv += [script, "--", *script_args]
        started = time.perf_counter()
        proc = subprocess.run(argv, cwd=self.work, capture_output=True, text=True,
                              timeout=timeout_s, env=_env())
        self.runs.append(out)
        with open(os.path.join(self.work, f"{name}.console.txt"), "w") as fh:
            fh.write(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        result: dict[str, Any] = {"exit_code": proc.returncode,
                                  "seconds": round(time.perf_counter() - started, 1),
                                  "console_tail": proc.stdout.strip().splitlines()[-12:],
                                  "stderr_tail": proc.stderr.strip().splitlines()[-5:]}
        summary_path = os.path.join(out, "summary.json")
        if os.path.exists(summary_path):
            from ddp_profile.profiler.store.results import load_run

            with open(summary_path) as fh:
                result["summary"] = json.load(fh)
            result["run"] = load_run(out)
        return result

    def plain(self, name: str, args: list[str], nproc: int = 1) -> dict[str, Any]:
        """The workload under plain torchrun; rank 0's self-measurement."""
        out = os.path.join(self.work, f"{name}.json")
        argv = [*_bench.torchrun_command(WORKLOAD, [], nproc), *args, "--out", out]
        proc = subprocess.run(argv, cwd=self.work, capture_output=True, text=True, timeout=600,
                              env=_env())
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"plain launch {name} failed ({proc.returncode}): "
                               + " ".join(proc.stderr.strip().splitlines()[-3:])[:500])
        with open(out) as fh:
            return json.load(fh)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DDP_PROFILE", None)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _bench.REPO + (os.pathsep + path if path else "")
    return env


# ---- reading what the tool recorded -------------------------------------------------------

def probes_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    return (result.get("summary") or {}).get("probes") or []


def baseline_of(result: dict[str, Any]) -> dict[str, Any]:
    return next((p for p in probes_of(result) if p.get("kind") == "baseline"), {})


def rules_of(result: dict[str, Any]) -> list[str]:
    return [f.get("rule") for f in (result.get("summary") or {}).get("findings") or []]


def finding(result: dict[str, Any], rule: str) -> Optional[dict[str, Any]]:
    return next((f for f in (result.get("summary") or {}).get("findings") or []
                 if f.get("rule") == rule), None)


def gpu_samples(result: dict[str, Any], probe_id: str):
    samples = result["run"].samples
    if samples.empty or "source" not in samples:
        return samples
    return samples[(samples["probe_id"] == probe_id) & (samples["source"] == "gpu")]


def metric_values(rows, name: str) -> list[float]:
    if name not in rows:
        return []
    return [float(v) for v in rows[name] if v == v]  # NaN != NaN


def median_util(result: dict[str, Any], probe_id: str) -> Optional[float]:
    values = metric_values(gpu_samples(result, probe_id), "gpu_util_percent")
    return round(statistics.median(values), 1) if values else None


def r3(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(float(value), 3)


def verdict(passed: bool, **figures: Any) -> dict[str, Any]:
    return {"passed": bool(passed), **figures}


# ---- the checks ---------------------------------------------------------------------------

def check_demo(ctx: Context) -> dict[str, Any]:
    result = ctx.tool("demo", "", ["--steps", "30"], [], command="demo")
    summary = result.get("summary") or {}
    env = summary.get("environment") or {}
    base = baseline_of(result)
    failures = []
    if result["exit_code"] != 0:
        failures.append(f"exit code {result['exit_code']}")
    if summary.get("device") != "cuda" or summary.get("backend") != "nccl":
        failures.append(f"device {summary.get('device')}, backend {summary.get('backend')}")
    if not env.get("gpu_name") or not env.get("driver_version"):
        failures.append(f"environment gpu_name {env.get('gpu_name')!r}, driver "
                        f"{env.get('driver_version')!r}")
    ranges = {"gpu_util_percent": (0, 100), "gpu_power_w": (1, 2000),
              "gpu_sm_clock_mhz": (1, 5000), "gpu_temp_c": (1, 120),
              "gpm_sm_activity": (0, 100)}
    figures: dict[str, Any] = {}
    ok = [p for p in probes_of(result) if p.get("status") == "ok"]
    for probe in ok:
        rows = gpu_samples(result, probe["id"])
        driver_samples = sum(metric_values(rows, "gpu_util_samples"))
        if rows.empty or driver_samples < 2:  # a window under a second holds one record
            failures.append(f"probe {probe['id']}: {len(rows)} GPU record(s) of "
                            f"{driver_samples} driver sample(s)")
            continue
        for name, (low, high) in ranges.items():
            values = metric_values(rows, name)
            if not values or not all(low <= v <= high for v in values):
                failures.append(f"probe {probe['id']} {name}: {values[:5]} not in "
                                f"[{low}, {high}]")
        used = metric_values(rows, "gpu_mem_used_bytes")
        total = metric_values(rows, "gpu_mem_total_bytes")
        if not used or not total or not all(0 < u <= t for u, t in zip(used, total)):
            failures.append(f"probe {probe['id']}: memory used {used[:3]} of {total[:3]}")
        idle = probe.get("gpu_idle_fraction")
        if idle is None or not 0 <= idle <= 1:
            failures.append(f"probe {probe['id']}: gpu_idle_fraction {idle}")
        if base and probe["id"] == base.get("id"):
            figures.update(baseline_util_median=median_util(result, probe["id"]),
                           baseline_gpu_idle_fraction=r3(idle),
                           baseline_power_w=round(statistics.median(
                               metric_values(rows, "gpu_power_w")), 1),
                           gpu_samples=len(rows))
    memory = result["run"].events if "run" in result else None
    if memory is None or memory[memory["name"] == "cuda_memory"].empty:
        failures.append("no cuda_memory event")
    if not ok:
        failures.append("no probe ok")
    if not os.path.exists(os.path.join(ctx.work, "demo", "report.html")):
        failures.append("no report.html")
    return verdict(not failures, failures=failures, gpu_name=env.get("gpu_name"),
                   driver=env.get("driver_version"),
                   probes_ok=f"{len(ok)}/{len(probes_of(result))}",
                   recommended=summary.get("recommended"),
                   speedup=summary.get("expected_speedup"), rules=rules_of(result),
                   seconds=result["seconds"], **figures)


def check_idle(ctx: Context) -> dict[str, Any]:
    sleep_ms = 20.0
    gpu_step = ctx.plain("idle-busy", [*GPU_MODEL, "--steps", "80"])["mean_step_s"]
    plain = ctx.plain("idle-plain", [*GPU_MODEL, "--host-sleep-ms", str(sleep_ms),
                                     "--steps", "60"])
    constructed = 1 - gpu_step / plain["mean_step_s"]
    result = ctx.tool("idle", WORKLOAD, ["--nproc-per-node", "1", "--num-workers", "0",
                                         "--steps", "40", "--no-comm", "--no-ceiling",
                                         "--no-report"],
                      [*GPU_MODEL, "--host-sleep-ms", str(sleep_ms)])
    base = baseline_of(result)
    measured = base.get("gpu_idle_fraction")
    passed = measured is not None and abs(measured - constructed) <= IDLE_TOLERANCE
    return verdict(passed, gpu_step_s=r3(gpu_step), host_sleep_s=sleep_ms / 1e3,
                   plain_step_s=r3(plain["mean_step_s"]), constructed_idle=r3(constructed),
                   measured_idle=r3(measured), difference=r3(measured - constructed)
                   if measured is not None else None, tolerance=IDLE_TOLERANCE,
                   tool_step_s=r3((base.get("config") or {}).get("batch_size", 0)
                                  / base["throughput"]) if base.get("throughput") else None,
                   status=base.get("status"), seconds=result["seconds"])


def check_utilisation(ctx: Context) -> dict[str, Any]:
    options = ["--nproc-per-node", "1", "--num-workers", "0", "--steps", "100", "--no-comm",
               "--no-ceiling", "--no-report"]
    busy = ctx.tool("util-busy", WORKLOAD, options, GPU_MODEL)
    starved = ctx.tool("util-starved", WORKLOAD, options, [*GPU_MODEL, "--load-ms", "0.1"])
    busy_util = median_util(busy, baseline_of(busy).get("id"))
    starved_util = median_util(starved, baseline_of(starved).get("id"))
    loading_rules = {"data-loader-bound", "low-gpu-utilization", "cpu-bound-preprocessing",
                     "io-bound-loading"}
    busy_rules = sorted(set(rules_of(busy)) & loading_rules)
    starved_idle = baseline_of(starved).get("gpu_idle_fraction")
    failures = []
    if busy_util is None or busy_util < BUSY_UTIL:
        failures.append(f"GPU-bound loop reads {busy_util} %")
    if busy_rules:
        failures.append(f"GPU-bound loop gets {busy_rules}")
    if starved_util is None or busy_util is None or starved_util > busy_util / 2:
        failures.append(f"starved loop reads {starved_util} %")
    if "data-loader-bound" not in rules_of(starved):
        failures.append(f"starved loop gets {rules_of(starved)}, no data-loader-bound")
    if starved_idle is None or starved_idle < 0.5:
        failures.append(f"starved loop's GPU idle share {starved_idle}")
    return verdict(not failures, failures=failures, busy_util_median=busy_util,
                   busy_rules=rules_of(busy), starved_util_median=starved_util,
                   starved_gpu_idle_fraction=r3(starved_idle),
                   starved_data_wait=r3(baseline_of(starved).get("data_wait_fraction")),
                   starved_rules=rules_of(starved),
                   seconds=busy["seconds"] + starved["seconds"])


def check_hidden_wait(ctx: Context) -> dict[str, Any]:
    """Loading at about a third of the GPU's step: the host waits, the GPU does not."""
    options = ["--nproc-per-node", "1", "--num-workers", "0", "--steps", "60", "--no-comm",
               "--no-ceiling", "--no-report"]
    result = ctx.tool("hidden-wait", WORKLOAD, options, [*GPU_MODEL, "--batch-load-ms", "10",
                                                          "--pin-memory"])
    base = baseline_of(result)
    idle, wait = base.get("gpu_idle_fraction"), base.get("data_wait_fraction")
    failures = []
    if wait is None or wait < 0.2:
        failures.append(f"the host waits {wait} of each step (the construction: about 1/3)")
    if idle is None or idle > 0.05:
        failures.append(f"GPU idle share {idle} (the GPU should stay busy)")
    if "data-loader-bound" in rules_of(result):
        failures.append("data-loader-bound although the GPU never waits")
    return verdict(not failures, failures=failures, host_data_wait=r3(wait),
                   gpu_idle_fraction=r3(idle),
                   gpu_starved_fraction=r3(base.get("gpu_starved_fraction")),
                   console=[line for line in result["console_tail"] if "baseline" in line],
                   util_median=median_util(result, base.get("id")),
                   rules=rules_of(result), seconds=result["seconds"])


def check_pinning(ctx: Context) -> dict[str, Any]:
    model = ["--features", "150528", "--width", "1024", "--layers", "2", "--batch-size", "64",
             "--samples", "8192", "--num-workers", "4"]
    gains = {}
    for prefetch in (2, 4):
        args = [*model, "--prefetch-factor", str(prefetch), "--steps", "80"]
        unpinned = ctx.plain(f"pin-off-{prefetch}", args)
        pinned = ctx.plain(f"pin-on-{prefetch}", [*args, "--pin-memory"])
        gains[prefetch] = unpinned["mean_step_s"] / pinned["mean_step_s"]
    plain_gain = max(gains.values())
    result = ctx.tool("pinning", WORKLOAD, ["--nproc-per-node", "1", "--num-workers", "4",
                                            "--pin-memory", "true,false", "--prefetch-factor",
                                            "2,4", "--steps", "60", "--no-comm", "--no-ceiling",
                                            "--no-report", "--search", "grid"], model)
    from ddp_profile.rules.base import Thresholds

    threshold = Thresholds().pin_speedup
    probes = [p for p in probes_of(result) if p.get("status") == "ok"]
    on = [p for p in probes if (p.get("config") or {}).get("pin_memory") is True]
    off = [p for p in probes if (p.get("config") or {}).get("pin_memory") is False]
    fired = finding(result, "pin-memory") is not None
    failures = []
    if not on or not off:
        failures.append(f"pinned probes {len(on)}, unpinned {len(off)}")
    pin_s = [(p.get("loading") or {}).get("pin_per_sample_s") for p in on]
    if not pin_s or not all(s and s > 0 for s in pin_s):
        failures.append(f"pinning not timed: pin_per_sample_s {pin_s}")
    if plain_gain >= threshold + PIN_MARGIN and not fired:
        failures.append(f"plain launches: pinned {plain_gain:.3f}x faster, no pin-memory finding")
    if plain_gain <= threshold - PIN_MARGIN and fired:
        failures.append(f"plain launches: pinned {plain_gain:.3f}x, yet a pin-memory finding")
    tool_gain = (max(p["throughput"] for p in on) / max(p["throughput"] for p in off)
                 if on and off else None)
    return verdict(not failures, failures=failures, plain_gain=r3(plain_gain),
                   plain_gain_by_prefetch={k: r3(v) for k, v in gains.items()},
                   console=result["console_tail"][:4],
                   tool_gain=r3(tool_gain), threshold=threshold, finding=fired,
                   pin_per_sample_ms=[round(s * 1e3, 4) for s in pin_s if s],
                   rules=rules_of(result), seconds=result["seconds"])


def check_oom(ctx: Context) -> dict[str, Any]:
    sizes = (256, 262144, 524288)
    result = ctx.tool("oom", WORKLOAD, ["--nproc-per-node", "1", "--num-workers", "0",
                                        "--batch-size", ",".join(map(str, sizes)),
                                        "--search", "grid", "--steps", "10", "--warmup", "2",
                                        "--no-comm", "--no-ceiling", "--no-report"],
                      ["--features", "64", "--width", "65536", "--layers", "1",
                       "--batch-size", "256", "--samples", "600000"])
    status = {}
    for probe in probes_of(result):
        size = (probe.get("config") or {}).get("batch_size")
        status.setdefault(str(size), []).append(probe.get("status"))
    failures = []
    if result["exit_code"] != 0:
        failures.append(f"exit code {result['exit_code']}")
    if "ok" not in status.get(str(sizes[0]), []):
        failures.append(f"batch {sizes[0]}: {status.get(str(sizes[0]))}")
    if "oom" not in status.get(str(sizes[1]), []):
        failures.append(f"batch {sizes[1]}: {status.get(str(sizes[1]))}, not oom")
    if any(s not in ("skipped",) for s in status.get(str(sizes[2]), [])):
        failures.append(f"batch {sizes[2]}: {status.get(str(sizes[2]))}, not skipped")
    oom_probe = next((p for p in probes_of(result) if p.get("status") == "oom"), {})
    return verdict(not failures, failures=failures, status_by_batch=status,
                   oom_error=str(oom_probe.get("error") or "")[:200], rules=rules_of(result),
                   seconds=result["seconds"])


def check_backend(ctx: Context) -> dict[str, Any]:
    result = ctx.tool("backend", WORKLOAD, ["--nproc-per-node", "2", "--num-workers", "0",
                                            "--steps", "30", "--no-ceiling", "--no-report"],
                      ["--backend", "gloo", "--features", "1024", "--width", "2048",
                       "--layers", "3", "--batch-size", "64"])
    base = baseline_of(result)
    comm = base.get("comm") or {}
    failures = []
    if "backend-mismatch" not in rules_of(result):
        failures.append(f"no backend-mismatch: {rules_of(result)}")
    if base.get("comm_fraction") is None:
        failures.append("DDP's timers not read on CUDA (no comm_fraction)")
    return verdict(not failures, failures=failures, backend=(result.get("summary") or {})
                   .get("backend"), comm_fraction=r3(base.get("comm_fraction")),
                   comm={k: comm.get(k) for k in ("exposed_s", "comm_s", "overlap_s", "step_s",
                                                 "bandwidth_bytes_per_s", "gradient_bytes")},
                   probes=len(probes_of(result)), rules=rules_of(result),
                   seconds=result["seconds"])


def check_overhead(ctx: Context) -> dict[str, Any]:
    import contextlib
    import io

    import overhead

    figures = {}
    for name, workload in (("default", None),
                           ("gpu_bound", "--hidden 4096 --layers 4 --batch-size 1024")):
        argv = ["--in-process-only", "--reps", "2", "--in-process-steps", "400",
                "--device", "cuda"]
        if workload:
            argv += ["--workload", workload]
        with contextlib.redirect_stdout(io.StringIO()):
            measured = overhead.main(argv)
        inproc = measured["in_process"]
        figures[name] = {"workload": measured["workload"],
                         "errors": [r["in_process"].get("error") for r in
                                    measured.get("per_rep", []) if r["in_process"].get("error")],
                         "with_samplers": inproc.get("with_samplers"),
                         "ratio": inproc.get("ratio"), "ci95": inproc.get("ci95"),
                         "hook_us_per_step": inproc.get("hook_us_per_step"),
                         "hook_share": inproc.get("hook_share"),
                         "hook_cpu_us_by_hook": [r["in_process"].get("hook_cpu_us_by_hook")
                                                 for r in measured.get("per_rep", [])]}
    headline = figures["default"]["with_samplers"]
    return verdict(headline is not None and headline <= 1.01, target=1.01, **figures)


def site_lines() -> dict[str, int]:
    """The workload's marked lines (``# site: NAME``) by name."""
    with open(WORKLOAD) as fh:
        return {line.split("# site:")[1].strip(): number
                for number, line in enumerate(fh, start=1) if "# site:" in line}


def check_syncs(ctx: Context) -> dict[str, Any]:
    options = ["--nproc-per-node", "1", "--num-workers", "0", "--steps", "40", "--no-comm",
               "--no-ceiling", "--no-report"]
    synced = ctx.tool("syncs", WORKLOAD, options, [*GPU_MODEL, "--read-loss", "--synchronize",
                                                   "--blocking-copy", "--host-sleep-ms", "10"])
    plain = ctx.tool("syncs-none", WORKLOAD, options, GPU_MODEL)
    lines = site_lines()
    wanted = {lines["read-loss"]: 1, lines["synchronize"]: 1, lines["blocking-copy"]: 2}
    base = baseline_of(synced)
    found = ((base.get("comm") or {}).get("host_syncs")) or {}
    sites = {s.get("line"): s for s in found.get("sites") or []
             if os.path.basename(str(s.get("file"))) == "gpu_train.py"}
    failures = []
    if found.get("per_step") is None or abs(found["per_step"] - sum(wanted.values())) > 0.5:
        failures.append(f"{found.get('per_step')} host syncs a step counted, constructed "
                        f"{sum(wanted.values())}")
    for line in wanted:
        if line not in sites:
            failures.append(f"no site at gpu_train.py:{line}")
    if finding(synced, "host-sync-per-step") is None:
        failures.append(f"no host-sync-per-step: {rules_of(synced)}")
    unsynced = ((baseline_of(plain).get("comm") or {}).get("host_syncs")) or {}
    if unsynced.get("per_step"):
        failures.append(f"the loop without syncs: {unsynced.get('per_step')} a step at "
                        f"{[(s.get('file'), s.get('line')) for s in unsynced.get('sites', [])]}")
    if finding(plain, "host-sync-per-step") is not None:
        failures.append("host-sync-per-step on the loop without syncs")
    return verdict(not failures, failures=failures, per_step=r3(found.get("per_step")),
                   steps_with_syncs=r3(found.get("steps_with_syncs")),
                   synchronize_s_per_step=r3(found.get("timed_seconds_per_step")),
                   sites=[{k: s.get(k) for k in ("file", "line", "text", "via", "calls")}
                          for s in found.get("sites") or []],
                   constructed_lines=wanted,
                   gpu_idle_fraction=r3(base.get("gpu_idle_fraction")),
                   gpu_starved_fraction=r3(base.get("gpu_starved_fraction")),
                   finding=(finding(synced, "host-sync-per-step") or {}).get("evidence"),
                   rules=rules_of(synced), rules_without=rules_of(plain),
                   without_syncs=unsynced or None,
                   seconds=synced["seconds"] + plain["seconds"])


def check_nccl(ctx: Context) -> dict[str, Any]:
    result = ctx.tool("nccl", WORKLOAD, ["--nproc-per-node", "1", "--num-workers", "0",
                                         "--steps", "80", "--no-ceiling", "--no-report"],
                      [*GPU_MODEL, "--reduce-loss"])
    base = baseline_of(result)
    comm = base.get("comm") or {}
    line = site_lines()["reduce-loss"]
    sites = [s for s in comm.get("sites") or [] if s.get("line") == line
             and os.path.basename(str(s.get("file"))) == "gpu_train.py"]
    failures = []
    if comm.get("backend") != "nccl":
        failures.append(f"backend {comm.get('backend')}")
    if not comm.get("timed_steps") or not comm.get("comm_s"):
        failures.append(f"DDP's timers: {comm.get('timed_steps')} timed steps, comm "
                        f"{comm.get('comm_s')} s")
    elif comm.get("step_s") and not 0 <= comm["comm_s"] <= comm["step_s"]:
        failures.append(f"comm {comm['comm_s']} s outside the {comm['step_s']} s step")
    if not sites or sites[0].get("op") != "all_reduce":
        failures.append(f"the all_reduce at gpu_train.py:{line} not counted: "
                        f"{comm.get('sites')}")
    return verdict(not failures, failures=failures,
                   **{k: comm.get(k) for k in ("backend", "timed_steps", "comm_s", "overlap_s",
                                               "exposed_s", "step_s", "gradient_bytes",
                                               "buckets", "collectives", "host_syncs")},
                   sites=comm.get("sites"), rules=rules_of(result),
                   probes=[(p.get("id"), p.get("kind"), p.get("status")) for p in
                           probes_of(result)], seconds=result["seconds"])


CHECKS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "demo": check_demo, "idle": check_idle, "utilisation": check_utilisation,
    "hidden_wait": check_hidden_wait, "pinning": check_pinning, "oom": check_oom,
    "backend": check_backend, "syncs": check_syncs, "nccl": check_nccl,
    "overhead": check_overhead}


def device_facts() -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpus": torch.cuda.device_count(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d")}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma list of checks (default: all)")
    parser.add_argument("--keep", default="", help="directory for runs.tar.gz and the JSON")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); "
              "run it on a machine with an NVIDIA GPU", file=sys.stderr)
        return EXIT_NO_CUDA
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        parser.error(f"unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    work = tempfile.mkdtemp(prefix="gpu-check-")
    ctx = Context(work)
    facts = device_facts()
    results: dict[str, Any] = {}
    report: dict[str, Any] = {"passed": False, "device": facts, "checks": results}
    for name in names:
        started = time.perf_counter()
        try:
            results[name] = CHECKS[name](ctx)
        except Exception as exc:  # noqa: BLE001 - one broken check never hides the others
            results[name] = verdict(False, error=f"{type(exc).__name__}: {exc}"[:800],
                                    traceback=traceback.format_exc()[-1500:])
        results[name]["wall_s"] = round(time.perf_counter() - started, 1)
        print(f"{name}: {'pass' if results[name]['passed'] else 'FAIL'} "
              f"{json.dumps(results[name], default=str)[:600]}", file=sys.stderr, flush=True)
        report = {"passed": all(r["passed"] for r in results.values()), "device": facts,
                  "checks": results, "complete": len(results) == len(names)}
        if args.keep:  # after every check: a session cut short keeps what it measured
            os.makedirs(args.keep, exist_ok=True)
            with open(os.path.join(args.keep, "gpu_check.json"), "w") as fh:
                json.dump(report, fh, indent=1, default=str)
    if args.keep:
        with tarfile.open(os.path.join(args.keep, "runs.tar.gz"), "w:gz") as tar:
            tar.add(work, arcname="gpu-check")
    shutil.rmtree(work, ignore_errors=True)
    _bench.finish("gpu_check", report, argv)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
