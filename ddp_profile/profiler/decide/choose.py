"""The one author of "which measured configuration is best": ``choose(candidates, baseline)``.

Both the sweep (what to confirm, what to ``--repeat``, where to put the ceiling) and the rules
(the recommendation written to summary.json) build ``Candidate`` values from what they hold and
ask this module; nothing else decides. In short: the noise between two candidates comes from
their relative standard errors and, across launches, ``launch_sd`` (at least the spread this
run's launches showed); the reference is the candidate surest to be fast (highest lower bound);
candidates within noise of it tie, won by the cheapest setting (``cost_key``), and only a
measurement at most ``tie_rse`` uncertain claims a tie; another batch size, a compute-bound
baseline and a costlier pick each must win by more than the noise (and ``clear_gain`` for the
first two).

Each rule in full: docs/internals.md, "The choice (decide/choose)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence, TypeVar

from ddp_profile.profiler.numbers import finite
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import CHOICE_KINDS, Kind, ProbeRecord, is_measured

UNSTABLE_RSE = 0.05  # a probe whose throughput is this uncertain is measured again, longer
SHORT_RSE = 0.05  # the least relative error of a short probe's throughput (``widened``)


@dataclass(frozen=True)
class ChoiceThresholds:
    """The numbers the choice decides with (``rules.base.Thresholds`` extends this set)."""

    data_wait_fraction: float = 0.2  # data-bound at or above this share of step time
    noise_floor: float = 0.02  # throughputs within this relative gap are a tie at least
    noise_sigmas: float = 2.0  # ... or within this many combined standard errors
    clear_gain: float = 0.05  # a compute-bound script moves only for a gain above this
    tie_rse: float = 0.05  # a tie is claimed only by a measurement at most this uncertain
    launch_sd: float = 0.025  # relative SD between launches of one configuration (measured)
    interval_confidence: float = 0.95  # a claim's interval: a plain check lands inside 19 in 20
    comm_probe_share: float = 0.03  # DDP's timers show this share of a step exposed: the
    # sweep measures the step without gradient synchronisation
    comm_exposed_share: float = 0.10  # communication costs this share of a step (measured
    # without synchronisation, else by DDP's timers): larger batches and DDP options are
    # measured, and the exposed-communication rule fires
    cpu_bound_share: float = 0.7  # loading with this CPU share (cpu / (cpu + blocked
    # waiting) per sample) or more is CPU-bound: the climb stops, cpu-bound-preprocessing
    wait_bound_share: float = 0.3  # ... this or less is wait-bound; in between, mixed
    restart_share: float = 0.05  # worker start-up per epoch as a share of the run: the sweep
    # measures persistent_workers=True, the persistent-workers rule fires
    wait_tie_share: float = 0.05  # a tie without workers loses it to one with workers at its
    # batch size that waits this much less of each step, faster by half of it (``waits_more``)


@dataclass(frozen=True)
class Candidate:
    """One successful measurement of one configuration, as the choice sees it."""

    id: str
    config: LoaderSettings
    throughput: float  # global samples/s
    rse: float = 0.0  # relative standard error of ``throughput`` (0: unknown)
    data_wait_fraction: Optional[float] = None  # share of step time waiting for data costs
    # (``store.probes.data_wait_share``: on CUDA the GPU's idle time while its host waited)
    kind: Kind = Kind.SWEEP  # the choice reads baseline and sweep
    short: bool = False  # measured fewer steps than asked (the script ended first)
    launch: Optional[str] = None  # the launch that measured it (None: unknown)


def exposed_share(record: ProbeRecord, thresholds: ChoiceThresholds = ChoiceThresholds()
                  ) -> bool:
    """Whether DDP's timers show a probe's exposed communication (``comm_fraction``: the
    all-reduce backward did not cover, ``store.probe_comm``) at ``comm_probe_share`` of its steps
    or more: worth measuring the step without it."""
    share = record.comm.exposed_fraction
    return share is not None and share >= thresholds.comm_probe_share


def sync_share(synced: Candidate, unsynced: Candidate,
               thresholds: ChoiceThresholds = ChoiceThresholds()) -> float:
    """The share of a step that gradient synchronisation costs, measured: the same settings
    with (``synced``) and without it (``unsynced``: every forward as under ``no_sync()``);
    0 unless the unsynchronised run is faster beyond noise."""
    if not better(unsynced, synced, thresholds):
        return 0.0
    return 1.0 - synced.throughput / unsynced.throughput


def comm_bound(record: ProbeRecord, unsynced: Optional[ProbeRecord],
               twin: Optional[ProbeRecord] = None,
               thresholds: ChoiceThresholds = ChoiceThresholds()) -> bool:
    """Whether communication costs ``comm_exposed_share`` of a probe's steps or more: as
    measured against ``unsynced`` (its settings without gradient synchronisation) where that
    ran ok, the probe pooled with its ``twin`` (the same settings measured again beside the
    counterfactuals: one launch of a script can run at a level of its own); else as DDP's
    timers show it."""
    if unsynced is not None and is_measured(unsynced) and is_measured(record):
        reference = pool([candidate_of(r) for r in (record, twin)
                          if r is not None and is_measured(r)])
        return sync_share(reference, candidate_of(unsynced), thresholds) \
            >= thresholds.comm_exposed_share
    share = record.comm.exposed_fraction
    return share is not None and share >= thresholds.comm_exposed_share


def noise(a: Candidate, b: Candidate, thresholds: ChoiceThresholds = ChoiceThresholds()
          ) -> float:
    """Relative throughput gap below which ``a`` and ``b`` are a tie. Measured in two
    different launches, they also differ by how launches differ (``launch_sd``): each launch
    of a script runs at a level of its own, which no spread within one launch shows."""
    between = thresholds.launch_sd if a.launch is not None and b.launch is not None \
        and a.launch != b.launch else 0.0
    return max(thresholds.noise_floor,
               thresholds.noise_sigmas * math.sqrt(a.rse ** 2 + b.rse ** 2 + between ** 2))


def better(candidate: Candidate, incumbent: Candidate,
           thresholds: ChoiceThresholds = ChoiceThresholds()) -> bool:
    """Whether ``candidate`` is faster than ``incumbent`` beyond noise."""
    return candidate.throughput > incumbent.throughput * (1 + noise(candidate, incumbent,
                                                                    thresholds))


def not_worse(candidate: Candidate, incumbent: Candidate,
              thresholds: ChoiceThresholds = ChoiceThresholds()) -> bool:
    """Whether ``candidate`` is at least as fast as ``incumbent``, within noise."""
    return candidate.throughput >= incumbent.throughput * (1 - noise(candidate, incumbent,
                                                                     thresholds))


def cost_key(config: LoaderSettings, baseline_batch: Optional[int] = None) -> tuple:
    """Order of cheapness used to break ties: fewer workers, no pinning, less prefetch, and a
    batch size closest to the script's own."""
    batch_distance = abs((config.batch_size or 0) - (baseline_batch or config.batch_size or 0))
    return (config.num_workers or 0, bool(config.pin_memory), config.prefetch_factor or 0,
            batch_distance)


