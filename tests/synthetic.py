"""Write small, realistic run directories for tests of rules, reports and the gate.

``write_run(path, probes=[...])`` lays out exactly what a real sweep leaves behind (see
docs/internals.md): ``run.json``, ``ledger.jsonl``, ``summary.json`` and
``probes/<id>/rank-N.jsonl`` with context, loader_iter, step, event, error and end records.
The summary's per-probe figures are computed from the step records the same way the profiler
computes them, so ``load_run`` sees a self-consistent run.

Step times come from ``step_time_fn(probe_id, rank, step) -> seconds`` or
``-> (data_wait_s, compute_s, other_s)``; by default a seeded lognormal noise model (5 % CV)
around a base time that falls with ``num_workers``. Examples::

    write_run(tmp_path / "run")                                   # two probes, two ranks
    write_run(tmp_path / "run", probes=[probe("slow", num_workers=0, step_time_fn=...)])
    write_run(tmp_path / "run", probes=[probe("a"), probe("b", status="oom")])
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from ddp_profile.profiler.store.epochs import rank_step_stats
from ddp_profile.profiler.store.record import clean_json

StepTime = Union[float, Sequence[float]]
StepTimeFn = Callable[[str, int, int], StepTime]
SampleFn = Callable[[str, int, int, int], list[dict[str, Any]]]  # id, rank, t0_ns, end_ns
DEFAULT_CONFIG = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                  "batch_size": 32}
T0_NS = 1_700_000_000_000_000_000


@dataclass
class SyntheticProbe:
    """One probe to write. ``None`` fields fall back to ``write_run``'s arguments."""

    id: str
    config: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"  # ok | oom | crash | timeout
    kind: str = "sweep"  # baseline | sweep | ceiling
    step_time_fn: Optional[StepTimeFn] = None
    steps: Optional[int] = None
    warmup: Optional[int] = None
    ranks: Optional[Sequence[int]] = None  # which ranks write a file (default: all)
    root_cause_rank: Optional[int] = None
    events: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "data"}], every rank
    reason: Optional[str] = None  # of a failed probe (default: from its status)
    error: Optional[str] = None  # of a failed probe: its message (default: from its status)
    sample_fn: Optional[SampleFn] = None  # telemetry "sample" records of an ok probe's rank


def probe(probe_id: str, *, status: str = "ok", kind: str = "sweep",
          step_time_fn: Optional[StepTimeFn] = None, steps: Optional[int] = None,
          **config: Any) -> SyntheticProbe:
    """Shorthand: ``probe("w4", num_workers=4, pin_memory=True)``."""
    return SyntheticProbe(id=probe_id, config=config, status=status, kind=kind,
                          step_time_fn=step_time_fn, steps=steps)


def lognormal_step_time(base_s: float = 0.05, cv: float = 0.05, seed: int = 0,
                        data_wait_fraction: float = 0.2) -> StepTimeFn:
    """A seeded step-time model: lognormal noise with coefficient of variation ``cv``."""
    sigma = math.sqrt(math.log(1 + cv * cv))

    def step_time(probe_id: str, rank: int, step: int) -> tuple[float, float, float]:
        rng = random.Random(f"{seed}:{probe_id}:{rank}:{step}")
        total = base_s * math.exp(rng.gauss(-sigma * sigma / 2, sigma))
        wait = total * data_wait_fraction
        return wait, total - wait - total * 0.05, total * 0.05

    return step_time


def _default_step_time(config: dict[str, Any], seed: int) -> StepTimeFn:
    workers = config.get("num_workers") or 0
    base = 0.02 + 0.06 / (1 + workers)
    return lognormal_step_time(base, 0.05, seed, data_wait_fraction=0.6 / (1 + workers))


def _split(value: StepTime) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        return 0.2 * value, 0.75 * value, 0.05 * value
    wait, compute, other = value
    return float(wait), float(compute), float(other)


