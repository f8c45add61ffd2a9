"""The recommended DataLoader configuration: the best measured probe, with its uncertainty.

``recommend(run, thresholds) -> Recommendation`` picks, among the ok probes of kind baseline
or sweep, the one with the highest global throughput. Probes within noise of the best are a
tie, won by the cheapest setting (fewer workers, pinning off, smaller prefetch, batch size
closest to the baseline's). Noise between two probes is ``max(noise_floor, noise_sigmas x
sqrt(se_a^2 + se_b^2))`` where ``se = cv / sqrt(n)`` is the relative standard error of a
probe's mean step time (cv of its global step times, n measured steps): the uncertainty of a
throughput, not the spread of single steps. A compute-bound baseline (data-wait fraction
below ``data_wait_fraction``) is kept unless another probe is faster by more than both the
noise and ``clear_gain``. The expected speedup's interval is a seeded bootstrap over the
global steps of both probes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import pandas as pd

from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import (Thresholds, as_int, baseline_probe, ceiling_probe,
                                    cpus_available, data_wait, finite, ok_probes, pct,
                                    probe_steps)
from ddp_profile.rules.data import (CPU_FIX, IO_FIX, capacity_of, cpu_load, loading_evidence,
                                    predicted_workers)

CONFIG_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "batch_size")


@dataclass(frozen=True)
class Recommendation:
    """The configuration to use and what it is expected to gain over the baseline probe."""

    config: dict[str, Any]  # num_workers, pin_memory, prefetch_factor, batch_size
    probe_id: Optional[str]  # the probe that measured it (None: nothing measured)
    expected_speedup: Optional[float]  # throughput / baseline throughput
    expected_speedup_interval: Optional[tuple[float, float]]
    snippet: str  # copy-paste DataLoader(...) call
    ceiling_share: Optional[float] = None  # throughput / compute-only ceiling throughput
    notes: tuple[str, ...] = ()
    throughput: Optional[float] = None  # global samples/s of the recommended probe
    baseline_probe_id: Optional[str] = None


def recommendation_to_dict(rec: Recommendation) -> dict[str, Any]:
    """Plain JSON-able data (tuples become lists)."""
    data = asdict(rec)
    data["expected_speedup_interval"] = (list(rec.expected_speedup_interval)
                                         if rec.expected_speedup_interval else None)
    data["notes"] = list(rec.notes)
    return data


def config_of(probe: pd.Series) -> dict[str, Any]:
    config = {}
    for key in CONFIG_KEYS:
        value = probe.get(key)
        if key == "pin_memory":
            config[key] = None if value is None else bool(value)
        else:
            config[key] = as_int(value)
    return config


def snippet_for(config: dict[str, Any]) -> str:
    """``DataLoader(dataset, ...)`` with the settings; no prefetch/persistence without workers."""
    parts = ["dataset"]
    if config.get("batch_size") is not None:
        parts.append(f"batch_size={config['batch_size']}")
    workers = config.get("num_workers") or 0
    parts.append(f"num_workers={workers}")
    if config.get("pin_memory") is not None:
        parts.append(f"pin_memory={bool(config['pin_memory'])}")
    if workers > 0:
        if config.get("prefetch_factor") is not None:
            parts.append(f"prefetch_factor={config['prefetch_factor']}")
        parts.append("persistent_workers=True")
    return f"DataLoader({', '.join(parts)})"


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
    for probe in run.summary.get("probes", []):
        if probe.get("id") == probe_id and finite(probe.get("throughput_rse")):
            return float(probe["throughput_rse"])
    times = global_steps(run, probe_id)["step_s"]
    if len(times) >= 2 and times.mean() > 0:
        return float(times.std(ddof=1) / times.mean() / math.sqrt(len(times)))
    for probe in run.summary.get("probes", []):
        if probe.get("id") == probe_id and finite(probe.get("step_time_cv")):
            steps = max(1, as_int(probe.get("steps_measured"), 1) or 1)
            return float(probe["step_time_cv"]) / math.sqrt(steps)
    return 0.0


def noise(run: Run, a: str, b: str, thresholds: Thresholds) -> float:
    """Relative throughput gap below which probes ``a`` and ``b`` are a tie."""
    combined = math.hypot(relative_error(run, a), relative_error(run, b))
    return max(thresholds.noise_floor, thresholds.noise_sigmas * combined)


def cost_key(probe: pd.Series, baseline_batch: Optional[int]) -> tuple:
    """Cheaper first: fewer workers, pinning off, smaller prefetch, batch near the baseline's."""
    batch = as_int(probe.get("batch_size"))
    distance = abs(batch - baseline_batch) if batch is not None and baseline_batch else 0
    return (as_int(probe.get("num_workers"), 0), bool(probe.get("pin_memory") or False),
            as_int(probe.get("prefetch_factor"), 0), distance)


