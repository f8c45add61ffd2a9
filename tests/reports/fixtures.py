"""Synthetic run directories for the report tests and the render benchmark.

``write_run_dir(path, Scenario(...))`` writes ``run.json``, ``summary.json``, ``ledger.jsonl``
and ``probes/<id>/rank-N.jsonl`` in the formats of ``docs/internals.md``; load the result with
``load_run``. The numbers are deterministic (seeded) and shaped like a real sweep: more
workers shrink the data wait, a straggler rank is slower on every step, a failed probe has an
error record and no steps.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Optional

from ddp_profile.profiler.store.record import dumps

SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "batch_size")


@dataclass(frozen=True)
class Scenario:
    """What to synthesise; every field has a small default."""

    num_workers: tuple[int, ...] = (0, 2, 4)
    batch_sizes: tuple[int, ...] = (32,)
    pin_memory: tuple[bool, ...] = (False,)
    ranks: int = 2
    steps: int = 30
    warmup: int = 3
    data_bound: bool = True          # data wait dominates at low num_workers
    straggler_rank: Optional[int] = None
    gpu: bool = False
    failed_probe: bool = False       # one extra probe that ran out of memory
    host_samples_per_s: float = 10.0
    script: str = "train.py"
    script_args: tuple[str, ...] = ("--epochs", "1")
    hostname: str = "node-a"
    error_message: str = "CUDA out of memory. Tried to allocate 2.00 GiB"
    finding_title: str = "Ranks wait for data"
    extra_summary: dict[str, Any] = field(default_factory=dict)
    seed: int = 0


def data_bound() -> Scenario:
    return Scenario()


def straggler() -> Scenario:
    return Scenario(data_bound=False, straggler_rank=1, ranks=4)


def no_gpu() -> Scenario:
    return Scenario(gpu=False)


def with_gpu() -> Scenario:
    return Scenario(gpu=True)


def failed_probe() -> Scenario:
    return Scenario(failed_probe=True)


def scale(probes: int = 50, ranks: int = 8, steps: int = 200) -> Scenario:
    """``probes`` probes in all (sweep, a ceiling and a failed one) on ``ranks`` ranks."""
    return Scenario(num_workers=(0, 1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32),
                    batch_sizes=(16, 32, 64, 128), pin_memory=(False, True), ranks=ranks,
                    steps=steps, gpu=True, failed_probe=True,
                    extra_summary={"_max_probes": max(1, probes - 2)})


def _step_times(scenario: Scenario, config: dict[str, Any], rank: int, kind: str,
                rng: random.Random) -> tuple[float, float, float]:
    compute = 0.02 * config["batch_size"] / 32
    if kind == "ceiling":
        wait = 0.0005
    elif scenario.data_bound:
        wait = 0.06 * config["batch_size"] / 32 / (1 + config["num_workers"])
    else:
        wait = 0.002
    other = 0.002
    if scenario.straggler_rank == rank:
        compute *= 1.8
    jitter = 1 + rng.uniform(-0.05, 0.05)
    return wait * jitter, compute * jitter, other


def _configs(scenario: Scenario) -> list[dict[str, Any]]:
    configs = [{"num_workers": w, "pin_memory": p, "prefetch_factor": 2 if w else None,
                "batch_size": b}
               for b, w, p in itertools.product(scenario.batch_sizes, scenario.num_workers,
                                                scenario.pin_memory)]
    limit = scenario.extra_summary.get("_max_probes")
    return configs[:limit] if limit else configs


def _rank_records(scenario: Scenario, probe: dict[str, Any], rank: int,
                  rng: random.Random) -> list[dict[str, Any]]:
    config = probe["config"]
    t0 = 1_700_000_000_000_000_000 + rank * 1_000_000
    records: list[dict[str, Any]] = [{
        "kind": "context", "rank": rank, "local_rank": rank, "node_rank": 0,
        "world_size": scenario.ranks, "hostname": scenario.hostname, "pid": 1000 + rank,
        "device": "cuda" if scenario.gpu else "cpu", "argv": [scenario.script,
                                                              *scenario.script_args],
        "t_ns": t0, "applied": dict(config)}]
    if probe["status"] != "ok":
        records.append({"kind": "error", "rank": rank, "exc_type": "OutOfMemoryError",
                        "message": scenario.error_message, "last_line": "loss.backward()",
                        "oom": True, "t_ns": t0})
        return records
    t = t0
    for step in range(scenario.steps + scenario.warmup):
        wait, compute, other = _step_times(scenario, config, rank, probe["kind"], rng)
        records.append({"kind": "step", "rank": rank, "loader_id": 0, "step": step,
                        "measured": step >= scenario.warmup, "t_ns": t, "data_wait_s": wait,
                        "compute_s": compute, "other_s": other, "forward_s": compute / 3,
                        "samples": config["batch_size"]})
        t += int((wait + compute + other) * 1e9)
    busy = 1 - _step_times(scenario, config, rank, probe["kind"], rng)[0] / 0.1
    n_host = max(2, int((t - t0) / 1e9 * scenario.host_samples_per_s))
    for i in range(n_host):
        ts = t0 + int(i * (t - t0) / n_host)
        records.append({"kind": "sample", "rank": rank, "source": "host", "t_ns": ts,
                        "cpu_percent": 30 + 10 * config["num_workers"] + rng.uniform(0, 5),
                        "worker_cpu_percent": 20.0 * config["num_workers"]})
        if scenario.gpu:
            records.append({"kind": "sample", "rank": rank, "source": "gpu", "t_ns": ts,
                            "gpu_util_percent": max(0.0, min(100.0, 100 * busy
                                                             + rng.uniform(-5, 5))),
                            "gpu_mem_used_bytes": 8e9 + config["batch_size"] * 2e7})
    records.append({"kind": "end", "rank": rank, "reason": "steps_done",
                    "training_loader_id": 0, "steps_recorded": scenario.steps, "t_ns": t})
    return records


def _probe_summary(scenario: Scenario, probe: dict[str, Any],
                   rank_records: dict[int, list[dict[str, Any]]]) -> None:
    from ddp_profile.profiler.store.results import rank_step_stats

    per_rank = []
    for rank, records in rank_records.items():
        stats = rank_step_stats([r for r in records if r["kind"] == "step"])
        per_rank.append({"rank": rank, "node": 0, "steps": stats["steps"],
                         "data_wait_fraction": _none(stats["data_wait_fraction"]),
                         "step_time_median_s": _none(stats["step_time_median_s"]),
                         "throughput": _none(stats["throughput"])})
    probe["per_rank"] = per_rank
    ok = probe["status"] == "ok"
    slowest = max((r["step_time_median_s"] for r in per_rank if r["step_time_median_s"]),
                  default=None)
    probe["throughput"] = (probe["config"]["batch_size"] * scenario.ranks / slowest
                           if ok and slowest else None)
    waits = [r["data_wait_fraction"] for r in per_rank if r["data_wait_fraction"] is not None]
    probe["data_wait_fraction"] = sum(waits) / len(waits) if waits else None
    probe["steps_measured"] = scenario.steps if ok else 0


def _none(value: float) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _probes(scenario: Scenario) -> list[dict[str, Any]]:
    configs = _configs(scenario)
    probes = [{"id": f"p{i:03d}", "kind": "baseline" if i == 0 else "sweep", "config": c,
               "requested": dict(c), "status": "ok", "reason": None, "error": None,
               "root_cause_rank": None, "wall_s": 12.5, "time_to_first_batch_s": 0.4,
               "step_time_cv": 0.01, "skipped_overrides": []}
              for i, c in enumerate(configs)]
    ceiling_config = dict(configs[-1])
    probes.append({**probes[0], "id": "ceiling", "kind": "ceiling", "config": ceiling_config,
                   "requested": dict(ceiling_config)})
    if scenario.failed_probe:
        big = {**configs[-1], "batch_size": max(scenario.batch_sizes) * 4}
        probes.append({**probes[0], "id": f"p{len(configs):03d}", "kind": "sweep",
                       "config": big, "requested": dict(big), "status": "oom",
                       "reason": "exit_code", "error": scenario.error_message,
                       "root_cause_rank": 0})
    return probes


def _findings(scenario: Scenario) -> list[dict[str, Any]]:
    findings = []
    if scenario.data_bound:
        findings.append({"rule": "data_wait", "severity": "high", "title": scenario.finding_title,
                         "evidence": "At num_workers=0, 74% of each step is spent waiting for "
                                     "the next batch on every rank.",
                         "recommendation": "Use num_workers=4.", "ranks": []})
    if scenario.straggler_rank is not None:
        findings.append({"rule": "straggler", "severity": "medium",
                         "title": f"Rank {scenario.straggler_rank} is a straggler",
                         "evidence": {"median_step_s": 0.04, "others_median_step_s": 0.022},
                         "recommendation": "Check the host of that rank.",
                         "ranks": [scenario.straggler_rank]})
    findings.append({"rule": "pin_memory", "severity": "low", "title": "pin_memory is off",
                     "evidence": ["device is cuda", "pin_memory=False"],
                     "recommendation": "Set pin_memory=True.", "ranks": []})
    return findings


def build_summary(scenario: Scenario, probes: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [p for p in probes if p["status"] == "ok" and p["kind"] != "ceiling"]
    best = max(ok, key=lambda p: p["throughput"] or 0)
    ceiling = next(p for p in probes if p["kind"] == "ceiling")
    for probe in probes:
        if probe["throughput"] is not None and ceiling["throughput"]:
            probe["score"] = probe["throughput"] / ceiling["throughput"]
        else:
            probe["score"] = None
    speedup = best["throughput"] / probes[0]["throughput"]
    cmd = " ".join(["ddp-profile", "run", scenario.script, *scenario.script_args])
    recommended = dict(best["config"])
    snippet = ("DataLoader(dataset, " + ", ".join(f"{k}={recommended[k]!r}" for k in SETTINGS)
               + ")")
    summary = {
        "schema_version": 1, "script": scenario.script,
        "script_args": list(scenario.script_args), "world_size": scenario.ranks,
        "nproc_per_node": scenario.ranks, "device": "cuda" if scenario.gpu else "cpu",
        "gpu_available": scenario.gpu,
        "gpu_unavailable_reason": None if scenario.gpu else "no NVIDIA driver (libnvidia-ml.so "
                                                            "not found)",
        "backend": "nccl" if scenario.gpu else "gloo",
        "environment": {"torch_version": "2.13.0", "cuda_version": "12.8" if scenario.gpu
                        else None, "driver_version": "570.86" if scenario.gpu else None,
                        "gpu_name": "NVIDIA H100 80GB HBM3" if scenario.gpu else None,
                        "cpu_count": 32, "hostname": scenario.hostname, "python": "3.11.9",
                        "command_line": cmd},
        "baseline": dict(probes[0]["config"]), "recommended": recommended,
        "expected_speedup": speedup,
        "expected_speedup_interval": [speedup * 0.93, speedup * 1.06],
        "ceiling_throughput": ceiling["throughput"], "search": {"mode": "grid"},
        "probes": probes, "findings": _findings(scenario),
        "recommendation": {"snippet": snippet,
                           "notes": ["Measured on 2 ranks; re-check at full scale."],
                           "ceiling_share": best["throughput"] / ceiling["throughput"]},
    }
    summary.update({k: v for k, v in scenario.extra_summary.items() if not k.startswith("_")})
    return summary


def write_run_dir(path: str, scenario: Scenario) -> str:
    """Write a complete synthetic run directory for ``scenario`` at ``path``; return ``path``."""
    rng = random.Random(scenario.seed)
    probes = _probes(scenario)
    for probe in probes:
        probe_dir = os.path.join(path, "probes", probe["id"])
        os.makedirs(probe_dir, exist_ok=True)
        rank_records = {}
        for rank in range(scenario.ranks):
            records = _rank_records(scenario, probe, rank, rng)
            rank_records[rank] = records
            with open(os.path.join(probe_dir, f"rank-{rank}.jsonl"), "w",
                      encoding="utf-8") as handle:
                handle.write("\n".join(dumps(r) for r in records) + "\n")
        _probe_summary(scenario, probe, rank_records)
    summary = build_summary(scenario, probes)
    meta = {"script": scenario.script, "script_args": list(scenario.script_args),
            "launcher": "torchrun", "nproc_per_node": scenario.ranks}
    with open(os.path.join(path, "run.json"), "w", encoding="utf-8") as handle:
        json.dump(meta, handle)
    with open(os.path.join(path, "summary.json"), "w", encoding="utf-8") as handle:
        handle.write(dumps(summary))
    with open(os.path.join(path, "ledger.jsonl"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(dumps(p) for p in probes) + "\n")
    return path