def _context(rank: int, world_size: int, env: dict[str, Any], config: dict[str, Any],
             nproc_per_node: int) -> dict[str, Any]:
    return {"kind": "context", "rank": rank, "local_rank": rank % nproc_per_node,
            "node_rank": rank // nproc_per_node, "world_size": world_size,
            "hostname": env["hostname"], "pid": 1000 + rank, "backend": env["backend"],
            "device": env["device"], "torch_version": env["torch_version"],
            "cuda_version": env.get("cuda_version"), "cpu_count": 2, "cpus_available": 2,
            "argv": env.get("argv", ["train.py"]), "t_ns": T0_NS,
            "loader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                       "batch_size": config.get("batch_size"), "persistent_workers": False,
                       "drop_last": False, "sampler": "DistributedSampler",
                       "sampler_shuffle": True, "distributed_sampler": True,
                       "batch_sampler": "BatchSampler", "dataset_len": 4096},
            "applied": dict(config), "skipped_overrides": []}


def _rank_records(spec: SyntheticProbe, rank: int, world_size: int, env: dict[str, Any],
                  config: dict[str, Any], fn: StepTimeFn, steps: int, warmup: int,
                  nproc_per_node: int) -> list[dict[str, Any]]:
    records = [_context(rank, world_size, env, config, nproc_per_node),
               {"kind": "loader_iter", "loader_id": 0, "iter_index": 0, "t_ns": T0_NS,
                "first_batch_s": 0.2 + 0.1 * (config.get("num_workers") or 0)}]
    records += [{"kind": "event", "name": e["name"], "data": e.get("data", {})}
                for e in spec.events]
    failed = spec.status != "ok"
    total = warmup + (steps if not failed else steps // 3)
    t_start = T0_NS + 250_000_000
    t_ns = t_start
    for index in range(total):
        wait, compute, other = _split(fn(spec.id, rank, index))
        records.append({"kind": "step", "loader_id": 0, "step": index,
                        "measured": index >= warmup, "t_ns": t_ns, "data_wait_s": wait,
                        "compute_s": compute, "other_s": other, "forward_s": compute * 0.3,
                        "samples": config.get("batch_size") or 32})
        t_ns += int((wait + compute + other) * 1e9)
    if spec.status in ("oom", "crash") and rank == (spec.root_cause_rank or 0):
        oom = spec.status == "oom"
        message = spec.error or ("CUDA out of memory" if oom else "boom")
        records.append({"kind": "error", "exc_type": "OutOfMemoryError" if oom else "RuntimeError",
                        "message": message,
                        "last_line": "loss.backward()", "oom": oom, "t_ns": t_ns})
    elif spec.status == "ok":
        if spec.sample_fn is not None:
            records += spec.sample_fn(spec.id, rank, t_start, t_ns)
        records.append({"kind": "end", "reason": "steps_done", "training_loader_id": 0,
                        "steps_recorded": total, "t_ns": t_ns})
    return records


def _probe_summary(spec: SyntheticProbe, config: dict[str, Any],
                   rank_steps: dict[int, list[dict[str, Any]]], nproc_per_node: int,
                   wall_s: float) -> dict[str, Any]:
    stats = {rank: rank_step_stats(steps) for rank, steps in rank_steps.items()}
    per_rank = [{"rank": r, "node": r // nproc_per_node,
                 "data_wait_fraction": s["data_wait_fraction"],
                 "step_time_median_s": s["step_time_median_s"], "throughput": s["throughput"],
                 "steps": s["steps"]} for r, s in sorted(stats.items())]
    ok = spec.status == "ok" and stats
    elapsed = max((s["elapsed_s"] for s in stats.values()), default=math.nan)
    samples = sum(s["samples"] for s in stats.values())
    wait = sum(s["data_wait_s"] for s in stats.values())
    busy = sum(s["elapsed_s"] for s in stats.values())
    step_times = [st["data_wait_s"] + st["compute_s"] + st["other_s"]
                  for steps in rank_steps.values() for st in steps if st["measured"]]
    mean = sum(step_times) / len(step_times) if step_times else math.nan
    cv = (math.sqrt(sum((t - mean) ** 2 for t in step_times) / len(step_times)) / mean
          if step_times else None)
    errors = {"oom": "CUDA out of memory", "crash": "RuntimeError: boom",
              "timeout": "probe timed out"}
    return {"id": spec.id, "kind": spec.kind, "config": config,
            "requested": {k: spec.config.get(k) for k in DEFAULT_CONFIG},
            "status": spec.status,
            "reason": None if spec.status == "ok" else spec.reason or {
                "oom": "oom", "crash": "exit_code", "timeout": "signal"}[spec.status],
            "throughput": samples / elapsed if ok and elapsed > 0 else None,
            "data_wait_fraction": wait / busy if ok and busy > 0 else None, "score": None,
            "error": spec.error or errors.get(spec.status),
            "root_cause_rank": (spec.root_cause_rank or 0) if spec.status != "ok" else None,
            "wall_s": wall_s, "time_to_first_batch_s": 0.2,
            "steps_measured": min((s["steps"] for s in stats.values()), default=0),
            "step_time_cv": cv, "skipped_overrides": [], "per_rank": per_rank}


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(clean_json(value), handle, indent=1, allow_nan=False)


def _write_probe(run_dir: str, spec: SyntheticProbe, config: dict[str, Any], fn: StepTimeFn,
                 world_size: int, env: dict[str, Any], steps: int, warmup: int,
                 nproc_per_node: int) -> dict[str, Any]:
    """Write one probe's rank files and launcher log; return its ledger entry."""
    probe_dir = os.path.join(run_dir, "probes", spec.id)
    os.makedirs(probe_dir, exist_ok=True)
    rank_steps = {}
    for rank in (spec.ranks if spec.ranks is not None else range(world_size)):
        records = _rank_records(spec, rank, world_size, env, config, fn, steps, warmup,
                                nproc_per_node)
        rank_steps[rank] = [r for r in records if r["kind"] == "step"]
        with open(os.path.join(probe_dir, f"rank-{rank}.jsonl"), "w", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in records))
    with open(os.path.join(probe_dir, "launcher.log"), "w", encoding="utf-8") as handle:
        handle.write(f"synthetic probe {spec.id}: {spec.status}\n")
    return _probe_summary(spec, config, rank_steps, nproc_per_node, 5.0)


