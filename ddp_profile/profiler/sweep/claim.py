"""The claim, measured the way a user would check it: the script's own settings and the
recommendation, alternated close in time.

A speedup read off two probes measured minutes apart, in separate launches, carries the
machine's drift between them (on a shared 2-core machine a batch size was claimed at 3.4x
where plain launches give 2.1x). So once the search has its best configuration, and it is not
the script's own, ``confirm`` measures the two again, alternately: the reference (``A``, the
script's settings) and the candidate (``B``), ``A B A B A B A``. Where the two differ in loader
settings only, that is one launch whose windows switch between them (each window starts its
own workers in its warm-up and continues the epoch, as a screen's do); where the batch size
differs (it cannot change mid-epoch without changing ``len(loader)``) or the loader cannot be
rebuilt, each is a launch of its own, ``A B A B A``. Every B stands between two A's, so the
launch's level and a linear drift cancel in the comparison; ``rules.recommend`` reads the
alternation (``pair``: role, position, group) and makes the expected speedup and its interval
from it alone. These probes (``Kind.PAIRED``) count for nothing else. The verdict on an
alternation (``paired``: the fit, the interval for a user's check, faster beyond noise) is
this module's, read by the rules and by the sweep itself (``claim_holds``: what the
persistent-workers alternation measures against).

``search``: the ``sweep.search.Search`` that calls in (not imported: no cycle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ddp_profile.profiler.quantiles import t_quantile
from ddp_profile.profiler.settings import SETTING_KEYS, LoaderSettings, timed_warmup
from ddp_profile.profiler.store.epochs import restart_share
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, Status, counts_for_choice
from ddp_profile.profiler.sweep.choose import (
    ChoiceThresholds,
    candidate_of,
    compute_bound,
    launch_spread,
)
from ddp_profile.profiler.sweep.measure import Window
from ddp_profile.profiler.sweep.space import normalise

REFERENCE, CANDIDATE = "reference", "candidate"
WINDOW_PAIRS = 3  # A B A B A B A in one launch
LAUNCH_PAIRS = 2  # A B A B A, a launch each
DEFAULTS = ChoiceThresholds()


def order(pairs: int) -> list[str]:
    """The alternation: every candidate between two references."""
    return [REFERENCE, CANDIDATE] * pairs + [REFERENCE]


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
    the drift per position, and how far one measurement sits from the fit."""

    gains: dict[str, float]
    errors: dict[str, float]
    drift: float
    residual_sd: float
    dof: int

    def ratio(self, key: str) -> float:
        return math.exp(self.gains[key])


def fit_alternation(rows: Sequence[tuple[Optional[str], float, float]]
                    ) -> Optional[AlternationFit]:
    """``rows``: (candidate key, None for the reference; position; rate) of every
    measurement of one alternation. None where a rate is not positive, a candidate or the
    reference is missing, or no degree of freedom is left for the noise (``A B A``: level,
    drift and gain fit it exactly)."""
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
    return AlternationFit(
        gains={k: float(coef[2 + i]) for i, k in enumerate(keys)},
        errors={k: math.sqrt(variance * inverse[2 + i, 2 + i]) for i, k in enumerate(keys)},
        drift=float(coef[1]), residual_sd=math.sqrt(variance), dof=dof)


