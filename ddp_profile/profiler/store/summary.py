"""Build ``summary.json`` from the run metadata and the ledger (no I/O here).

``build_summary`` composes every field the run itself gives (the probes, the baseline, the
ceiling, the search, the capacity model); ``commands.run.finalize`` adds the analysis's
(``rules.evaluate``: findings, recommendation) to it once. The capacity model is the sweep's
(``decide.capacity.run_capacity``), handed in by the caller: the store does not reach up.
"""

from __future__ import annotations

import platform
from typing import Any, Callable, Optional, Sequence

from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import ProbeRecord, latest_ceiling, script_settings_probe
from ddp_profile.profiler.store.record import SCHEMA_VERSION

# (probes, rank context, ranks sharing a host, ceiling samples/s) -> the capacity model
CapacityModel = Callable[[Sequence[ProbeRecord], dict[str, Any], Optional[int],
                          Optional[float]], Optional[dict[str, Any]]]


def _settings(config: LoaderSettings) -> Optional[dict[str, Any]]:
    """The settings a probe ran (None where no training loader ran)."""
    return config.to_dict() if config != LoaderSettings() else None


def build_summary(meta: dict[str, Any], entries: Sequence[ProbeRecord],
                  context: Optional[dict[str, Any]], gpu: dict[str, Any],
                  state: str, search: Optional[dict[str, Any]] = None,
                  capacity: Optional[CapacityModel] = None) -> dict[str, Any]:
    """The summary before the rules ran: probes and baseline; the recommendation keys are null
    until ``rules.recommend`` (the one author of the choice) fills them. ``search``: what the
    sweep decided (axes, timeout, cache regime), over the metadata's; ``capacity``: the
    capacity model to run over the probes (none: no model)."""
    context = context or {}
    baseline = script_settings_probe(entries)
    ceiling = latest_ceiling(entries)
    ceiling_tp = ceiling.throughput if ceiling else None
    probes = [{**entry.to_json(), "score": entry.throughput / ceiling_tp
               if entry.throughput and ceiling_tp else None} for entry in entries]
    ranks_per_host = baseline.host.ranks_per_host if baseline is not None else None
    return {
        "schema_version": SCHEMA_VERSION,
        "state": state,  # running | complete | interrupted | failed
        "script": meta.get("script"),
        "script_args": meta.get("script_args", []),
        "launcher": meta.get("launcher"),
        "nproc_per_node": meta.get("nproc_per_node"),
        "ranks_per_host": ranks_per_host,  # as observed
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
        "baseline": _settings(baseline.config) if baseline else None,
        "recommended": None,
        "recommended_probe": None,
        "expected_speedup": None,
        "expected_speedup_interval": None,
        "ceiling_throughput": ceiling_tp,
        "ceiling_probe": ceiling.id if ceiling else None,
        "ceiling_failed": None if ceiling else next(
            (f"{e.id}: {e.ceiling_failed}" for e in reversed(entries) if e.ceiling_failed),
            None),
        "capacity": capacity(entries, context, ranks_per_host or meta.get("nproc_per_node"),
                             ceiling_tp) if capacity else None,
        "probes": probes,
        "findings": [],
        "recommendation": None,
    }