def _snippet(config: dict[str, Any]) -> str:
    return "DataLoader(dataset, " + ", ".join(f"{k}={config.get(k)!r}" for k in DEFAULT_CONFIG) \
        + ")"


def _recommendation(summaries: list[dict[str, Any]], recommended: Optional[dict[str, Any]],
                    notes: Sequence[str]) -> dict[str, Any]:
    """The summary's recommendation keys, as a test writer states them (the fastest probe by
    default): not the tool's choice, which the rules make from the loaded run."""
    ok = [s for s in summaries if s["status"] == "ok" and s["kind"] != "ceiling"]
    best = max(ok, key=lambda s: s["throughput"] or 0, default=None)
    base = next((s for s in summaries if s["kind"] == "baseline"), summaries[0] if summaries
                else None)
    ceiling = next((s for s in reversed(summaries) if s["kind"] == "ceiling"
                    and s["status"] == "ok" and s["throughput"]), None)
    ceiling_tp = ceiling["throughput"] if ceiling else None
    for entry in summaries:
        entry["score"] = entry["throughput"] / ceiling_tp if entry["throughput"] and ceiling_tp \
            else None
    if recommended is None and best is not None:
        recommended = {k: best["config"][k] for k in DEFAULT_CONFIG}
    speedup = (best["throughput"] / base["throughput"]
               if best and base and base.get("throughput") else None)
    return {"baseline": {k: (base or {}).get("config", DEFAULT_CONFIG)[k]
                         for k in DEFAULT_CONFIG},
            "recommended": recommended, "recommended_probe": best["id"] if best else None,
            "expected_speedup": speedup,
            "expected_speedup_interval": [speedup * 0.95, speedup * 1.05] if speedup else None,
            "ceiling_throughput": ceiling_tp,
            "recommendation": {"snippet": _snippet(recommended) if recommended else "",
                               "notes": list(notes),
                               "ceiling_share": (best["throughput"] / ceiling_tp
                                                 if best and ceiling_tp else None)}}