def choose(run: Run, base: pd.Series, thresholds: Thresholds) -> pd.Series:
    """The recommended probe row (see the module docstring)."""
    probes = ok_probes(run)
    probes = probes[probes["throughput"].apply(finite) & (probes["throughput"] > 0)]
    if probes.empty or not finite(base.get("throughput")):
        return base
    best = probes.loc[probes["throughput"].idxmax()]
    waited = data_wait(run, base)
    if waited is not None and waited[0] < thresholds.data_wait_fraction:
        needed = max(noise(run, best["id"], base["id"], thresholds), thresholds.clear_gain)
        if best["throughput"] <= base["throughput"] * (1 + needed):
            return base
    tied = [row for _, row in probes.iterrows()
            if row["throughput"] >= best["throughput"]
            * (1 - noise(run, row["id"], best["id"], thresholds))]
    batch = as_int(base.get("batch_size"))
    return min(tied, key=lambda row: cost_key(row, batch))


def speedup_interval(run: Run, chosen: str, base: str, point: float,
                     thresholds: Thresholds) -> tuple[float, float]:
    """Bootstrap interval of throughput(chosen) / throughput(base), containing ``point``."""
    a, b = global_steps(run, chosen), global_steps(run, base)
    if len(a) < 2 or len(b) < 2:
        spread = thresholds.noise_sigmas * math.hypot(relative_error(run, chosen),
                                                      relative_error(run, base))
        return point * (1 - spread), point * (1 + spread)
    rng = np.random.default_rng(thresholds.bootstrap_seed)

    def resampled(table: pd.DataFrame) -> np.ndarray:
        index = rng.integers(0, len(table), size=(thresholds.bootstrap_resamples, len(table)))
        return (table["samples"].to_numpy()[index].sum(axis=1)
                / table["step_s"].to_numpy()[index].sum(axis=1))

    measured = (a["samples"].sum() / a["step_s"].sum()) / (b["samples"].sum() / b["step_s"].sum())
    ratios = resampled(a) / resampled(b) * (point / measured if measured > 0 else 1.0)
    tail = (1 - thresholds.interval_confidence) / 2
    lo, hi = np.quantile(ratios, [tail, 1 - tail])
    return min(float(lo), point), max(float(hi), point)