def compute_bound(baseline: Candidate, thresholds: ChoiceThresholds = ChoiceThresholds()
                  ) -> bool:
    """Whether the baseline hardly waits for data (its wait share was measured and is low)."""
    fraction = baseline.data_wait_fraction
    return fraction is not None and math.isfinite(fraction) \
        and fraction < thresholds.data_wait_fraction


def launch_spread(candidates: Sequence[Candidate]) -> float:
    """The relative SD between launches of one configuration that ``candidates`` show: each
    configuration measured in two or more launches (a screened window confirmed in the next
    screen, the baseline's settings measured again) gives the variance of its launches' log
    throughputs (the first measurement in each launch) less what their own standard errors
    explain; pooled over configurations by degrees of freedom. 0 without such a configuration.
    """
    groups: dict[LoaderSettings, dict[str, Candidate]] = {}
    for c in candidates:
        if c.launch is not None and not c.short and math.isfinite(c.throughput) \
                and c.throughput > 0:
            groups.setdefault(c.config, {}).setdefault(c.launch, c)
    total, dof = 0.0, 0
    for launches in groups.values():
        if len(launches) < 2:
            continue
        logs = [math.log(c.throughput) for c in launches.values()]
        mean = sum(logs) / len(logs)
        spread = sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)
        own = sum(c.rse ** 2 for c in launches.values()) / len(launches)
        total += max(0.0, spread - own) * (len(logs) - 1)
        dof += len(logs) - 1
    return math.sqrt(total / dof) if dof else 0.0


def with_launch_spread(thresholds: ChoiceThresholds, candidates: Sequence[Candidate]
                       ) -> ChoiceThresholds:
    """``thresholds`` with ``launch_sd`` raised to what this run's launches showed, if more."""
    spread = launch_spread(candidates)
    return replace(thresholds, launch_sd=spread) if spread > thresholds.launch_sd else thresholds


T = TypeVar("T", bound=ChoiceThresholds)


