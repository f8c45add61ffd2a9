"""Build ``summary.json`` from the run metadata and the ledger (no I/O here)."""

from __future__ import annotations

import platform
from typing import Any, Optional

from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probes import CEILING_FAILED, Kind, Status, counts_for_choice
from ddp_profile.profiler.store.record import SCHEMA_VERSION
from ddp_profile.profiler.sweep.capacity import run_model


def _settings(config: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not config:
        return None
    return {k: config.get(k) for k in SETTING_KEYS}


def latest_ceiling(entries: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The last ok compute-only measurement (a screened one may be superseded by a probe at
    the recommended batch size) that is a ceiling (``CEILING_FAILED``: one that ran below a
    rate measured with loading is none)."""
    return next((e for e in reversed(entries) if e.get("kind") == Kind.CEILING
                 and e.get("status") == Status.OK and not e.get(CEILING_FAILED)), None)


def run_capacity(probes: list[dict[str, Any]], context: dict[str, Any],
                 local_ranks: Optional[int], ceiling: Optional[float]
                 ) -> Optional[dict[str, Any]]:
    """The input pipeline's capacity model of the run (``sweep.capacity``), or None.
    ``local_ranks``: the ranks that shared one host's CPUs (observed, else as launched)."""
    model = run_model(probes, context, local_ranks, ceiling)
    if model is None:
        return None
    return {**model.to_dict(), "demand_source": "ceiling" if ceiling else "loop",
            "measured": [{"probe": p["id"], "num_workers": (p.get("config") or {}).get(
                "num_workers"), "throughput": p.get("throughput")} for p in probes
                if counts_for_choice(p) and p.get("throughput")]}


def build_summary(meta: dict[str, Any], entries: list[dict[str, Any]],
                  context: Optional[dict[str, Any]], gpu: dict[str, Any],
                  state: str) -> dict[str, Any]:
    """The summary before the rules ran: probes and baseline; the recommendation keys are null
    until ``rules.recommend`` (the one author of the choice) fills them."""
    context = context or {}
    baseline = next((e for e in entries if e.get("kind") == Kind.BASELINE), None)
    ceiling = latest_ceiling(entries)
    ceiling_tp = ceiling.get("throughput") if ceiling else None
    probes = []
    for entry in entries:
        probe = dict(entry)
        tp = probe.get("throughput")
        probe["score"] = tp / ceiling_tp if tp and ceiling_tp else None
        probes.append(probe)
    return {
        "schema_version": SCHEMA_VERSION,
        "state": state,  # running | complete | interrupted | failed
        "script": meta.get("script"),
        "script_args": meta.get("script_args", []),
        "launcher": meta.get("launcher"),
        "nproc_per_node": meta.get("nproc_per_node"),
        "ranks_per_host": (baseline or {}).get("ranks_per_host"),  # as observed
        "world_size": context.get("world_size"),
        "device": context.get("device", "cpu"),
        "backend": context.get("backend"),
        "gpu_available": bool(gpu.get("gpu_available")),
        "gpu_unavailable_reason": gpu.get("gpu_unavailable_reason"),
        "environment": {
            "torch_version": context.get("torch_version"),
            "cuda_version": context.get("cuda_version"),
            "driver_version": gpu.get("driver_version"),
            "gpu_name": ", ".join(sorted({g.get("name", "") for g in gpu.get("gpus", [])}))
            or None,
            "cpu_count": context.get("cpu_count"),
            "cpus_available": context.get("cpus_available"),
            "cpu_model": meta.get("cpu_model"),
            "hostname": context.get("hostname") or meta.get("hostname"),
            "python": platform.python_version(),
            "command_line": meta.get("command_line"),
        },
        "search": meta.get("search", {}),
        "baseline": _settings(baseline.get("config")) if baseline else None,
        "recommended": None,
        "recommended_probe": None,
        "expected_speedup": None,
        "expected_speedup_interval": None,
        "ceiling_throughput": ceiling_tp,
        "ceiling_probe": ceiling.get("id") if ceiling else None,
        "ceiling_failed": None if ceiling else next(
            (f"{e['id']}: {e[CEILING_FAILED]}" for e in reversed(entries)
             if e.get(CEILING_FAILED)), None),
        "capacity": run_capacity(probes, context, (baseline or {}).get("ranks_per_host")
                                 or meta.get("nproc_per_node"), ceiling_tp),
        "probes": probes,
        "findings": [],
        "recommendation": None,
    }