def _ceiling_notes(run: Run, chosen: pd.Series, share: float,
                   thresholds: Thresholds) -> list[str]:
    """Why the best configuration stays below the compute-only ceiling, blaming loading only
    where its data wait explains the gap (without the wait it would reach the target)."""
    if share >= thresholds.ceiling_share_target:
        return []
    cpus = cpus_available(run, chosen["id"])
    head = (f"The best measured configuration reaches only {pct(share)} of the compute-only "
            f"ceiling with {cpus or 'the'} CPUs available.")
    waited = data_wait(run, chosen)
    if waited is not None and waited[0] < 1 and \
            share / (1 - waited[0]) < thresholds.ceiling_share_target:
        return [f"{head} Its data wait ({pct(waited[0])} of each step) does not explain the "
                "gap: the steps themselves are slower than in the compute-only probe (on a "
                "shared host, loading and training compete for the CPUs and memory)."]
    capacity = capacity_of(run)
    if capacity is None:
        return _ceiling_notes_from_cpu_load(run, chosen, head, thresholds)
    evidence = f"Loading explains the gap: {loading_evidence(capacity)}."
    if capacity["bound"] == "cpu":
        return [f"{head} {evidence} What would close it: {CPU_FIX}."]
    more = capacity["workers_for_demand"]
    if capacity["bound"] == "wait":
        if more > (as_int(chosen.get("num_workers"), 0) or 0):
            return [f"{head} {evidence} What would close it: {predicted_workers(capacity)}; "
                    f"or, {IO_FIX}."]
        return [f"{head} {evidence} What would close it: {IO_FIX}."]
    return [f"{head} {evidence} What would close it: {CPU_FIX}; or, {IO_FIX}."]


def _ceiling_notes_from_cpu_load(run: Run, chosen: pd.Series, head: str,
                                 thresholds: Thresholds) -> list[str]:
    """Runs recorded without batch costs: the host's CPU load is all there is."""
    load = cpu_load(run, chosen)
    if load.saturated(thresholds):
        return [f"{head} The CPUs are saturated: what would close the gap is {CPU_FIX}."]
    if load.idle(thresholds):
        return [f"{head} The CPUs are not busy: what would close the gap is {IO_FIX}."]
    return [f"{head} What would close the gap: {CPU_FIX}; or, {IO_FIX}."]


def _notes(run: Run, base: pd.Series, chosen: pd.Series, thresholds: Thresholds,
           share: Optional[float]) -> tuple[str, ...]:
    notes = []
    waited = data_wait(run, base)
    if waited is not None and waited[0] < thresholds.data_wait_fraction:
        notes.append(f"The baseline waits only {pct(waited[0])} of each step for data: it is "
                     "compute-bound, and DataLoader settings cannot speed it up much.")
    old, new = as_int(base.get("batch_size")), as_int(chosen.get("batch_size"))
    if old and new and old != new:
        notes.append(f"The batch size changes from {old} to {new}: scale the learning rate "
                     "with the global batch size and check convergence.")
    if share is not None:
        notes.extend(_ceiling_notes(run, chosen, share, thresholds))
    return tuple(notes)


def recommend(run: Run, thresholds: Optional[Thresholds] = None) -> Recommendation:
    """The best measured configuration, or the script's own settings if none was measured."""
    thresholds = thresholds or Thresholds()
    base = baseline_probe(run)
    if base is None:
        config = {k: (run.summary.get("baseline") or {}).get(k) for k in CONFIG_KEYS}
        return Recommendation(config=config, probe_id=None, expected_speedup=None,
                              expected_speedup_interval=None, snippet=snippet_for(config),
                              notes=("No probe finished: nothing was measured to recommend.",))
    chosen = choose(run, base, thresholds)
    speedup, interval = None, None
    if finite(chosen["throughput"]) and finite(base["throughput"]) and base["throughput"] > 0:
        speedup = float(chosen["throughput"] / base["throughput"])
        interval = speedup_interval(run, chosen["id"], base["id"], speedup, thresholds)
    ceiling = ceiling_probe(run)
    share = None
    if ceiling is not None and ceiling["throughput"] > 0 and finite(chosen["throughput"]):
        share = float(chosen["throughput"] / ceiling["throughput"])
    config = config_of(chosen)
    return Recommendation(
        config=config, probe_id=str(chosen["id"]), expected_speedup=speedup,
        expected_speedup_interval=interval, snippet=snippet_for(config), ceiling_share=share,
        notes=_notes(run, base, chosen, thresholds, share),
        throughput=float(chosen["throughput"]) if finite(chosen["throughput"]) else None,
        baseline_probe_id=str(base["id"]))
