"""Small readers over a ``Run``, shared by the rules and the recommendation: its probes, as
records (``store.probes.ProbeRecord``), and its tables (steps, samples, contexts, events).

Each returns an empty table, an empty list or None where the run lacks what it reads (no
evidence, no finding). Telemetry columns read from ``run.samples`` (NaN or absent when not
measured):

``host`` samples  ``cpu_percent`` (whole machine, 0-100), ``worker_cpu_percent`` (the rank's
                  DataLoader workers together, 100 = one core), ``iowait_percent``
``gpu`` samples   ``gpu_util_percent``, ``gpu_mem_used_bytes``, ``gpu_mem_total_bytes``
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import pandas as pd

from ddp_profile.profiler.store.probes import CHOICE_KINDS, Kind, ProbeRecord
from ddp_profile.profiler.store.probes import baseline_probe as store_baseline_probe
from ddp_profile.profiler.store.results import Run
from ddp_profile.profiler.store.results import global_steps as store_global_steps
from ddp_profile.rules.base import Thresholds, as_int, finite, pct

# ---- probes ------------------------------------------------------------------------------

def ok_probes(run: Run, kinds: Iterable[str] = CHOICE_KINDS) -> list[ProbeRecord]:
    """The probes that finished with status ok, of the given kinds, in run order."""
    return [r for r in run.records if r.ok and r.kind in kinds]


def measured_probes(run: Run, kinds: Iterable[str] = CHOICE_KINDS) -> list[ProbeRecord]:
    """``ok_probes`` with a throughput above 0."""
    return [r for r in ok_probes(run, kinds) if finite(r.throughput) and r.throughput > 0]


def fastest(probes: Iterable[ProbeRecord]) -> Optional[ProbeRecord]:
    """The probe of the highest throughput (the first of a tie); None where none has one."""
    return max((p for p in probes if finite(p.throughput)), key=lambda p: p.throughput,
               default=None)


def baseline_probe(run: Run) -> Optional[ProbeRecord]:
    """What the run's gains are measured against (``store.probes.baseline_probe``)."""
    return store_baseline_probe(run.records)


def find_probe(run: Run, probe_id: Any) -> Optional[ProbeRecord]:
    """The record of a probe (None if absent)."""
    try:
        return run.probe(str(probe_id))
    except KeyError:
        return None


def storage_share(probe: ProbeRecord) -> Optional[float]:
    """The share of the bytes a probe's producers read that came from storage, not the page
    cache (``decide.capacity.LoadingCost.storage_share``); None where unknown."""
    return probe.loading.storage_share if probe.loading is not None else None


def cache_mismatch(base: ProbeRecord, other: ProbeRecord,
                   thresholds: Thresholds) -> Optional[str]:
    """Why ``other`` and ``base`` were not measured like for like (their producers read from
    storage shares ``cache_margin`` apart: one read warm, from the page cache), else None."""
    a, b = storage_share(base), storage_share(other)
    if a is None or b is None or abs(a - b) < thresholds.cache_margin:
        return None
    return (f"the baseline {base.id} read {pct(a)} of its bytes from storage, probe "
            f"{other.id} {pct(b)} (the rest from the page cache)")


def storage_caveat(run: Run, base: ProbeRecord, thresholds: Thresholds) -> str:
    """Where the baseline read its bytes from storage and the capacity model rests on probes
    that read them from the page cache, a sentence saying so ("" otherwise)."""
    baseline_share = storage_share(base)
    others = [storage_share(p) for p in ok_probes(run) if p.id != base.id]
    warm = [s for s in others if s is not None and baseline_share is not None
            and baseline_share - s >= thresholds.cache_margin]
    if not warm:
        return ""
    return (f" Not like for like: the baseline read {pct(baseline_share)} of its bytes from "
            f"storage, {len(warm)} later probe(s) at most {pct(max(warm))} (the page cache): "
            "in one cache state the loading may be bound otherwise.")


def ceiling_probe(run: Run) -> Optional[ProbeRecord]:
    """The compute-only ceiling the run kept (``summary.ceiling_probe``: none where each one
    ran below a rate measured with loading); in a run written before it was kept, the last
    ok ceiling probe (at the recommended batch size)."""
    probes = [p for p in ok_probes(run, kinds=(Kind.CEILING,)) if finite(p.throughput)]
    if "ceiling_probe" in run.summary:
        probes = [p for p in probes if p.id == run.summary["ceiling_probe"]]
    return probes[-1] if probes else None


# ---- steps -------------------------------------------------------------------------------

def probe_steps(run: Run, probe_id: str, measured_only: bool = True) -> pd.DataFrame:
    """The training-loader steps of one probe (measured ones unless told otherwise)."""
    steps = run.steps
    needed = {"probe_id", "rank", "step", "data_wait_s", "compute_s", "other_s"}
    if steps is None or steps.empty or not needed.issubset(steps.columns):
        return pd.DataFrame(columns=sorted(needed))
    rows = steps[steps["probe_id"] == probe_id]
    if measured_only and "measured" in rows:
        rows = rows[rows["measured"].astype(bool)]
    rows = rows.copy()
    if "step_s" not in rows or rows["step_s"].isna().any():
        rows["step_s"] = rows["data_wait_s"] + rows["compute_s"] + rows["other_s"]
    return rows


