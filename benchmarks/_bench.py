"""Shared helpers of the end-to-end benchmarks (overhead, accuracy, recommendation).

Each variant of a workload is one 2-rank launch of ``benchmarks/workloads/bench_train.py``:
plainly under ``python -m torch.distributed.run``, or under ddp-profile's instrumentation
(``profiler.launch.launch`` with a probe plan whose step budget the script's own loop never
reaches, so the script ends itself exactly as it does plainly). Every launch gets its own
scratch directory; rank 0's and rank 1's self-measurements come back as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
# the workloads' rank processes import ddp_profile too: from a clone without an install, the
# repository must be on their path as well as on this one's
if REPO not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p)

WORKLOAD = os.path.join(REPO, "benchmarks", "workloads", "bench_train.py")
DEMO = os.path.join(REPO, "ddp_profile", "examples", "demo_train.py")
NPROC = 2  # ranks per launch; ``use_ranks`` changes it (one per GPU on a GPU machine)


def use_ranks(nproc: int) -> None:
    global NPROC
    NPROC = nproc


def cpu_model() -> Optional[str]:
    """The CPU's model name from /proc/cpuinfo (None where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle
                         if line.startswith("model name")), None)
    except OSError:
        return None


def machine() -> dict[str, Any]:
    model = cpu_model()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    import torch

    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model,
            "arch": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "loadavg_at_start": load}


# one file per sample, written once under the temporary directory (``benchmarks/peers.py`` and
# ``benchmarks/head_to_head.py`` read them; ``--files`` of the workloads)
FILES_DIR = os.path.join(tempfile.gettempdir(), "ddp-profile-peers-files")
FILES, FILE_BYTES = 4096, 128 * 1024


def ensure_files() -> None:
    """The file-backed workloads' files, written once and synced (dirty pages cannot be
    dropped from the page cache)."""
    os.makedirs(FILES_DIR, exist_ok=True)
    for index in range(FILES):
        path = os.path.join(FILES_DIR, f"{index:05d}.bin")
        if os.path.exists(path) and os.path.getsize(path) == FILE_BYTES:
            continue
        with open(path, "wb") as handle:
            handle.write(os.urandom(FILE_BYTES))
            handle.flush()
            os.fsync(handle.fileno())


def set_cache(state: Optional[str]) -> None:
    """Put the files in a page-cache state before a launch: ``cold`` (every file dropped from
    the page cache), ``warm`` (every file read once), None (as they are)."""
    if state is None:
        return
    from ddp_profile.profiler.drop_pages import drop

    for name in os.listdir(FILES_DIR):
        path = os.path.join(FILES_DIR, name)
        if state == "cold":
            drop(path)
        else:
            with open(path, "rb") as handle:
                while handle.read(1 << 20):
                    pass


def scratch(prefix: str) -> str:
    base = os.environ.get("DDP_PROFILE_BENCH_TMP") or None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def torchrun_command(script: str, args: list[str], nproc: Optional[int] = None) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc or NPROC}", "--max-restarts=0", script, *args]


def _read_ranks(out_pattern: str, nproc: Optional[int] = None) -> list[dict[str, Any]]:
    results = []
    for rank in range(nproc or NPROC):
        path = out_pattern.format(rank=rank)
        if os.path.exists(path):
            with open(path) as handle:
                results.append(json.load(handle))
    return results


def run_plain(args: list[str], work: str, timeout_s: float = 600.0,
              script: str = WORKLOAD, nproc: Optional[int] = None,
              command: Optional[list[str]] = None) -> dict[str, Any]:
    """The workload under plain torchrun (``nproc`` ranks), or ``command`` followed by the
    script's arguments (e.g. a peer's launcher); the per-rank self-measurements and the launch
    times."""
    out = os.path.join(work, "res-{rank}.json")
    env = dict(os.environ)
    env.pop("DDP_PROFILE", None)
    argv = [*(command or torchrun_command(script, [], nproc)), *args, "--out", out]
    started_ns = time.time_ns()
    with open(os.path.join(work, "launcher.log"), "ab") as log:
        try:
            proc = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=timeout_s)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = -9
    ended_ns = time.time_ns()
    return {"returncode": returncode, "ranks": _read_ranks(out, nproc),
            "started_ns": started_ns, "ended_ns": ended_ns}


