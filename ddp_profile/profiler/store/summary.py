"""Build ``summary.json`` from the run metadata and the ledger (no I/O here).

``build_summary`` composes every field the run itself gives (the probes, the baseline, the
ceiling, the search, the capacity model); ``commands.run.finalize`` adds the analysis's
(``rules.evaluate``: findings, recommendation) to it once. The capacity model is the sweep's
(``sweep.capacity.run_capacity``), handed in by the caller: the store does not reach up.
"""

from __future__ import annotations

import platform
from typing import Any, Callable, Optional, Sequence

from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probes import CEILING_FAILED, Kind, ProbeRecord, latest_ceiling
from ddp_profile.profiler.store.probes import records as probe_records
from ddp_profile.profiler.store.record import SCHEMA_VERSION

# (probes, rank context, ranks sharing a host, ceiling samples/s) -> the capacity model
CapacityModel = Callable[[Sequence[ProbeRecord], dict[str, Any], Optional[int],
                          Optional[float]], Optional[dict[str, Any]]]


def _settings(config: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not config:
        return None
    return {k: config.get(k) for k in SETTING_KEYS}


def build_summary(meta: dict[str, Any], entries: list[dict[str, Any]],
                  context: Optional[dict[str, Any]], gpu: dict[str, Any],
                  state: str, search: Optional[dict[str, Any]] = None,
                  capacity: Optional[CapacityModel] = None) -> dict[str, Any]:
    """The summary before the rules ran: probes and baseline; the recommendation keys are null
    until ``rules.recommend`` (the one author of the choice) fills them. ``search``: what the
    sweep decided (axes, timeout, cache regime), over the metadata's; ``capacity``: the
    capacity model to run over the probes (none: no model)."""
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
        "search": {**(meta.get("search") or {}), **(search or {})},
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
        "capacity": capacity(probe_records(probes), context, (baseline or {}).get("ranks_per_host")
                             or meta.get("nproc_per_node"), ceiling_tp) if capacity else None,
        "probes": probes,
        "findings": [],
        "recommendation": None,
    }
