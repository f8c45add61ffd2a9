"""The paired fit: a reference and candidates alternated close in time, and the verdict on it.

An alternation (``A B A B A``: windows of one launch, or launches) is read as ``log rate =
level + gain[candidate] + drift x position`` (``fit_alternation``): every candidate stands
between two references, so the launch's level and a linear drift cancel in the gain. The
claim's interval (``check_interval``) is for what a user's check measures: plain launches of
each side, ``CHECK_ROUNDS`` of each, alternating; so it holds the fit's uncertainty and the
spread between launches this run showed. Launches whose level did not follow a line are read
locally instead (``local=True``, where each side has enough of them: ``neighbours.local_fit``):
each candidate launch against the two references beside it, so that a level that wanders in
any shape cancels as well. Pure functions over probe records: the sweep reads them to decide
what to measure next, the rules to word the claim, the gate to compare a change with its
reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ddp_profile.profiler.decide.choose import ChoiceThresholds, candidate_of, launch_spread
from ddp_profile.profiler.decide.neighbours import local_fit
from ddp_profile.profiler.quantiles import t_quantile
from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probes import Kind, ProbeRecord

REFERENCE, CANDIDATE = "reference", "candidate"

def order(pairs: int) -> list[str]:
    """The alternation: every candidate between two references."""
    return [REFERENCE, CANDIDATE] * pairs + [REFERENCE]


def letters(roles: Sequence[str]) -> str:
    """``A B A B A``: an alternation's roles as the notes and the findings write them."""
    return " ".join("B" if role == CANDIDATE else "A" for role in roles)


def rounds(candidates: int, pairs: int) -> list[int]:
    """Several candidates against one reference: ``A B A C A`` per round (``pairs`` rounds),
    every candidate between two references; the candidate's index, or -1 for the reference."""
    sequence = [-1]
    for _ in range(pairs):
        for index in range(candidates):
            sequence += [index, -1]
    return sequence


def room_for_noise(measurements: int, candidates: int) -> bool:
    """Whether an alternation of ``measurements`` leaves a degree of freedom for its noise
    beside the level, the drift and a gain per candidate (``fit_alternation``)."""
    return measurements - 2 - candidates >= 1


@dataclass(frozen=True)
class AlternationFit:
    """``log rate = level + gain[candidate] + drift x position``, fitted by least squares to an
    alternation: each candidate's log speedup over the reference with its standard error,
    the drift per position, and how far one measurement sits from the fit. ``local``: the
    gains, errors, residual and degrees of freedom are each candidate's against its
    neighbouring references (``neighbours.local_fit``); the drift is still the line's."""

    gains: dict[str, float]
    errors: dict[str, float]
    drift: float
    residual_sd: float
    dof: int
    local: bool = False

    def ratio(self, key: str) -> float:
        return math.exp(self.gains[key])


LOCAL_VARIANCE_RATIO = 3.0  # the line's residual variance over the neighbours', above which
# launches are read locally (``benchmarks/alternations.py``: the choice reads the level's shape,
# not the gain; modelled, 9 launches: an equal pair read faster in 2.6-3.8 % of alternations
# against 1.1-2.6 % for the line alone, a gain of 8 % found in 43-57 % against 29-54 %)


def fit_alternation(rows: Sequence[tuple[Optional[str], float, float]], local: bool = False
                    ) -> Optional[AlternationFit]:
    """``rows``: (candidate key, None for the reference; position; rate) of every
    measurement of one alternation. None where a rate is not positive, a candidate or the
    reference is missing, or no degree of freedom is left for the noise (``A B A``: level,
    drift and gain fit it exactly). ``local``: launches, each at a level of its own, read
    against their neighbours where every candidate has enough of them (``local_fit``) and the
    line leaves ``LOCAL_VARIANCE_RATIO`` times the variance they show there: the level did
    not follow a line."""
    keys = sorted({key for key, _, _ in rows if key is not None})
    if not keys or all(key is not None for key, _, _ in rows) \
            or any(not rate > 0 or not math.isfinite(rate) for _, _, rate in rows):
        return None
    if not room_for_noise(len(rows), len(keys)):
        return None
    dof = len(rows) - 2 - len(keys)
    design = np.array([[1.0, float(position), *[1.0 if key == k else 0.0 for k in keys]]
                       for key, position, _ in rows])
    logs = np.log([float(rate) for _, _, rate in rows])
    coef, *_ = np.linalg.lstsq(design, logs, rcond=None)
    residual = logs - design @ coef
    variance = float(residual @ residual) / dof
    try:
        inverse = np.linalg.inv(design.T @ design)
    except np.linalg.LinAlgError:
        return None
    near = local_fit(rows) if local else None
    if near is not None and variance > LOCAL_VARIANCE_RATIO * near.sigma ** 2:
        return AlternationFit(gains=near.gains, errors=near.errors, drift=float(coef[1]),
                              residual_sd=near.sigma, dof=near.dof, local=True)
    return AlternationFit(
        gains={k: float(coef[2 + i]) for i, k in enumerate(keys)},
        errors={k: math.sqrt(variance * inverse[2 + i, 2 + i]) for i, k in enumerate(keys)},
        drift=float(coef[1]), residual_sd=math.sqrt(variance), dof=dof)