def data_wait(run: Run, probe: ProbeRecord) -> Optional[tuple[float, float]]:
    """(the share of each step that waiting for data costs, its mean seconds per step) of a
    probe; None if unmeasured.

    The share is the probe's own (``ProbeRecord.data_wait_share``: on CUDA the GPU's idle time
    while its host waited, else the host's wait; completed from the steps of a probe recorded
    before it was kept, ``store.results.completed``); the seconds are its measured steps'.
    """
    steps = probe_steps(run, probe.id)
    waited = steps["data_wait_s"] if not steps.empty else None
    if waited is not None and gpu_timed(run, probe):  # a step without a timed gap: its wait
        waited = pd.concat([waited, steps["gpu_gap_s"]], axis=1).min(axis=1)
    per_step = float(waited.mean()) if waited is not None else math.nan
    fraction = probe.data_wait_share
    if not finite(fraction):
        return None
    return float(fraction), per_step


def gpu_timed(run: Run, probe: ProbeRecord) -> bool:
    """Whether the probe's GPU gaps were timed (CUDA events): its data wait then counts as
    what the GPU lost to it, not as what the host waited."""
    return finite(probe.gpu.starved_fraction) or _gaps_timed(probe_steps(run, probe.id))


def _gaps_timed(steps: pd.DataFrame) -> bool:
    return not steps.empty and bool(steps["gpu_gap_s"].notna().any())


def is_data_bound(run: Run, probe: ProbeRecord, thresholds: Thresholds) -> bool:
    measured = data_wait(run, probe)
    return measured is not None and measured[0] >= thresholds.data_wait_fraction


# ---- samples, contexts, events -----------------------------------------------------------

def metric(run: Run, probe_id: str, source: str, name: str) -> Optional[pd.Series]:
    """The finite values of one telemetry metric in one probe, or None if never measured."""
    samples = run.samples
    if samples is None or samples.empty or "probe_id" not in samples or "source" not in samples:
        return None
    if name not in samples:
        return None
    rows = samples[(samples["probe_id"] == probe_id) & (samples["source"] == source)]
    values = pd.to_numeric(rows[name], errors="coerce").dropna()
    return None if values.empty else values


def metric_median(run: Run, probe_id: str, source: str, name: str) -> Optional[float]:
    values = metric(run, probe_id, source, name)
    return None if values is None else float(values.median())


def probe_context(run: Run, probe_id: str) -> dict[str, Any]:
    """The context record of the lowest rank of a probe ({} if none was written)."""
    ranks = sorted(rank for (pid, rank) in run.contexts if pid == probe_id)
    return run.contexts.get((probe_id, ranks[0]), {}) if ranks else {}


def loader_info(run: Run, probe_id: str) -> dict[str, Any]:
    """The training loader as the script built it (``context.loader``), or {}."""
    loader = probe_context(run, probe_id).get("loader")
    return loader if isinstance(loader, dict) else {}


def events_named(run: Run, name: str, probe_id: Optional[str] = None) -> pd.DataFrame:
    events = run.events
    if events is None or events.empty or "name" not in events:
        return pd.DataFrame(columns=["probe_id", "rank", "name", "data"])
    rows = events[events["name"] == name]
    return rows[rows["probe_id"] == probe_id] if probe_id is not None else rows


def local_ranks(run: Run, probe_id: str) -> int:
    """Ranks sharing one machine, as observed: the probe's ``ranks_per_host`` (decided by
    ``sweep.probe`` from the ranks' contexts), else the most contexts of the probe on one
    hostname; without either the summary's ``ranks_per_host`` or ``nproc_per_node``, else the
    world size."""
    entry = find_probe(run, probe_id)
    decided = entry.host.ranks_per_host if entry is not None else None
    if decided:
        return decided
    hosts = [ctx.get("hostname") for (pid, _), ctx in run.contexts.items()
             if pid == probe_id and ctx.get("hostname")]
    if hosts:
        return max(hosts.count(host) for host in set(hosts))
    nproc = as_int(run.summary.get("ranks_per_host")) or as_int(run.summary.get("nproc_per_node"))
    if nproc:
        return nproc
    return as_int(run.summary.get("world_size"), 1) or 1


def world_size(run: Run, probe_id: Optional[str] = None) -> int:
    size = as_int(run.summary.get("world_size"))
    if size:
        return size
    ctx = probe_context(run, probe_id) if probe_id else {}
    return as_int(ctx.get("world_size"), 1) or 1


def cpus_available(run: Run, probe_id: str) -> Optional[int]:
    """The CPUs a rank of the probe could use: the probe's ``cpus_available`` (the fewest of
    its ranks, ``sweep.probe``), else its context's (``profiler.cpus``), else ``cpu_count``."""
    ctx = probe_context(run, probe_id)
    env = run.summary.get("environment") or {}
    entry = find_probe(run, probe_id)
    for value in (entry.host.cpus_available if entry is not None else None,
                  ctx.get("cpus_available"),
                  ctx.get("cpu_count"), env.get("cpu_count")):
        if as_int(value):
            return as_int(value)
    return None



def global_steps(run: Run, probe_id: str) -> pd.DataFrame:
    """One row per measured step complete on every rank: step_s = slowest rank, samples = sum
    (``store.results.global_steps``)."""
    return store_global_steps(run.steps, probe_id)