def write_run(path: Union[str, os.PathLike], probes: Optional[Sequence[Any]] = None, *,
              world_size: int = 2, nproc_per_node: Optional[int] = None, steps: int = 30,
              warmup: int = 3, step_time_fn: Optional[StepTimeFn] = None, seed: int = 0,
              device: str = "cpu", torch_version: str = "2.13.0+cpu",
              gpu_name: Optional[str] = None, cpu_model: Optional[str] = "Synthetic CPU @ 2.0GHz",
              hostname: str = "synthetic-host", recommended: Optional[dict[str, Any]] = None,
              script: str = "train.py", script_args: Sequence[str] = (),
              notes: Sequence[str] = (), summary_extra: Optional[dict[str, Any]] = None,
              write_ledger: bool = True, write_summary: bool = True) -> str:
    """Write a run directory at ``path`` and return it (as ``str``); see the module docstring.

    ``probes``: ``SyntheticProbe`` objects or dicts of its fields; default: a "baseline" probe
    (num_workers=0) and a faster "w2" sweep probe. ``recommended``: default the fastest ok,
    non-ceiling probe's config. The last ok ceiling probe sets ``ceiling_throughput`` and the
    scores. ``summary_extra`` updates summary.json's top-level keys last.
    """
    run_dir = os.fspath(path)
    nproc_per_node = nproc_per_node or world_size
    specs = [p if isinstance(p, SyntheticProbe) else SyntheticProbe(**p)
             for p in (probes if probes is not None
                       else [probe("baseline", kind="baseline"), probe("w2", num_workers=2,
                                                                       prefetch_factor=2)])]
    env = {"hostname": hostname, "backend": "gloo" if device == "cpu" else "nccl",
           "device": device, "torch_version": torch_version, "argv": [script, *script_args],
           "cuda_version": None if device == "cpu" else "12.4"}
    os.makedirs(os.path.join(run_dir, "probes"), exist_ok=True)
    summaries = []
    for spec in specs:
        config = {**DEFAULT_CONFIG, **spec.config}
        summaries.append(_write_probe(
            run_dir, spec, config, spec.step_time_fn or step_time_fn
            or _default_step_time(config, seed), world_size, env,
            spec.steps if spec.steps is not None else steps,
            spec.warmup if spec.warmup is not None else warmup, nproc_per_node))
    summary = {
        "schema_version": 1, "script": script, "script_args": list(script_args),
        "world_size": world_size, "nproc_per_node": nproc_per_node, "device": device,
        "gpu_available": device == "cuda",
        "gpu_unavailable_reason": None if device == "cuda" else "no CUDA device",
        "backend": env["backend"],
        "environment": {"torch_version": torch_version, "cuda_version": env["cuda_version"],
                        "driver_version": None, "gpu_name": gpu_name, "cpu_model": cpu_model,
                        "cpu_count": 2, "hostname": hostname, "python": "3.11.0",
                        "command_line": " ".join(["ddp-profile run", script, *script_args])},
        **_recommendation(summaries, recommended, notes), "search": {"mode": "grid"},
        "probes": summaries, "findings": [], **(summary_extra or {})}
    _write_json(os.path.join(run_dir, "run.json"),
                {"script": script, "script_args": list(script_args), "launcher": "torchrun",
                 "nproc_per_node": nproc_per_node, "search": {"mode": "grid"}})
    if write_ledger:
        with open(os.path.join(run_dir, "ledger.jsonl"), "w", encoding="utf-8") as handle:
            handle.write("".join(json.dumps(clean_json(s)) + "\n" for s in summaries))
    if write_summary:
        _write_json(os.path.join(run_dir, "summary.json"), summary)
    return run_dir