def confirm(search: Any) -> None:
    """Alternate the script's settings and the best configuration (see the module docstring);
    nothing where the best is the script's own, nothing measured, or ``--pairs 0``."""
    base, best = search.baseline, search.best()
    if search.options.pairs <= 0 or base is None or best is None \
            or base.get("status") != Status.OK or best is base:
        return
    reference = normalise(LoaderSettings.from_dict(base.get("config")))
    candidate = normalise(LoaderSettings.from_dict(best.get("config")))
    if reference == candidate:
        return
    group = f"claim-{len(search.entries):03d}"
    configs = {REFERENCE: reference, CANDIDATE: candidate}
    in_one_launch = reference.batch_size == candidate.batch_size \
        and not search.measurer.screen_unsupported
    roles = order(search.options.pairs if in_one_launch else min(search.options.pairs,
                                                                    LAUNCH_PAIRS))
    letters = " ".join("A" if role == REFERENCE else "B" for role in roles)
    where = "in one launch" if in_one_launch else "a launch each"
    if not room_for_noise(len(roles), 1):
        search.progress("note", {"text": f"the claim is not checked: {letters} leaves no room "
                                         "for its noise (--pairs 2 or more)"})
        return
    steps = whole_epoch_steps(search, configs.values())
    search.progress("note", {"text": "checking the claim: the script's settings (A) and the "
                                     f"recommendation (B) alternated, {letters}, {where}"
                                     + (f", {steps} steps each (whole epochs)" if steps else "")})
    if in_one_launch:
        search.measurer.measure_screen([
            Window(configs[role], Kind.PAIRED, steps=steps, steps_per_s=search.steps_per_s(
                configs[role]), pair={"role": role, "index": index, "group": group})
            for index, role in enumerate(roles)])
        return
    for index, role in enumerate(roles):  # each side warmed up about as long (by time)
        rate = search.steps_per_s(configs[role])
        entry = search.measurer.measure(Window(
            configs[role], Kind.PAIRED, steps=steps, steps_per_s=rate,
            warmup=timed_warmup(search.options.warmup, rate),
            pair={"role": role, "index": index, "group": group}))
        if entry.get("status") != Status.OK:
            return  # a crash or an OOM would only repeat itself


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

    @property
    def letters(self) -> str:
        """``A B A B A``: the alternation as it ran."""
        return " ".join("B" if role == CANDIDATE else "A" for role in self.roles)

    def first(self, role: str) -> str:
        """The first probe of ``role``."""
        return self.probes[self.roles.index(role)]

    @property
    def faster(self) -> bool:
        """Faster beyond noise: the whole interval above 1."""
        return self.interval[0] > 1.0

    def basis(self, recommendation: str = "the recommendation") -> str:
        where = "windows of one launch" if self.launches == 1 else f"{self.launches} launches"
        return (f"the script's settings and {recommendation} alternated, "
                f"{self.candidates} of each between the other's, {where} "
                f"({self.probes[0]}-{self.probes[-1]})")


def settings_key(probe: Any) -> tuple:
    """The four settings of a probe record or a summary probe (their ``config``) or of a
    probes-table row."""
    config = probe.get("config")
    source = config if isinstance(config, dict) else probe
    return tuple(_plain(source.get(key)) for key in SETTING_KEYS)


def _plain(value: Any) -> Any:
    """A table's NaN is a summary's None; its numpy ints are ints."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


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


def fitted(probes: list[ProbeRecord], rates: list[Optional[float]], confidence: float,
            between: Any) -> Optional[PairedClaim]:
    """The candidate's gain over the reference in an alternation (``fit_alternation`` of
    ``rates``, one per probe, in order) with an interval for what a user's check measures: the
    fit's uncertainty and ``between(fit)``, the spread between launches, over
    ``CHECK_ROUNDS`` launches of each. None where a probe failed or the fit has no room."""
    if not probes or any(not p.measured or not math.isfinite(r or math.nan)
                         for p, r in zip(probes, rates)):
        return None
    roles = [p.pair.role if p.pair else None for p in probes]
    fit = fit_alternation([(CANDIDATE if role == CANDIDATE else None,
                            float(p.pair.index if p.pair else 0), float(rate or 0.0))
                           for role, p, rate in zip(roles, probes, rates)])
    if fit is None:
        return None
    gain = fit.gains[CANDIDATE]
    return PairedClaim(ratio=math.exp(gain),
                       interval=check_interval(fit, CANDIDATE, between(fit), confidence),
                       probes=tuple(p.id for p in probes), candidates=roles.count(CANDIDATE),
                       launches=len({p.launch for p in probes}),
                       roles=tuple(str(role) for role in roles))


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
    return fitted(probes, as_run(probes), confidence,
                  lambda fit: launches_spread(records, sides, launch_sd))


def claim_holds(search: Any, thresholds: ChoiceThresholds = DEFAULTS) -> bool:
    """Whether the search's best stands as the recommendation: it is the script's own
    settings, or the last claim's alternation (``confirm``) measured it faster beyond noise,
    or there is none to say otherwise (``--pairs 0``, a failed probe)."""
    best, base = search.best(), search.baseline
    if best is None or base is None or best.get("id") == base.get("id"):
        return True
    groups = alternations(search.entries, Kind.PAIRED)
    if not groups:
        return True
    claim = paired(search.entries, groups[-1], thresholds.interval_confidence,
                   thresholds.launch_sd)
    return claim is None or claim.faster


def recommended(search: Any, thresholds: ChoiceThresholds = DEFAULTS) -> Optional[ProbeRecord]:
    """What the run recommends, as the sweep tells it: the search's best where it stands
    (``claim_holds``), else the script's own settings (``rules.recommend`` reads the same
    verdict); what ``--repeat`` launches again, and the persistence check's reference."""
    return search.best() if claim_holds(search, thresholds) else search.baseline