# ---- the claim's verdict ---------------------------------------------------------------------
MEASURING_KINDS = (Kind.BASELINE, Kind.SWEEP, Kind.REPEAT, Kind.PAIRED)  # the script's settings
# as they run it: their launches show the spread between launches
CHECK_ROUNDS = 3  # plain launches of each setting a user's check alternates


@dataclass(frozen=True)
class PairedClaim:
    """The speedup the alternation measured, and its interval."""

    ratio: float
    interval: tuple[float, float]
    probes: tuple[str, ...]  # in the order they ran
    candidates: int  # how many candidate windows or launches
    launches: int  # 1: windows of one launch
    roles: tuple[str, ...] = ()  # each probe's, REFERENCE or CANDIDATE, in ``probes``' order
    estimate: Optional[tuple[float, float]] = None  # the fit's own interval (``faster``)
    whole_runs: bool = False  # each launch ran the script to its end, read as a whole run
    timed: bool = False  # ... by the wall clock from its first batch to its end
    local: bool = False  # each candidate launch read against the references beside it

    @property
    def letters(self) -> str:
        """``A B A B A``: the alternation as it ran."""
        return letters(self.roles)

    def first(self, role: str) -> str:
        """The first probe of ``role``."""
        return self.probes[self.roles.index(role)]

    @property
    def faster(self) -> bool:
        """Faster beyond noise. Windows of one launch: the whole interval for a user's check
        above 1 (their residual holds no launch's level). Launches: the fit's own interval
        above 1, each launch at a level of its own already in its residual: whether the gain
        is real is its question; where a plain check of 3 launches each lands, the
        interval's (wider than the fit's own)."""
        return self.bounds[0] > 1.0

    @property
    def bounds(self) -> tuple[float, float]:
        """The interval ``faster`` reads: the fit's own for launches, else the check's."""
        return self.estimate if self.launches > 1 and self.estimate else self.interval

    def basis(self, recommendation: str = "the recommendation") -> str:
        where = "windows of one launch" if self.launches == 1 else f"{self.launches} launches"
        alone = ("each launch against the two of the other side beside it" if self.local
                 else "the fit of those launches alone")
        fit = (f"; {alone}: {self.estimate[0]:.2f}-{self.estimate[1]:.2f}x"
               if self.launches > 1 and self.estimate else "")
        whole = ""
        if self.whole_runs:
            whole = ("; each launch ran the script to its end and is read as a whole run, "
                     + ("by the wall clock from its first batch to its end (what a plain run "
                        "pays after its set-up: validation, checkpoints and the workers' "
                        "start-ups included)" if self.timed else
                        "its first batch's wait (the workers' start-up) charged"))
        return (f"the script's settings and {recommendation} alternated, "
                f"{self.candidates} of each between the other's, {where} "
                f"({self.probes[0]}-{self.probes[-1]}){fit}{whole}")


def settings_key(probe: ProbeRecord) -> tuple:
    """The four settings a probe ran, as a key."""
    return tuple(getattr(probe.config, key) for key in SETTING_KEYS)


def launches_spread(records: Sequence[ProbeRecord], settings: set[tuple], floor: float
                    ) -> float:
    """The relative SD between launches of the same settings (``settings``) that ``records``
    (a run's probes) show, at least ``floor``: every ok measurement of them, by launch."""
    measured = [candidate_of(p) for p in records
                if p.measured and p.kind in MEASURING_KINDS and settings_key(p) in settings]
    return max(floor, launch_spread(measured))


def as_run(probes: list[ProbeRecord]) -> list[Optional[float]]:
    """Each probe's rate as the script runs it: by the wall clock over the whole epochs its
    steps span, boundaries and all, where every probe of the alternation spanned one
    (``whole_epoch_steps``: nothing modelled); else the rates as measured."""
    whole = bool(probes) and all(p.epochs_throughput for p in probes)
    return [p.epochs_throughput if whole else p.throughput for p in probes]


