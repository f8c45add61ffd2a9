"""``ddp-profile run``, ``demo`` and ``report``: thin orchestration over the parts.

The measurements land on disk before anything interprets them: each probe's ledger line is
written as the probe ends; summary.json is written once at the end, also when the rules fail,
and the report is rendered after it, so a failure there loses nothing.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from ddp_profile.errors import BadRunDir, Interrupted, ScriptInvalid, ScriptNotFound, UsageError
from ddp_profile.profiler import allocation
from ddp_profile.profiler.decide.capacity import run_capacity
from ddp_profile.profiler.launch.coordinate import Coordinator, coordinator_address, follow
from ddp_profile.profiler.launch.ranks import LaunchSpec
from ddp_profile.profiler.store.probes import records
from ddp_profile.profiler.store.results import Run, assemble, load_run, read_probes
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.store.summary import build_summary
from ddp_profile.profiler.sweep.search import Sweep
from ddp_profile.profiler.sweep.space import SearchSpace
from ddp_profile.profiler.sweep.state import SweepOptions
from ddp_profile.reports.console import ConsoleProgress, print_summary

ANSWERED = ("complete", "budget_spent")  # the states a run's evidence is analysed in


@dataclass(frozen=True)
class RunRequest:
    script: str
    script_args: tuple[str, ...]
    out: Optional[str]
    launcher: str
    nproc_per_node: Optional[int]
    space: SearchSpace
    options: SweepOptions
    torchrun_args: tuple[str, ...] = ()
    local_rank_flag: Optional[str] = None


def check_script(path: str) -> None:
    """A missing or uncompilable script is a usage problem, found before any launch."""
    if not os.path.isfile(path):
        raise ScriptNotFound(f"script not found: {path}")
    try:
        with open(path, "rb") as handle:
            compile(handle.read(), path, "exec")
    except SyntaxError as exc:
        raise ScriptInvalid(f"{path}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise ScriptInvalid(f"{path}: cannot be read as Python: {exc}") from None


def detect_local_rank_flag(path: str) -> Optional[str]:
    """The ``--local_rank`` / ``--local-rank`` flag a ``torch.distributed.launch`` script
    declares, if any."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        source = handle.read()
    for flag in ("--local_rank", "--local-rank"):
        if f"'{flag}'" in source or f'"{flag}"' in source:
            return flag
    return None