def run_instrumented(args: list[str], work: str, warmup: int = 5, steps: int = 10 ** 6,
                     timeout_s: float = 600.0, script: str = WORKLOAD,
                     with_out: bool = True) -> dict[str, Any]:
    """The workload as a ddp-profile probe (instrumentation, telemetry samplers, records)."""
    from ddp_profile.profiler.launch.ranks import LaunchSpec, launch
    from ddp_profile.profiler.settings import ProbePlan
    from ddp_profile.profiler.sweep.probe import summarise_probe

    out = os.path.join(work, "res-{rank}.json")
    spec = LaunchSpec(script=script, script_args=tuple([*args, "--out", out] if with_out
                                                       else args),
                      nproc_per_node=NPROC)
    plan = ProbePlan(probe_id="p000", out_dir=os.path.join(work, "probe"), warmup=warmup,
                     steps=steps)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        started_ns = time.time_ns()
        outcome = launch(spec, plan, timeout_s)
        ended_ns = time.time_ns()
    finally:
        os.chdir(cwd)
    entry = summarise_probe(plan, outcome, "sweep", timeout_s).to_json()
    return {"returncode": outcome.returncode, "ranks": _read_ranks(out), "entry": entry,
            "probe_dir": plan.out_dir, "started_ns": started_ns, "ended_ns": ended_ns}


def slowest_median(result: dict[str, Any]) -> Optional[float]:
    """Median step time of the slowest rank (the job's pace)."""
    values = [r["median_step_s"] for r in result["ranks"]]
    return max(values) if len(values) == NPROC else None


def slowest(result: dict[str, Any], key: str) -> Optional[float]:
    values = [r[key] for r in result["ranks"]]
    return max(values) if len(values) == NPROC else None


def median(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rnd(value: Optional[float], digits: int = 4) -> Optional[float]:
    return None if value is None else round(value, digits)


def package_version(name: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None


def cleanup(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---- the record of every run ---------------------------------------------------------------
# Each benchmark's final JSON goes through ``finish``: printed as the last line (as before), and
# appended as one line to ``benchmarks/results/<benchmark>.jsonl`` with when, at which commit,
# on which machine and with which arguments it was measured. ``benchmarks/history.py`` renders
# those lines as tables. ``DDP_PROFILE_BENCH_RESULTS`` names another directory, or ``off``.
RESULTS = os.path.join(REPO, "benchmarks", "results")


def results_dir() -> Optional[str]:
    chosen = os.environ.get("DDP_PROFILE_BENCH_RESULTS")
    if chosen is not None and chosen.strip().lower() in ("off", "0", "no", "false", ""):
        return None
    return chosen or RESULTS


def git_commit() -> Optional[str]:
    """The checkout's commit (``+dirty`` where tracked files differ from it), or None."""
    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return commit


def machine_brief() -> dict[str, Any]:
    """The machine, without importing torch (a benchmark's figures may not have needed it)."""
    model = cpu_model()
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model,
            "arch": platform.machine(), "python": platform.python_version(),
            "torch": package_version("torch"), "host": platform.node()}


def record(benchmark: str, figures: Any, args: Optional[list[str]] = None,
           note: Optional[str] = None) -> dict[str, Any]:
    """One run's line: {date, commit, machine, benchmark, args, figures[, note]}."""
    line = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": git_commit(),
            "machine": machine_brief(), "benchmark": benchmark,
            "args": list(sys.argv[1:] if args is None else args), "figures": figures}
    if note:
        line["note"] = note
    return line


def finish(benchmark: str, figures: Any, args: Optional[list[str]] = None,
           note: Optional[str] = None, indent: Optional[int] = None) -> Any:
    """Print a benchmark's final JSON (its last line) and append its record to the results."""
    print(json.dumps(figures, indent=indent, default=str), flush=True)
    where = results_dir()
    if where is not None:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, f"{benchmark}.jsonl"), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record(benchmark, figures, args, note), default=str) + "\n")
    return figures