def alternations(records: Sequence[ProbeRecord], kind: Kind) -> list[list[ProbeRecord]]:
    """Every alternation of probes of ``kind`` among ``records`` (``ProbeRecord.pair``), in
    the order they ran, each in its own order."""
    groups: dict[str, list[ProbeRecord]] = {}
    for probe in records:
        if probe.kind == kind and probe.pair is not None:
            groups.setdefault(probe.pair.group, []).append(probe)
    return [sorted(g, key=lambda p: p.pair.index if p.pair else 0) for g in groups.values()]


# ---- whole epochs ---------------------------------------------------------------------------
MAX_EPOCH_FACTOR = 4  # epochs of more steps than this many probes' are not crossed
MIN_EPOCHS = 2  # whole epochs a claim's or a persistence probe spans, at least


def restarts(search: Any) -> bool:
    """Whether the script's loader starts its workers again at every epoch: it neither keeps
    them (``persistent_workers``) nor keeps one iterator across epochs."""
    base = search.baseline
    return base is not None and not search.loader().get("persistent_workers") \
        and not search.measurer.context(base).get("keeps_iterator")


def spanning(epoch: int, steps: int) -> int:
    """Measured steps that span whole epochs of ``epoch`` steps, at least ``MIN_EPOCHS`` and
    ``steps``, and the step that starts the next: what ``store.epochs.whole_epochs`` reads
    (the wall clock from one epoch's start to another's)."""
    return epoch * max(MIN_EPOCHS, -(-steps // epoch)) + 1


def whole_epoch_steps(search: Any, configs: Any) -> Optional[int]:
    """The steps each probe of the claim measures where a side restarts its workers every
    epoch of a known length no longer than ``MAX_EPOCH_FACTOR`` runs' steps (every side then
    spans whole epochs, and ``rules.claim`` reads each by the wall clock over them: the
    boundary as the script pays it, shut-down and start-up, nothing modelled); else None
    (the run's steps). On cold files with 32-step epochs the restart model read 3 and 6
    workers at 1.35x, 1.36x and 1.48x the script's settings where plain launches gave 1.27x,
    1.19x and 1.23x: the old workers' shut-down between two steps is in no step's parts."""
    steps = search.options.steps
    longest = 0
    for config in configs:
        if not config.num_workers or not restarts(search):
            continue
        epoch = _epoch(search, config)
        if epoch is None or epoch > MAX_EPOCH_FACTOR * steps:
            return None
        longest = max(longest, epoch)
    return spanning(longest, steps) if longest else None


@dataclass(frozen=True)
class PersistenceSubject:
    """What ``confirm_persistence`` alternates: ``reference`` as it runs (``A``) and
    ``candidate`` with ``persistent_workers=True`` (``B``), every probe crossing epochs of
    ``epoch`` steps. The same settings on both sides, or, where the script's own settings are
    kept, those (``A``) and the restarting configuration predicted to beat them (``B``)."""

    reference: LoaderSettings
    candidate: LoaderSettings
    epoch: int

    @property
    def same(self) -> bool:
        return self.reference == self.candidate


def persistence_subject(search: Any, thresholds: ChoiceThresholds = DEFAULTS
                        ) -> Optional[PersistenceSubject]:
    """The best configuration, where its workers start again every epoch of a known length
    and that costs it ``restart_share`` or more of the epoch (or more than can be told apart
    from its steady steps: its start segment spans the epoch). Where the recommendation is the
    script's own settings (the best, or the claim's check kept them: ``claim_holds``), they
    pay no such restarts and they wait for data (not ``compute_bound``): the restarting
    configuration at their batch size (workers, costing ``restart_share`` or more) whose rate
    between restarts beats them by ``restart_share`` or more, the fastest such. Kept alive it
    is predicted to win, so it is measured against the script's settings rather than left a
    prediction. Else None."""
    best, base = recommended(search, thresholds), search.baseline
    if best is None or base is None or search.options.pairs <= 0 \
            or not restarts(search):
        return None
    config = normalise(LoaderSettings.from_dict(best.get("config")))
    if config.num_workers:
        shares = [restart_share(e) for e in search.entries if counts_for_choice(e)
                  and normalise(LoaderSettings.from_dict(e.get("config"))) == config]
        known = [s for s in shares if s is not None]
        if not known or max(known) >= thresholds.restart_share:
            epoch = _epoch(search, config)
            return PersistenceSubject(config, config, epoch) if epoch else None
    if best.get("id") != base.get("id") or not best.get("throughput") \
            or compute_bound(candidate_of(base), thresholds):
        return None  # another best, or a script that hardly waits for data: nothing to win
    floor = (1 + thresholds.restart_share) * float(best["throughput"])
    rivals = [e for e in search.entries if counts_for_choice(e)
              and LoaderSettings.from_dict(e.get("config")).num_workers
              and LoaderSettings.from_dict(e.get("config")).batch_size == config.batch_size
              and (restart_share(e) or 0.0) >= thresholds.restart_share
              and float(e.get("steady_throughput") or 0.0) >= floor]
    if not rivals:
        return None
    rival = max(rivals, key=lambda e: float(e["steady_throughput"]))
    candidate = normalise(LoaderSettings.from_dict(rival.get("config")))
    epoch = _epoch(search, candidate)
    return PersistenceSubject(config, candidate, epoch) if epoch else None


def _epoch(search: Any, config: LoaderSettings) -> Optional[int]:
    """Steps in an epoch at ``config``'s batch size, as the last probe at it counted them;
    None where unknown (no probe can be sized to cross it)."""
    same = [e for e in search.entries if counts_for_choice(e) and e.get("epoch_steps")
            and LoaderSettings.from_dict(e.get("config")).batch_size == config.batch_size]
    return int(same[-1]["epoch_steps"]) if same else None


def confirm_persistence(search: Any) -> None:
    """``persistent_workers=True`` measured, not predicted: the best configuration as it is
    (``A``) and with it (``B``), ``A B A B A`` launch by launch, where its workers restart
    every epoch at a cost worth measuring; or the script's kept settings (``A``) and the
    restarting configuration predicted to beat them with it (``B``) (``persistence_subject``;
    ``store.epochs``); each
    probe spans whole epochs, at least two and the run's steps, and one step more. The probes are
    ``Kind.PERSISTENT`` and count for nothing but the persistent-workers finding, the
    recommended snippet and, where the script's settings are ``A``, the recommendation
    (``rules.claim.persistent_effect``). Epochs longer than
    ``MAX_EPOCH_FACTOR`` times the run's steps are not crossed: the finding stays a labelled
    prediction there."""
    found = persistence_subject(search)
    if found is None:
        return
    epoch = found.epoch
    if epoch > MAX_EPOCH_FACTOR * search.options.steps:
        search.progress("note", {"text": f"workers restart every epoch of {epoch} steps: too "
                                         "long to cross in a probe, persistent_workers=True "
                                         "is not measured"})
        return
    # two whole epochs at least (a run whose probes each spanned one read 0.94-2.50x)
    steps = spanning(epoch, search.options.steps)
    roles = order(min(search.options.pairs, LAUNCH_PAIRS))
    if not room_for_noise(len(roles), 1):
        search.progress("note", {"text": "persistent_workers=True is not measured: A B A leaves "
                                         "no room for its noise (--pairs 2 or more)"})
        return
    sides = ("the best settings as they are (A) and with it (B)" if found.same else
             f"the script's settings (A) and {found.candidate.label()} with it (B)")
    search.progress("note", {"text": f"measuring persistent_workers=True: {sides}, alternated, "
                                     f"{' '.join('A' if r == REFERENCE else 'B' for r in roles)}"
                                     f", {steps} steps each (epochs of {epoch})"})
    group = f"persistent-{len(search.entries):03d}"
    for index, role in enumerate(roles):
        done = search.measurer.measure(Window(
            found.reference if role == REFERENCE else found.candidate, Kind.PERSISTENT,
            steps=steps,
            pair={"role": role, "index": index, "group": group},
            persistent_workers=True if role == CANDIDATE else None))
        if not done.ok:
            return  # a crash or an OOM would only repeat itself
