"""Small readers over a ``Run``'s tables, shared by the rules and the recommendation.

Each returns an empty table or None where the run lacks what it reads (no evidence, no
finding). Telemetry columns read from ``run.samples`` (NaN or absent when not measured):

``host`` samples  ``cpu_percent`` (whole machine, 0-100), ``worker_cpu_percent`` (the rank's
                  DataLoader workers together, 100 = one core), ``iowait_percent``
``gpu`` samples   ``gpu_util_percent``, ``gpu_mem_used_bytes``, ``gpu_mem_total_bytes``
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import pandas as pd

from ddp_profile.profiler.decide.choose import Candidate
from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings
from ddp_profile.profiler.store.probe_parts import Loading
from ddp_profile.profiler.store.probes import (
    CHOICE_KINDS,
    Kind,
    ProbeRecord,
    data_wait_share,
    ok_mask,
)
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Thresholds, as_int, finite, pct

# ---- probes ------------------------------------------------------------------------------

def ok_probes(run: Run, kinds: Iterable[str] = CHOICE_KINDS) -> pd.DataFrame:
    """The probes that finished with status ok, of the given kinds, in run order."""
    probes = run.probes
    if probes is None or probes.empty or "status" not in probes or "kind" not in probes:
        return pd.DataFrame(columns=getattr(probes, "columns", []))
    return probes[ok_mask(probes, kinds)]


def baseline_probe(run: Run) -> Optional[pd.Series]:
    """The ok probe of kind "baseline", else the first ok probe of any non-ceiling kind."""
    probes = ok_probes(run)
    if probes.empty:
        return None
    marked = probes[probes["kind"] == Kind.BASELINE]
    return (marked if not marked.empty else probes).iloc[0]


def probe_entry(run: Run, probe_id: Any) -> Optional[ProbeRecord]:
    """The record of a probe (``store.probes.ProbeRecord``: its summary.json item, typed;
    None if absent)."""
    try:
        return run.probe(str(probe_id))
    except KeyError:
        return None


def loading_of(run: Run, probe_id: Any) -> Optional[Loading]:
    """What producing a probe's samples cost (``store.probe_parts.Loading``); None where
    unmeasured."""
    entry = probe_entry(run, probe_id)
    return entry.loading if entry is not None else None


def storage_share(run: Run, probe_id: Any) -> Optional[float]:
    """The share of the bytes a probe's producers read that came from storage, not the page
    cache (``decide.capacity.LoadingCost.storage_share``); None where unknown."""
    loading = loading_of(run, probe_id)
    return loading.storage_share if loading is not None else None


def cache_mismatch(run: Run, base: pd.Series, other: pd.Series,
                   thresholds: Thresholds) -> Optional[str]:
    """Why ``other`` and ``base`` were not measured like for like (their producers read from
    storage shares ``cache_margin`` apart: one read warm, from the page cache), else None."""
    a, b = (storage_share(run, p["id"]) for p in (base, other))
    if a is None or b is None or abs(a - b) < thresholds.cache_margin:
        return None
    return (f"the baseline {base['id']} read {pct(a)} of its bytes from storage, probe "
            f"{other['id']} {pct(b)} (the rest from the page cache)")


def storage_caveat(run: Run, base: pd.Series, thresholds: Thresholds) -> str:
    """Where the baseline read its bytes from storage and the capacity model rests on probes
    that read them from the page cache, a sentence saying so ("" otherwise)."""
    own = storage_share(run, base["id"])
    others = [storage_share(run, p["id"]) for _, p in ok_probes(run).iterrows()
              if p["id"] != base["id"]]
    warm = [s for s in others if s is not None and own is not None
            and own - s >= thresholds.cache_margin]
    if not warm:
        return ""
    return (f" Not like for like: the baseline read {pct(own)} of its bytes from storage, "
            f"{len(warm)} later probe(s) at most {pct(max(warm))} (the page cache): in one "
            "cache state the loading may be bound otherwise.")


def is_short(probe: pd.Series) -> bool:
    """The probe measured fewer steps than asked (the script ended first)."""
    return probe.get("short") in (True,)


def ceiling_probe(run: Run) -> Optional[pd.Series]:
    """The compute-only ceiling the run kept (``summary.ceiling_probe``: none where each one
    ran below a rate measured with loading); in a run written before it was kept, the last
    ok ceiling probe (at the recommended batch size)."""
    probes = ok_probes(run, kinds=(Kind.CEILING,))
    probes = probes[probes["throughput"].apply(finite)] if not probes.empty else probes
    if "ceiling_probe" in run.summary:
        probes = probes[probes["id"] == run.summary["ceiling_probe"]]
    return None if probes.empty else probes.iloc[-1]


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


def data_wait(run: Run, probe: pd.Series) -> Optional[tuple[float, float]]:
    """(the share of each step that waiting for data costs, its mean seconds per step) of a
    probe; None if unmeasured.

    The share is the probe's own (``store.probes.data_wait_share``: on CUDA the GPU's idle
    time while its host waited, else the host's wait) when recorded, else the same from the
    measured steps of all ranks.
    """
    steps = probe_steps(run, probe["id"])
    recorded = finite(probe.get("gpu_starved_fraction"))
    on_gpu = recorded or _gaps_timed(steps)
    waited = steps["data_wait_s"] if not steps.empty else None
    if waited is not None and on_gpu:  # a step without a timed gap: its wait
        waited = pd.concat([waited, steps["gpu_gap_s"]], axis=1).min(axis=1)
    per_step = float(waited.mean()) if waited is not None else math.nan
    # the probe's own share; a CUDA run recorded before the GPU's share was: from its steps
    fraction = data_wait_share(probe.get("gpu_starved_fraction"), probe.get("data_wait_fraction")) \
        if recorded or not on_gpu else None
    if fraction is None and waited is not None and steps["step_s"].sum() > 0:
        fraction = waited.sum() / steps["step_s"].sum()
    if not finite(fraction):
        return None
    return float(fraction), per_step


def gpu_timed(run: Run, probe: pd.Series) -> bool:
    """Whether the probe's GPU gaps were timed (CUDA events): its data wait then counts as
    what the GPU lost to it, not as what the host waited."""
    return finite(probe.get("gpu_starved_fraction")) or _gaps_timed(probe_steps(run, probe["id"]))


def _gaps_timed(steps: pd.DataFrame) -> bool:
    return not steps.empty and bool(steps["gpu_gap_s"].notna().any())


def is_data_bound(run: Run, probe: pd.Series, thresholds: Thresholds) -> bool:
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
    entry = probe_entry(run, probe_id)
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
    entry = probe_entry(run, probe_id)
    for value in (entry.host.cpus_available if entry is not None else None,
                  ctx.get("cpus_available"),
                  ctx.get("cpu_count"), env.get("cpu_count")):
        if as_int(value):
            return as_int(value)
    return None



# ---- probes as the one chooser sees them --------------------------------------------------

def config_of(probe: pd.Series) -> dict[str, Any]:
    config = {}
    for key in SETTING_KEYS:
        value = probe.get(key)
        if key == "pin_memory":
            config[key] = None if value is None else bool(value)
        else:
            config[key] = as_int(value)
    return config


def global_steps(run: Run, probe_id: str) -> pd.DataFrame:
    """One row per measured step complete on every rank: step_s = slowest rank, samples = sum."""
    steps = probe_steps(run, probe_id)
    if steps.empty:
        return pd.DataFrame(columns=["step_s", "samples"])
    if "samples" not in steps:
        steps = steps.assign(samples=0)
    ranks = steps["rank"].nunique()
    grouped = steps.groupby("step").agg(step_s=("step_s", "max"), samples=("samples", "sum"),
                                        ranks=("rank", "nunique"))
    grouped = grouped[(grouped["ranks"] == ranks) & (grouped["step_s"] > 0)]
    return grouped[["step_s", "samples"]]


def relative_error(run: Run, probe_id: str) -> float:
    """Relative standard error of a probe's throughput (0 if unknown): the probe's own
    batch-means estimate when recorded, else from its per-step times."""
    probe = probe_entry(run, probe_id)
    if probe is not None and finite(probe.throughput_rse):
        return float(probe.throughput_rse)
    times = global_steps(run, probe_id)["step_s"]
    if len(times) >= 2 and times.mean() > 0:
        return float(times.std(ddof=1) / times.mean() / math.sqrt(len(times)))
    if probe is not None and finite(probe.step_time_cv):
        steps = max(1, probe.steps_measured or 1)
        return float(probe.step_time_cv) / math.sqrt(steps)
    return 0.0


def candidate(run: Run, probe: pd.Series) -> Candidate:
    """A probe row as the one chooser (``profiler.decide.choose``) sees it, completed from
    the run's tables where a run recorded before a field was kept lacks it (the standard
    error from the per-step times, ``relative_error``; the data-wait share from the steps,
    ``data_wait``)."""
    waited = data_wait(run, probe)
    return Candidate(id=str(probe["id"]), config=LoaderSettings.from_dict(config_of(probe)),
                     throughput=float(probe["throughput"] or 0.0),
                     rse=relative_error(run, probe["id"]),
                     data_wait_fraction=waited[0] if waited is not None else None,
                     kind=Kind(probe.get("kind") or Kind.SWEEP), short=is_short(probe),
                     launch=launch_of(probe))


def launch_of(probe: pd.Series) -> str:
    """The launch that measured a probe: its screen's, else its own."""
    launch = probe.get("launch")
    return launch if isinstance(launch, str) and launch else str(probe["id"])
