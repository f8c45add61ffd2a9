"""The recommendation's notes: what the choice does not decide but a reader should know.

``recommendation_notes(run, base, chosen, thresholds, share, seen)``: a compute-bound baseline, a
changed batch size, why the best configuration stays below the compute-only ceiling (from the
measured loading, the thread finding, or the host's CPU load), short probes, a comparison
across page-cache states, and the thread-oversubscription finding where it matters. Read by
``rules.recommend`` only; the loading in words is ``rules.loading``'s, the thread finding
(``rules.threads``) decides what the notes cite of it.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ddp_profile.profiler.decide.choose import candidate_of, compute_bound
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Thresholds, pct
from ddp_profile.rules.cpuload import cpu_load
from ddp_profile.rules.loading import (
    CPU_FIX,
    IO_FIX,
    capacity_of,
    cpu_cost,
    loading_bound,
    loading_evidence,
    predicted_workers,
)
from ddp_profile.rules.tables import cache_mismatch, cpus_available, data_wait, ok_probes
from ddp_profile.rules.threads import thread_oversubscription


def _faster_seen(seen: Sequence[Mapping[str, Any]]) -> str:
    """What was measured faster than the recommendation and not established, in a few words
    (the recommendation's ``unsettled``: ``evidence.seen``); empty where nothing was."""
    if not seen:
        return ""
    return (f"{len(seen)} setting(s) measured faster than it, up to "  # fastest first
            f"{float(seen[0]['ratio']):.2f}x the script's settings, not established (listed "
            "below)")


def _ceiling_notes(run: Run, chosen: ProbeRecord, share: float,
                   thresholds: Thresholds, seen: Sequence[Mapping[str, Any]] = ()
                   ) -> list[str]:
    """Why the best configuration stays below the compute-only ceiling, blaming loading only
    where its data wait explains the gap (without the wait it would reach the target)."""
    if share > 1.0:
        return [f"The recommended configuration ran at {pct(share)} of the compute-only "
                "ceiling: above 100 % only by measurement noise, so loading costs it nothing "
                "measurable (the loop is compute-bound)."]
    if share >= thresholds.ceiling_share_target:
        return []
    cpus = cpus_available(run, chosen.id)
    head = (f"The best measured configuration reaches only {pct(share)} of the compute-only "
            f"ceiling with {cpus or 'the'} CPUs available.")
    waited = data_wait(run, chosen)
    if waited is not None and waited[0] < 1 and \
            share / (1 - waited[0]) < thresholds.ceiling_share_target:
        return [f"{head} Its data wait ({pct(waited[0])} of each step) does not explain the "
                "gap: the steps themselves are slower than in the compute-only probe (on a "
                "shared host, loading and training compete for the CPUs and memory)."]
    if thread_oversubscription(run, thresholds) is not None:
        return [f"{head} The ranks' torch thread pools oversubscribe the CPUs, so loading "
                "that waits may be waiting for a CPU: see the thread-oversubscription finding "
                "before blaming storage."]
    capacity = capacity_of(run)
    if capacity is None:
        return _ceiling_notes_from_cpu_load(run, chosen, head, thresholds)
    return _ceiling_notes_from_capacity(run, chosen, head, capacity, thresholds, seen)


def _ceiling_notes_from_capacity(run: Run, chosen: ProbeRecord, head: str,
                                 capacity: dict[str, Any], thresholds: Thresholds,
                                 seen: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The data wait explains the gap: what would close it, from the measured loading (its
    bound decided by ``rules.loading.loading_bound``)."""
    bound = loading_bound(capacity, thresholds)
    mine = chosen.config.num_workers or 0
    seen = [item for item in seen if (item["config"].get("num_workers") or 0) != mine]
    evidence = f"The data wait explains the gap: {loading_evidence(capacity)}."
    more = capacity["workers_for_demand"]
    limit = capacity.get("cpu_limit")
    tried = max((p.config.num_workers or 0 for p in ok_probes(run)), default=0)
    if bound == "cpu" and (limit is None or limit >= capacity["demand"]):
        if tried >= more and seen:  # measured faster, not beyond noise: never "no faster"
            return [f"{head} {evidence} The CPUs could make enough samples; up to {tried} "
                    "worker(s) per rank were measured, faster than the recommendation but not "
                    "established (listed below)."]
        if tried >= more:  # the CPUs could make enough, and that many workers were measured
            return [f"{head} {evidence} The CPUs could make enough samples, but {tried} "
                    "worker(s) per rank measured no faster: the workers and the training "
                    "compete for the same CPUs."]
        return [f"{head} {evidence} What would close it: {predicted_workers(capacity)}."]
    if bound == "cpu":
        return [f"{head} {evidence} What would close it: {cpu_cost(chosen)[1]}."]
    if bound == "wait":
        if tried >= more > mine:
            ran = (", faster than the recommendation but not established (listed below)"
                   if seen else " and ran no faster than the recommendation")
            return [f"{head} {evidence} {tried} worker(s) per rank were measured{ran}; what "
                    f"would close it: {IO_FIX}."]
        if more > mine:
            return [f"{head} {evidence} What would close it: {predicted_workers(capacity)}; "
                    f"or, {IO_FIX}."]
        return [f"{head} {evidence} What would close it: {IO_FIX}."]
    return [f"{head} {evidence} What would close it: {CPU_FIX}; or, {IO_FIX}."]


def _ceiling_notes_from_cpu_load(run: Run, chosen: ProbeRecord, head: str,
                                 thresholds: Thresholds) -> list[str]:
    """Runs recorded without batch costs: the host's CPU load is all there is."""
    load = cpu_load(run, chosen)
    if load.saturated(thresholds):
        return [f"{head} The CPUs are saturated: what would close the gap is {CPU_FIX}."]
    if load.idle(thresholds):
        return [f"{head} The CPUs are not busy: what would close the gap is {IO_FIX}."]
    return [f"{head} What would close the gap: {CPU_FIX}; or, {IO_FIX}."]


def recommendation_notes(run: Run, base: ProbeRecord, chosen: ProbeRecord, thresholds: Thresholds,
                         share: Optional[float], seen: Sequence[Mapping[str, Any]] = ()
                         ) -> tuple[str, ...]:
    """The notes under the recommendation. ``seen``: what measured faster than it and was not
    established (``Recommendation.unsettled``), which no note may call "no faster"."""
    notes = []
    baseline = candidate_of(base)
    comm = base.comm.exposed_fraction
    if compute_bound(baseline, thresholds) and comm is not None \
            and comm >= thresholds.comm_exposed_share:
        notes.append(f"The baseline waits only {pct(baseline.data_wait_fraction)} of each step for "
                     f"data, and spends {pct(comm)} of it in gradient communication that "
                     "backward did not cover (see the exposed-communication finding).")
    elif compute_bound(baseline, thresholds):
        # "cannot help" only where the settings are kept: the wait a window shows is not all
        # a whole run pays, and a compute-bound script can still gain from more workers
        tail = ("yet the recommendation measured faster: its speedup is the alternation's, "
                "not a prediction from that wait" if chosen.id != base.id
                else f"and {_faster_seen(seen)}" if seen
                else "and DataLoader settings cannot speed it up much")
        notes.append(f"The baseline waits only {pct(baseline.data_wait_fraction)} of each step "
                     f"for data: it is compute-bound, {tail}.")
    old, new = base.config.batch_size, chosen.config.batch_size
    if old and new and old != new:
        notes.append(f"The batch size changes from {old} to {new}: scale the learning rate "
                     "with the global batch size and check convergence.")
    if share is not None:
        notes.extend(_ceiling_notes(run, chosen, share, thresholds, seen))
    notes.extend(_short_notes(base, chosen))
    mismatch = cache_mismatch(base, chosen, thresholds) if chosen.id != base.id else None
    if mismatch is not None:
        notes.append(f"Not like for like: {mismatch}; part of the speedup is the cache, not "
                     "the setting. Measure both in one cache state (run again: the data then "
                     "reads warm for both, if it fits in memory).")
    threads = thread_oversubscription(run, thresholds)  # the finding decides; the note cites it
    if threads is not None and threads.severity != "low":
        notes.append(f"Besides the DataLoader: {threads.recommendation} (see the "
                     "thread-oversubscription finding).")
    return tuple(notes)


def _short_notes(base: ProbeRecord, chosen: ProbeRecord) -> list[str]:
    """Say so when the recommendation rests on a probe that measured fewer steps than asked."""
    notes = []
    for role, probe in (("recommended", chosen), ("baseline", base)):
        if probe.short and not (role == "baseline" and probe.id == chosen.id):
            notes.append(f"The {role} probe {probe.id} is short, its figures rest on "
                         f"{probe.steps_measured or 0} step(s): "
                         f"{probe.short_reason or 'the script ended early'}.")
    return notes