def timed_runs(probes: list[ProbeRecord]) -> bool:
    """Whether every probe of the alternation ran the script to its end in a launch of its own
    and was timed over that whole run (``script_samples``, ``script_run_s``)."""
    return bool(probes) and len({p.launch for p in probes}) == len(probes) \
        and all(p.measured and p.script_samples and p.script_run_s for p in probes)


def whole_runs(probes: list[ProbeRecord]) -> Optional[list[float]]:
    """Each probe's rate over the script's whole run, where every probe of the alternation ran
    it to its end in a launch of its own: its samples over the seconds from its first batch
    asked for to the script's end (``timed_runs``): what a plain run pays after its set-up,
    validation passes, checkpoints, epoch boundaries and the workers' start-ups included
    (imagenet's ``main.py`` validates every epoch with the same ``-j`` workers, which the
    training steps alone do not show). Runs recorded before that was kept (``short``: the
    script ended first): its steps (the warm-up's too) at the rate measured, plus its first
    batch's wait, which a plain run pays once and no measured step holds. None otherwise."""
    if timed_runs(probes):
        return [float(p.script_samples or 0) / float(p.script_run_s or 1.0) for p in probes]
    if not probes or len({p.launch for p in probes}) < len(probes) \
            or not all(p.short and p.measured and p.time_to_first_batch_s is not None
                       and p.steps_measured and p.config.batch_size and p.ranks
                       for p in probes):
        return None
    rates = []
    for p in probes:
        samples = (p.steps_measured + (p.warmup or 0)) * p.config.batch_size * len(p.ranks)
        rates.append(samples / (samples / float(p.throughput or 0.0)
                                + float(p.time_to_first_batch_s or 0.0)))
    return rates


def fitted(probes: list[ProbeRecord], rates: list[Optional[float]], confidence: float,
            between: Any, whole: bool = False) -> Optional[PairedClaim]:
    """The candidate's gain over the reference in an alternation (``fit_alternation`` of
    ``rates``, one per probe, in order) with an interval for what a user's check measures: the
    fit's uncertainty and ``between(fit)``, the spread between launches, over
    ``CHECK_ROUNDS`` launches of each. None where a probe failed or the fit has no room."""
    if not probes or any(not p.measured or not math.isfinite(r or math.nan)
                         for p, r in zip(probes, rates)):
        return None
    roles = [p.pair.role if p.pair else None for p in probes]
    launches = len({p.launch for p in probes})
    fit = fit_alternation([(CANDIDATE if role == CANDIDATE else None,
                            float(p.pair.index if p.pair else 0), float(rate or 0.0))
                           for role, p, rate in zip(roles, probes, rates)], local=launches > 1)
    if fit is None:
        return None
    gain = fit.gains[CANDIDATE]
    return PairedClaim(ratio=math.exp(gain),
                       interval=check_interval(fit, CANDIDATE, between(fit), confidence),
                       probes=tuple(p.id for p in probes), candidates=roles.count(CANDIDATE),
                       launches=launches, roles=tuple(str(role) for role in roles),
                       estimate=check_interval(fit, CANDIDATE, 0.0, confidence),
                       whole_runs=whole, timed=whole and timed_runs(probes), local=fit.local)


def check_interval(fit: Any, key: Optional[str], between: float, confidence: float
                   ) -> tuple[float, float]:
    """The interval of ``key``'s ratio for what a user's check would measure: the fit's
    uncertainty and ``between``, the relative spread between launches, over ``CHECK_ROUNDS``
    launches of each side (0 for windows of one launch: a measurement no user launches)."""
    half = t_quantile(0.5 + confidence / 2, fit.dof) * math.sqrt(
        fit.errors[key] ** 2 + 2 * between ** 2 / CHECK_ROUNDS)
    gain = fit.gains[key]
    return math.exp(gain - half), math.exp(gain + half)


def paired(records: Sequence[ProbeRecord], probes: list[ProbeRecord], confidence: float,
           launch_sd: float) -> Optional[PairedClaim]:
    """The claim of the alternation ``probes`` (in order), its interval's spread between
    launches from every launch of its two settings among ``records``, at least
    ``launch_sd``; None where a probe failed or the fit has no room."""
    sides = {settings_key(p) for p in probes}
    whole = whole_runs(probes) if timed_runs(probes) else None
    return fitted(probes, whole or as_run(probes), confidence,
                  lambda fit: launches_spread(records, sides, launch_sd),
                  whole=whole is not None)


def read_rates(probes: list[ProbeRecord]) -> list[Optional[float]]:
    """The rate ``paired`` reads of each probe of an alternation: over the script's whole run
    where every launch timed it (``timed_runs``), else as run (``as_run``)."""
    whole = whole_runs(probes) if timed_runs(probes) else None
    return list(whole or as_run(probes))