def default_nproc() -> int:
    """The visible GPUs, or 2 on a machine without one.

    Counted without creating a CUDA context in this process: ``CUDA_VISIBLE_DEVICES`` if set,
    else the devices NVML sees.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        return len(devices) or 2
    status = _gpu_status()
    return len(status.get("gpus") or []) or 2


def _cpu_model() -> Optional[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def run_meta(request: RunRequest, nproc: int) -> dict[str, Any]:
    return {
        "schema_version": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "script": os.path.abspath(request.script), "script_args": list(request.script_args),
        "launcher": request.launcher, "nproc_per_node": nproc,
        "torchrun_args": list(request.torchrun_args), "local_rank_flag": request.local_rank_flag,
        "space": request.space.to_dict(), "options": asdict(request.options),
        "hostname": socket.gethostname(), "cpu_model": _cpu_model(),
        "command_line": shlex.join(["ddp-profile", *sys.argv[1:]]),
        "search": {"strategy": request.options.search},
    }


def default_out_dir(script: str) -> str:
    stem = os.path.splitext(os.path.basename(script))[0]
    return os.path.join("ddp-profile-runs", f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}")


def spec_from_meta(meta: dict[str, Any]) -> LaunchSpec:
    flag = meta.get("local_rank_flag")
    extra: tuple[tuple[str, str], ...] = (("DDP_PROFILE_LOCAL_RANK_FLAG", flag),) if flag else ()
    if meta.get("allocation"):
        extra += tuple(allocation.Allocation(**meta["allocation"]).rank_env().items())
    return LaunchSpec(script=meta["script"], script_args=tuple(meta.get("script_args", [])),
                      launcher=meta.get("launcher", "torchrun"),
                      nproc_per_node=int(meta.get("nproc_per_node", 2)),
                      torchrun_args=tuple(meta.get("torchrun_args", [])), extra_env=extra)


def start_run(request: RunRequest) -> str:
    """Create the run directory for a new run; return its path."""
    check_script(request.script)
    nproc = request.nproc_per_node or default_nproc()
    if nproc < 1:
        raise UsageError("--nproc-per-node must be at least 1")
    request = RunRequest(**{**request.__dict__,
                            "local_rank_flag": request.local_rank_flag or
                            detect_local_rank_flag(request.script)})
    out = request.out or default_out_dir(request.script)
    meta = run_meta(request, nproc)
    found = allocation.detect()
    if found is not None:  # the ranks already exist: run this one in place, no nested launch
        meta.update(launcher="inplace", nproc_per_node=1, allocation=asdict(found))
    address = coordinator_address(request.torchrun_args, found)
    if address is not None:
        host, port, member, members = address
        meta["coordination"] = {"host": host, "port": port, "member": member,
                                "members": members}
        if member != 0:
            out = f"{out.rstrip(os.sep)}-member{member}"
    RunDir(out).create(meta)
    return out


KEEP = object()  # ``execute``'s budget: the one the run was started with


def execute(out: str, *, report: bool = True, quiet: bool = False, verbose: bool = False,
            budget_s: Any = KEEP) -> dict[str, Any]:
    """Run (or finish) the sweep recorded in ``out``; return the final summary (printed
    unless ``quiet``; with the method's detail where ``verbose``). ``budget_s``: the time this
    call may spend (a resumed run's own, or none), else the run's."""
    run_dir = RunDir(out)
    meta = run_dir.read_meta()
    check_script(meta["script"])
    spec = spec_from_meta(meta)
    options = SweepOptions(**meta["options"])
    if budget_s is not KEEP:
        options = replace(options, budget_s=budget_s)
    coordinator = _coordinator(meta)
    if coordinator is not None and not coordinator.is_leader:
        probes = follow(coordinator, spec, run_dir, meta.get("local_rank_flag"))
        if not quiet:
            print(f"ddp-profile: member {coordinator.member} ran {probes} probe(s); the results "
                  f"are in the run directory of member 0")
        return {"follower": True, "probes_run": probes}
    progress = ConsoleProgress(quiet=quiet)
    sweep = Sweep(run_dir, spec, SearchSpace.from_dict(meta["space"]), options,
                  progress=progress, coordinator=coordinator)
    gpu = _gpu_status()
    state = "failed"
    try:
        sweep.run()
        state = "budget_spent" if sweep.search.budget_stop else "complete"
    except KeyboardInterrupt:
        state = "interrupted"
        raise Interrupted(f"interrupted; finished probes are kept: continue with "
                          f"ddp-profile run {meta['script']} --resume --out {out}") from None
    finally:
        progress.close()
        summary = finalize(run_dir, meta, sweep, gpu, state,
                           report=report and state in ANSWERED)
    if not quiet:
        print_summary(summary, out, verbose=verbose)
    return summary


def _coordinator(meta: dict[str, Any]) -> Optional[Coordinator]:
    coordination = meta.get("coordination")
    if not coordination:
        return None
    return Coordinator(coordination["host"], int(coordination["port"]),
                       int(coordination["member"]), int(coordination["members"]))


def _gpu_status() -> dict[str, Any]:
    try:
        from ddp_profile.profiler.telemetry.nvml import gpu_status

        return gpu_status()
    except Exception as exc:  # noqa: BLE001 - no GPU is a normal case
        return {"gpu_available": False, "gpu_unavailable_reason": f"{type(exc).__name__}: {exc}"}


def finalize(run_dir: RunDir, meta: dict[str, Any], sweep: Sweep, gpu: dict[str, Any],
             state: str, report: bool) -> dict[str, Any]:
    """The summary from the ledger and, for a finished run, the rules' findings and
    recommendation: the run is loaded once and evaluated once, summary.json written once (also
    when the rules fail), and the report rendered from the same loaded run."""
    entries = sweep.entries or records(run_dir.ledger())
    tables = read_probes(run_dir.path, [e.id for e in entries], sweep.measurer.rank_data)
    summary = build_summary(meta, entries, tables.first_context(), gpu, state,
                            search={"axes": sweep.axes.to_dict() if sweep.axes else None,
                                    "timeout_s": sweep.timeout_s,
                                    "cache": {**sweep.measurer.regime.to_dict(),
                                              "warmed": sweep.measurer.warmed,
                                              "unheld": sweep.measurer.regime_unheld},
                                    **stops(sweep)},
                            capacity=run_capacity)
    run: Optional[Run] = None
    try:
        if state in ANSWERED and any(e.ok for e in entries):
            run = assemble(run_dir.path, meta, summary, tables)
            from ddp_profile.rules import evaluate

            # the run's own fields and the analysis's, composed here once; nothing is written
            # back into what evaluate read
            summary = {**summary, **evaluate(run).summary_fields()}
            run = replace(run, summary=summary)
    finally:
        run_dir.write_summary(summary)
    if report and run is not None:
        render_report(run, os.path.join(run_dir.path, "report.html"))
    return summary


def stops(sweep: Sweep) -> dict[str, Any]:
    """Where the sweep stopped short, for summary.json's ``search``: the worker ladder's end
    (``ladder_stop``), how each alternation in launches ended (``alternations``:
    ``decide.stopping``) and, where the run had a budget, its use and stop (``budget``)."""
    ladder, budget, options = sweep.search.ladder_stop, sweep.search.budget_stop, \
        sweep.search.options
    ended = sweep.search.alternation_stops
    return {**({"ladder_stop": ladder.to_dict()} if ladder is not None else {}),
            **({"alternations": [dict(e) for e in ended]} if ended else {}),
            **({"budget": {"budget_s": options.budget_s,
                           "spent_s": round(sweep.measurer.budget.elapsed_s(), 1),
                           "stopped": budget}} if options.budget_s else {})}


def write_report(run_path: str, out_path: str, summary: bool = False) -> str:
    """``ddp-profile report``: load a run directory and render its report to ``out_path``;
    with ``summary``, print the run's summary with the method's detail too."""
    run = load_run(run_path)
    path = render_report(run, out_path)
    if summary:
        print_summary(run.summary, run_path, verbose=True)
    return path


def render_report(run: Run, out_path: str) -> str:
    from ddp_profile.reports.html import write_report as write_html

    if not run.summary.get("probes"):
        raise BadRunDir(f"{run.path} has no probes to report")
    return write_html(run, out_path)