def run_thresholds(thresholds: T, records: Sequence[ProbeRecord]) -> T:
    """``thresholds`` with the spread between launches that ``records``' probes of the choice
    (finished, with a rate) showed, where larger than their own (``with_launch_spread``): what
    every verdict on a run speaks with, the sweep's while it measures (the step without
    gradient synchronisation, ``sweep.communication``) and the rules' after it alike."""
    return with_launch_spread(thresholds, [  # type: ignore[return-value]
        candidate_of(r) for r in records
        if r.ok and r.kind in CHOICE_KINDS and finite(r.throughput)])


def choose(candidates: Sequence[Candidate], baseline: Optional[Candidate] = None,
           thresholds: ChoiceThresholds = ChoiceThresholds()) -> Optional[Candidate]:
    """The best candidate (see the module docstring); ``baseline`` when nothing was measured.

    ``candidates`` are successful measurements of kind baseline or sweep (``baseline`` among
    them when it succeeded); ones without a positive, finite throughput are ignored, and short
    ones (fewer measured steps than asked) count with a wider error (``widened``). Launches
    are compared with the spread these candidates' own launches showed
    (``with_launch_spread``).
    """
    thresholds = with_launch_spread(thresholds, candidates)
    usable = most_certain([widened(c) for c in candidates
                           if math.isfinite(c.throughput) and c.throughput > 0])
    if not usable:
        return baseline
    top = reference(usable, thresholds)
    if baseline is not None and math.isfinite(baseline.throughput) and baseline.throughput > 0 \
            and compute_bound(baseline, thresholds):
        needed = max(noise(top, baseline, thresholds), thresholds.clear_gain)
        if top.throughput <= baseline.throughput * (1 + needed):
            return baseline
    ties = [c for c in undominated(usable, thresholds) if not_worse(c, top, thresholds)
            and (c is top or c.rse <= max(thresholds.tie_rse, top.rse))]
    ties = [c for c in ties if not waits_more(c, ties, thresholds)]  # never empty: see there
    batch = baseline.config.batch_size if baseline is not None else None
    pick = min(ties, key=lambda c: (cost_key(c.config, batch), -c.throughput))
    if _costlier_not_faster(pick, baseline, thresholds):
        return baseline
    if baseline is None or pick.config.batch_size == batch:
        return pick
    same = [c for c in usable if c.config.batch_size == batch]
    kept = choose(same, baseline, thresholds) if same else None
    if kept is not None and pick.throughput <= kept.throughput * (
            1 + max(noise(pick, kept, thresholds), thresholds.clear_gain)):
        return kept  # a batch size changes training: only for a clear gain
    return pick


def waits_more(candidate: Candidate, ties: Sequence[Candidate],
               thresholds: ChoiceThresholds = ChoiceThresholds()) -> bool:
    """Whether ``candidate`` makes its batches in the loop's own process (no workers) and
    another of the ``ties`` at its batch size, with workers, waited for its data
    ``wait_tie_share`` or more less of each step and measured faster by at least half of
    that share. The tie's noise is the throughputs' (launches apart, their levels differ);
    each probe's wait share is read within its own steps, where a launch's level cancels. A
    loop without workers waits while it makes each batch itself: work that workers take off
    it, and the other's rate bears that out, so the cheaper one does not win the tie by its
    cost. Where the wait went but the rate did not follow (workers slowing the loop's compute
    as much), it keeps the tie; between worker counts, whose waits follow their pools' bursts,
    the cost decides as before. (A strict order: some tie always keeps its place.)"""
    wait = candidate.data_wait_fraction
    if candidate.config.num_workers or wait is None or not math.isfinite(wait):
        return False
    for other in ties:
        removed = wait - (other.data_wait_fraction if other.data_wait_fraction is not None
                          else math.nan)
        if other.config.num_workers and other.config.batch_size == candidate.config.batch_size \
                and removed >= thresholds.wait_tie_share \
                and other.throughput >= candidate.throughput * (1 + removed / 2):
            return True
    return False


def widened(candidate: Candidate) -> Candidate:
    """A short measurement (the script ended before the probe's steps) as evidence with a
    wider interval: its relative error at least ``SHORT_RSE``. A 4-epoch script measured batch
    256 at 3.5x its own in a probe 3 steps short; set aside, the run kept batch 64."""
    return replace(candidate, rse=max(candidate.rse, SHORT_RSE)) if candidate.short \
        else candidate