def still_open(claim: Optional[PairedClaim], noise_floor: float) -> bool:
    """Whether an alternation in launches leaves its gain open: not faster beyond noise, yet
    its interval still holding a gain of more than ``noise_floor``. Such a check is extended
    one pair at a time (the claim's, the threads'): a few launches that happened to read the
    gain slower say nothing yet where the interval reaches that far (a check stopped there
    can miss a gain that more launches establish). One whose interval lies below that has
    lost, and nothing more is alternated."""
    return claim is not None and not claim.faster and claim.bounds[1] > 1 + noise_floor


def alternation_open(records: Sequence[ProbeRecord], probes: list[ProbeRecord],
                     thresholds: ChoiceThresholds, gained: bool = False,
                     asked: Optional[float] = None) -> bool:
    """``still_open`` for the alternation of ``probes`` among ``records``, fitted at the
    choice's interval confidence and launch spread: whether the claim's check or the threads
    check goes on one more pair. ``gained``: and it read a gain (a ratio above 1), where an
    open check in windows is to be followed by launches: a second look at two equal settings
    claims one falsely in 2.8 % of runs so, in 5.9 % without (``benchmarks/
    windows_then_launches.py``). ``asked``: the gain the verdict asks of it, where more than
    ``noise_floor`` (``decide.evidence.asked_gain``): an interval below that cannot move the
    script's settings, however many launches follow."""
    claim = paired(records, probes, thresholds.interval_confidence, thresholds.launch_sd)
    return still_open(claim, max(thresholds.noise_floor, asked or 0.0)) and (
        not gained or (claim is not None and claim.ratio > 1.0))


def alternations(records: Sequence[ProbeRecord], kind: Kind) -> list[list[ProbeRecord]]:
    """Every alternation of probes of ``kind`` among ``records`` (``ProbeRecord.pair``), in
    the order they ran, each in its own order."""
    groups: dict[str, list[ProbeRecord]] = {}
    for probe in records:
        if probe.kind == kind and probe.pair is not None:
            groups.setdefault(probe.pair.group, []).append(probe)
    return [sorted(g, key=lambda p: p.pair.index if p.pair else 0) for g in groups.values()]


@dataclass(frozen=True)
class OneTimeStart:
    """What the candidate of an alternation pays once per run and no probe measures: its first
    batch waited ``seconds`` longer than the reference's (workers starting where the reference
    starts none, or fewer). A claim of persistent workers is per epoch once they run; this is
    its price, won back after ``break_even_s`` of the reference's training at the claimed
    gain."""

    seconds: float
    reference_s: float  # the median first batch of each side
    candidate_s: float
    ratio: float

    @property
    def break_even_s(self) -> Optional[float]:
        saved = 1.0 - 1.0 / self.ratio  # of each second the reference trains
        return self.seconds / saved if saved > 0 else None

    def words(self) -> str:
        after = (f"won back after about {self.break_even_s:.0f} s of training at "
                 f"{self.ratio:.2f}x" if self.break_even_s is not None else "not won back")
        return (f"per epoch once the workers run: starting them costs {self.seconds:.1f} s "
                f"once per run (the first batch waited {self.candidate_s:.1f} s against "
                f"{self.reference_s:.1f} s), in no probe, {after}")


ONE_TIME_FLOOR_S = 0.2  # a difference of first batches below this goes unsaid


def one_time_start(records: Sequence[ProbeRecord], claim: PairedClaim
                   ) -> Optional[OneTimeStart]:
    """The candidate's one-time start-up beyond the reference's, from the first batches of
    the alternation's own launches (``claim.probes``); None in windows of one launch (a window
    starts no run) or below ``ONE_TIME_FLOOR_S``."""
    if claim.launches <= 1 or claim.whole_runs:  # windows start no run; whole runs paid it
        return None
    by_id = {p.id: p for p in records}
    waits: dict[str, list[float]] = {REFERENCE: [], CANDIDATE: []}
    for probe_id, role in zip(claim.probes, claim.roles):
        first = by_id[probe_id].time_to_first_batch_s if probe_id in by_id else None
        if first is not None and role in waits:
            waits[role].append(first)
    if not waits[REFERENCE] or not waits[CANDIDATE]:
        return None
    reference, candidate = (float(np.median(waits[r])) for r in (REFERENCE, CANDIDATE))
    if candidate - reference < ONE_TIME_FLOOR_S:
        return None
    return OneTimeStart(candidate - reference, reference, candidate, claim.ratio)