def _costlier_not_faster(pick: Candidate, baseline: Optional[Candidate],
                         thresholds: ChoiceThresholds) -> bool:
    """Whether ``pick`` costs more than a measured ``baseline`` without beating it beyond
    noise (the module docstring's costlier-only-if-faster clause)."""
    if baseline is None or pick.id == baseline.id \
            or not (math.isfinite(baseline.throughput) and baseline.throughput > 0):
        return False
    batch = baseline.config.batch_size
    return cost_key(pick.config, batch) > cost_key(baseline.config, batch) \
        and not better(pick, baseline, thresholds)


def undominated(candidates: Sequence[Candidate],
                thresholds: ChoiceThresholds = ChoiceThresholds()) -> list[Candidate]:
    """The candidates that no other candidate beats beyond noise."""
    return [c for c in candidates if not any(better(d, c, thresholds) for d in candidates)]


def reference(candidates: Sequence[Candidate],
              thresholds: ChoiceThresholds = ChoiceThresholds()) -> Candidate:
    """Of the undominated candidates, the one surest to be fast: the highest
    ``throughput x (1 - noise_sigmas x rse)``."""
    front = undominated(candidates, thresholds) or list(candidates)
    return max(front, key=lambda c: (c.throughput * (1 - thresholds.noise_sigmas * c.rse),
                                     c.throughput))


def most_certain(candidates: Sequence[Candidate]) -> list[Candidate]:
    """One candidate per configuration, order kept. Of several measurements of one
    configuration (a screened window, its longer re-measurement, a confirming window), the
    most certain speaks for it (its id, kind, data wait), with their pooled figure: the
    inverse-variance mean of those with a known error, and a relative error that is at least
    their spread (standard deviation / mean / sqrt(n)). Two launches of one configuration that
    measured 1,117 and 514 samples/s (ranks oversubscribed with threads) are one uncertain
    figure, not the lucky one."""
    groups: dict[LoaderSettings, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(c.config, []).append(c)
    pooled = {config: pool(group) for config, group in groups.items()}
    return [pooled[c.config] for c in candidates if pooled[c.config].id == c.id]


def pool(group: list[Candidate]) -> Candidate:
    """Several measurements of one configuration as one (see ``most_certain``)."""
    best = min(group, key=_certainty)
    if len(group) == 1:
        return best
    known = [c for c in group if c.rse > 0 and c.throughput > 0]
    if known:
        weights = [1.0 / (c.rse * c.throughput) ** 2 for c in known]
        mean = sum(w * c.throughput for w, c in zip(weights, known)) / sum(weights)
        within = 1.0 / math.sqrt(sum(weights)) / mean
    else:
        mean, within = sum(c.throughput for c in group) / len(group), 0.0
    values = [c.throughput for c in group]
    average = sum(values) / len(values)
    spread = math.sqrt(sum((v - average) ** 2 for v in values) / (len(values) - 1))
    rse = max(within, spread / mean / math.sqrt(len(values))) if mean > 0 else within
    return replace(best, throughput=mean, rse=rse)


def _certainty(candidate: Candidate) -> float:
    return candidate.rse if candidate.rse > 0 else math.inf


def relative_se(record: ProbeRecord) -> float:
    """Relative standard error of a probe's throughput: by batch means when recorded, else
    from the per-step coefficient of variation."""
    if record.throughput_rse is not None:
        return record.throughput_rse
    cv = record.step_time_cv or 0.0
    return cv / math.sqrt(max(1, record.steps_measured or 1))


def candidate_of(record: ProbeRecord) -> Candidate:
    """A probe as a candidate."""
    return Candidate(id=record.id, config=record.config, throughput=record.throughput or 0.0,
                     rse=relative_se(record), data_wait_fraction=record.data_wait_share,
                     kind=record.kind, short=record.short, launch=record.launch)


def loading_free(candidates: Sequence[Candidate], config: LoaderSettings
                 ) -> Optional[Candidate]:
    """The fastest that ``config``'s batch size could run with any loader that pins memory as
    it does, read off what ran there: each measurement's rate with its wait for data taken
    out (``throughput / (1 - data_wait_fraction)``: a loader can at most stop the loop
    waiting; pinning can also speed the copy after it, so only the same pinning counts).
    The highest such rate, as a candidate of that measurement; None where none at that batch
    size and pinning has its wait measured."""
    bounds = [replace(c, throughput=c.throughput / (1.0 - c.data_wait_fraction))
              for c in candidates
              if c.config.batch_size == config.batch_size
              and bool(c.config.pin_memory) == bool(config.pin_memory)
              and c.data_wait_fraction is not None and math.isfinite(c.data_wait_fraction)
              and 0.0 <= c.data_wait_fraction < 1.0 and c.throughput > 0]
    return max(bounds, key=lambda c: c.throughput, default=None)
