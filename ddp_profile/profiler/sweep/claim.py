"""The claim, measured the way a user would check it: the script's own settings and the
recommendation, alternated close in time.

A speedup read off two probes measured minutes apart, in separate launches, carries the
machine's drift between them. So once the search has its best configuration (or an undecided
gain, ``decide.evidence.subject``), ``confirm`` measures it (``B``) and the script's settings
(``A``) again, alternately, ``A B A B A B A``: in one launch whose windows switch between them
where only loader settings differ; else (another batch size, a loader that cannot be rebuilt,
a script that ends before a probe's steps) in whole launches, ``A B A B A``, one more pair at
a time while the interval still holds a gain (up to ``MAX_CLAIM_LAUNCHES``). Every B stands
between two A's, so the launch's level and a linear drift cancel. The rules make the expected
speedup from these probes (``Kind.PAIRED``) alone; the verdict is ``decide.evidence``'s, read
by the rules and by the sweep (``recommended``: what ``--repeat`` measures).

``search``: the ``sweep.search.Search`` that calls in (``sweep.state.SearchState``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ddp_profile.profiler.decide import evidence
from ddp_profile.profiler.decide.choose import (
    ChoiceThresholds,
    candidate_of,
    compute_bound,
)
from ddp_profile.profiler.decide.evidence import Verdict
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    REFERENCE,
    alternation_open,
    letters,
    order,
    room_for_noise,
)
from ddp_profile.profiler.decide.stopping import (
    DECIDED,
    FAILED,
    ROUNDS,
    alternation_stop,
    persistence_stop,
)
from ddp_profile.profiler.decide.worker_restarts import kept_alive, whole_run_steps
from ddp_profile.profiler.settings import LoaderSettings, timed_warmup
from ddp_profile.profiler.store.epochs import restart_share
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, counts_for_choice
from ddp_profile.profiler.sweep.adaptive import VariantRides, in_one_launch, riding_variant
from ddp_profile.profiler.sweep.climb import condemned_by
from ddp_profile.profiler.sweep.space import normalise
from ddp_profile.profiler.sweep.state import SearchState, Window, where_windows

WINDOW_PAIRS = 3  # A B A B A B A in one launch
LAUNCH_PAIRS = 2  # A B A B A, a launch each
DEFAULTS = ChoiceThresholds()


def launch_pairs(pairs: int) -> int:
    """The B launches of a claim checked in launches: ``LAUNCH_PAIRS`` for the default three
    pairs (a launch costs more), one fewer above that (``--pairs 5``: A B A B A B A B A)."""
    return pairs if pairs <= LAUNCH_PAIRS else max(LAUNCH_PAIRS, pairs - 1)


def confirm(search: SearchState) -> None:
    """Alternate the script's settings and the subject of the check (the best configuration,
    or where the search kept the script's settings a gain it measured but could not tell from
    noise: ``decide.evidence.subject``; see the module docstring); then, where that
    established it, the configuration that measured faster still in the search
    (``decide.evidence.contender``: where the check runs in windows, in its launch, after it,
    as ``likely_contender`` names it). Where the search's windows that rode in the check's
    launch (``SearchState.carry``) moved its best, the new subject is checked too. Nothing
    where there is none, or ``--pairs 0``."""
    base = search.baseline
    if search.options.pairs <= 0 or base is None or not base.ok:
        return
    top = search.best()
    best = evidence.subject(search.entries, base, top)
    if best is not None and not in_one_launch(search, base, best) \
            and search.measurer.flush():  # the search's windows, read before the check
        top, best = search.best(), evidence.subject(search.entries, base, search.best())
    if best is None:
        return
    rode = _alternate(search, base, best, evidence.checked_words(search.entries, base, top, best),
                      rider=evidence.likely_contender(search.entries, base, best))
    top = search.best()  # the search's windows that rode in the check's launch may move it
    again = evidence.subject(search.entries, base, top)
    if again is not None and normalise(again.config) != normalise(best.config) \
            and not evidence.alternation(search.entries, base, again):
        rode = _alternate(search, base, again,
                          evidence.checked_words(search.entries, base, top, again))
    rival = evidence.contender(search.entries, base, top)
    sides = {REFERENCE: normalise(base.config), CANDIDATE: normalise((rival or base).config)}
    if rival is not None and not evidence.alternation(search.entries, base, rival):
        _alternate(search, base, rival, f"{sides[CANDIDATE].label()}, faster than the "
                                        "recommendation in the search but not beyond its noise,")
    elif rival is not None and rode == sides[CANDIDATE] \
            and undecided(search, rival, gained=True):  # its windows left it open
        _in_launches(search, rival, sides, whole_epoch_steps(search, sides.values()), {})


def _alternate(search: SearchState, base: ProbeRecord, best: ProbeRecord, what: str,
               rider: Optional[ProbeRecord] = None) -> Optional[LoaderSettings]:
    """``A B A B A``: the script's settings (A) and ``best`` (B), described as ``what``, in
    windows of one launch or a launch each (module docstring); ``rider`` alternated the same
    way after them in that launch, where it can switch there too (its configuration returned
    where it rode). In one launch, the windows the search carried (``SearchState.carry``:
    the second screen) run after the check's, and where there is no ``rider``, their variant
    of ``best`` rides, unless its window measures it no faster (``adaptive.VariantRides``)."""
    reference = normalise(base.config)
    candidate = normalise(best.config)
    if reference == candidate:
        return None
    configs = {REFERENCE: reference, CANDIDATE: candidate}
    ends = any(e.short for e in search.entries)  # windows of one launch would outrun it
    one_launch = in_one_launch(search, base, best)
    roles = order(search.options.pairs if one_launch else launch_pairs(search.options.pairs))
    sequence = letters(roles)
    where = "in one launch" if one_launch else "a launch each" + (
        " (the script ended before a probe's steps: one launch would not hold the windows)"
        if ends and reference.batch_size == candidate.batch_size else "")
    if not room_for_noise(len(roles), 1):
        search.progress("note", {"text": f"the claim is not checked: {sequence} leaves no room "
                                         "for its noise (--pairs 2 or more)"})
        return None
    steps = whole_epoch_steps(search, configs.values())
    group = f"claim-{len(search.entries):03d}"  # named by its first probe
    riding = normalise(rider.config) if rider is not None and one_launch else None
    carried = [w for w in search.take_carried() if normalise(w.config) != riding] \
        if one_launch else []  # a rider's own alternation measures it again in this launch
    windows = [*_windows(search, configs, roles, group, steps), *carried] if one_launch \
        else []
    rides = f"claim-{len(search.entries) + len(windows):03d}"
    judge = None
    if riding is None and carried:
        riding = riding_variant(carried, candidate)
        judge = VariantRides(rides, riding, candidate) if riding is not None else None
    if riding in (None, reference, candidate) or riding.batch_size != reference.batch_size:
        riding, also, judge = None, "", None
    else:  # its own alternation, in the same launch, after the check's
        sides = {REFERENCE: reference, CANDIDATE: riding}
        windows += _windows(search, sides, roles, rides,
                            whole_epoch_steps(search, sides.values()))
        also = (f"; then {riding.label()}, faster than it in the search, alternated with the "
                "script's settings the same way" if judge is None else
                f"; then {riding.label()}, alternated with the script's settings the same way "
                "where its window measures it faster than the recommendation's")
    if carried:
        also = f"; then the search's second screen ({len(carried)} window(s))" + also
    if windows:  # said as they will run: a script's run may end before its windows do
        where = where_windows(search.measurer, windows)
    whole = {role: whole_run_steps(search.entries, config.batch_size, search.options.steps,
                                   search.options.warmup, MAX_EPOCH_FACTOR)
             for role, config in configs.items()}
    if reference.batch_size == candidate.batch_size or not all(whole.values()):
        whole = {}  # both sides' whole runs, or neither's; at one batch size, their steps
    search.progress("note", {"text": "checking the claim: the script's settings (A) and "
                                     f"{what} (B) alternated, {sequence}, {where}"
                                     + (", each to the script's end (a launch of the search "
                                        "ran it to its end)" if whole else
                                        f", {steps} steps each (whole epochs)" if steps else "")
                                     + also})
    if one_launch:
        search.measurer.measure_screen(windows, judge)
        if not undecided(search, best, gained=True):
            return riding
    _in_launches(search, best, configs, steps, whole, again=one_launch)
    return riding


def _windows(search: SearchState, configs: dict[str, LoaderSettings], roles: list[str],
             group: str, steps: Optional[int]) -> list[Window]:
    """The alternation ``group`` of ``configs`` by role as windows of one launch."""
    return [Window(configs[role], Kind.PAIRED, steps=steps, steps_per_s=search.steps_per_s(
        configs[role]), pair={"role": role, "index": i, "group": group}) for i, role in
        enumerate(roles)]


def _in_launches(search: SearchState, best: ProbeRecord, configs: dict[str, LoaderSettings],
                 steps: Optional[int], whole: dict[str, int], again: bool = True) -> None:
    """``configs`` by role, a launch each (``launch_each``); ``again``: after windows of one
    launch that left ``best``'s gain open."""
    roles = order(launch_pairs(search.options.pairs))
    group = f"claim-{len(search.entries):03d}"
    if again:
        search.progress("note", {"text": "the check's windows measured a gain they cannot tell "
                                         f"from none: alternated again, {letters(roles)}, a "
                                         "launch each"})

    def window(role: str, index: int) -> Window:  # each side warmed up about as long (by time)
        rate = search.steps_per_s(configs[role])
        return Window(configs[role], Kind.PAIRED, steps=max(steps or 0, whole.get(role) or 0)
                      or None, steps_per_s=rate, warmup=timed_warmup(search.options.warmup, rate),
                      pair={"role": role, "index": index, "group": group})

    launch_each(search, roles, window, lambda allowed: claim_stop(search, best, allowed),
                check="the claim's check")


def launch_each(search: SearchState, roles: list[str], window: Callable[[str, int], Window],
                stop: Callable[[int], Optional[str]], check: str = "the check",
                early: Optional[Callable[[], Optional[str]]] = None) -> str:
    """Each of ``roles`` a launch of its own (``window(role, index)``), then a pair more, B A,
    up to ``MAX_CLAIM_LAUNCHES`` while ``stop(MAX_CLAIM_LAUNCHES)`` says go on (None;
    ``decide.stopping.alternation_stop``: decided, or futile); a failed launch ends it (a
    crash would only repeat itself). How it stopped (``decide.stopping``'s ``DECIDED``,
    ``FUTILE``, ``ROUNDS``, ``FAILED``) is recorded once (``SearchState.alternation_stopped``)
    and returned. ``early``: asked after each launch before the last of ``roles``, a stop
    there (``decide.stopping.persistence_stop``: no pair more)."""
    roles, index, group = list(roles), 0, ""
    while index < len(roles):
        placed = window(roles[index], index)
        group = str((placed.pair or {}).get("group") or group)
        if not search.measurer.measure(placed).ok:
            return _stopped(search, check, group, roles[:index + 1], FAILED)
        index += 1
        if index < len(roles):
            reason = early() if early is not None else None
            if reason is not None:
                return _stopped(search, check, group, roles[:index], reason)
            continue
        reason = stop(MAX_CLAIM_LAUNCHES)
        if reason is None and len(roles) < MAX_CLAIM_LAUNCHES:
            roles += [CANDIDATE, REFERENCE]
            search.progress("note", {"text": f"{check} measured a gain it cannot tell from "
                                             "none yet: one more pair of launches, B A"})
            continue
        return _stopped(search, check, group, roles, reason or ROUNDS)
    return ROUNDS


def _stopped(search: SearchState, check: str, group: str, roles: list[str], reason: str
             ) -> str:
    """Record how the alternation ``group`` ended (summary.json's ``search.alternations``)."""
    search.alternation_stopped({"group": group, "check": check, "letters": letters(roles),
                                "launches": len(roles), "stopped": reason})
    return reason


MAX_CLAIM_LAUNCHES = 9  # a claim checked in launches that stays undecided: A B A B A B A B A


def undecided(search: SearchState, subject: ProbeRecord, gained: bool = False) -> bool:
    """Whether the claim's alternation so far leaves ``subject`` open (``gained``: having
    read a gain; ``decide.paired.alternation_open``), against the gain the verdict asks of it
    (``decide.evidence.asked_gain``)."""
    base = search.baseline
    return alternation_open(search.entries, evidence.alternation(
        search.entries, base, subject), DEFAULTS, gained,
        evidence.asked_gain(base, subject, search.best(), DEFAULTS) if base else None)


def claim_stop(search: SearchState, subject: ProbeRecord, allowed: int) -> Optional[str]:
    """How the claim's alternation in launches of ``subject`` stops now, None to go on
    (``decide.stopping.alternation_stop``, against the gain the verdict asks of it)."""
    base = search.baseline
    if base is None:
        return DECIDED
    return alternation_stop(search.entries, evidence.alternation(search.entries, base, subject),
                            DEFAULTS, allowed,
                            evidence.asked_gain(base, subject, search.best(), DEFAULTS))


def verdict(search: SearchState, thresholds: ChoiceThresholds = DEFAULTS) -> Optional[Verdict]:
    """The evidence's verdict on the sweep so far (``decide.evidence.verdict``, the one the
    rules read); None before the baseline measured ok."""
    base = search.baseline
    if base is None or not base.ok:
        return None
    return evidence.verdict(search.entries, base, search.best(), thresholds)


def claim_holds(search: SearchState, thresholds: ChoiceThresholds = DEFAULTS) -> bool:
    """Whether the search's best stands as the recommendation (``verdict``)."""
    decided, best = verdict(search, thresholds), search.best()
    return decided is None or best is None or decided.pick.id == best.id


def recommended(search: SearchState, thresholds: ChoiceThresholds = DEFAULTS
                ) -> Optional[ProbeRecord]:
    """What the run recommends, as the sweep tells it (``verdict``: the search's best where
    it stands, an undecided gain the check established, else the script's own settings);
    what ``--repeat`` launches again, and the persistence check's reference."""
    decided = verdict(search, thresholds)
    return decided.pick if decided is not None else search.best()


# ---- whole epochs ---------------------------------------------------------------------------
MAX_EPOCH_FACTOR = 4  # epochs of more steps than this many probes' are not crossed
MIN_EPOCHS = 2  # whole epochs a claim's or a persistence probe spans, at least


def restarts(search: SearchState) -> bool:
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


def whole_epoch_steps(search: SearchState, configs: Any) -> Optional[int]:
    """The steps each probe of the claim measures where a side restarts its workers every
    epoch of a known length no longer than ``MAX_EPOCH_FACTOR`` runs' steps (every side then
    spans whole epochs, and ``rules.alternations`` reads each by the wall clock over them: the
    boundary as the script pays it, shut-down and start-up, nothing modelled); else None
    (the run's steps). A model of the restart reads high: the old workers' shut-down between
    two steps is in no step's parts."""
    steps = search.options.steps
    longest = 0
    for config in configs:
        if not config.num_workers or not restarts(search):
            continue
        epoch = epoch_steps(search, config)
        if epoch is None or epoch > MAX_EPOCH_FACTOR * steps:
            return None
        longest = max(longest, epoch)
    return spanning(longest, steps) if longest else None


def epoch_steps(search: SearchState, config: LoaderSettings) -> Optional[int]:
    """Steps in an epoch at ``config``'s batch size, as the last probe at it counted them;
    None where unknown (no probe can be sized to cross it)."""
    steps = [e.epochs.steps for e in search.entries if counts_for_choice(e)
             and e.epochs is not None and e.epochs.steps
             and e.config.batch_size == config.batch_size]
    return steps[-1] if steps else None


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


def persistence_subject(search: SearchState, thresholds: ChoiceThresholds = DEFAULTS
                        ) -> Optional[PersistenceSubject]:
    """The best configuration, where its workers start again every epoch of a known length
    at a cost of ``restart_share`` or more of the epoch (or its start segment spans it).
    Where the script's own settings are recommended and wait for data (not
    ``compute_bound``): the fastest restarting configuration at their batch size (costing
    ``restart_share`` or more) whose rate between restarts beats them by ``restart_share``
    or more, predicted to win kept alive; unless a launch ran the script to its end and over
    that length its start outweighs what it saves (``restarts.kept_alive``). Else None."""
    best, base = recommended(search, thresholds), search.baseline
    if best is None or base is None or search.options.pairs <= 0 \
            or not restarts(search):
        return None
    config = normalise(best.config)
    if config.num_workers:
        shares = [restart_share(e) for e in search.entries if counts_for_choice(e)
                  and normalise(e.config) == config]
        known = [s for s in shares if s is not None]
        if not known or max(known) >= thresholds.restart_share:
            epoch = epoch_steps(search, config)
            return PersistenceSubject(config, config, epoch) if epoch else None
    if best.id != base.id or not best.throughput \
            or compute_bound(candidate_of(base), thresholds):
        return None  # another best, or a script that hardly waits for data: nothing to win
    floor = (1 + thresholds.restart_share) * best.throughput
    rivals = [e for e in search.entries if counts_for_choice(e)
              and e.config.num_workers and e.config.batch_size == config.batch_size
              and (restart_share(e) or 0.0) >= thresholds.restart_share
              and steady_throughput(e) >= floor
              and not condemned_by(search.entries, e.config, base)]
    if not rivals:
        return None
    rival = max(rivals, key=steady_throughput)
    whole = kept_alive(search.entries, rival, base)
    if whole is not None and whole.loses:  # a run this short cannot win it back
        search.progress("note", {"text": f"persistent_workers=True is not measured: "
                                         f"{whole.words()}"})
        return None
    candidate = normalise(rival.config)
    epoch = epoch_steps(search, candidate)
    return PersistenceSubject(config, candidate, epoch) if epoch else None


def steady_throughput(record: ProbeRecord) -> float:
    """Its samples/s between restarts (0: no restart measured)."""
    return (record.epochs.steady_throughput or 0.0) if record.epochs is not None else 0.0


def confirm_persistence(search: SearchState) -> None:
    """``persistent_workers=True`` measured, not predicted: the best configuration as it is
    (``A``) and with it (``B``), ``A B A B A`` launch by launch, where its workers restart
    every epoch at a cost worth measuring; or the script's kept settings (``A``) and the
    restarting configuration predicted to beat them with it (``B``) (``persistence_subject``;
    ``store.epochs``); each probe spans whole epochs, at least two and the run's steps, and
    one step more; after ``A B A B``, it stops where no fifth launch could make them faster
    (``decide.stopping.persistence_stop``). The probes are ``Kind.PERSISTENT`` and count
    for nothing but the persistent-workers finding, the recommended snippet and, where the
    script's settings are ``A``, the recommendation (``rules.alternations.persistent_effect``).
    Epochs longer than ``MAX_EPOCH_FACTOR`` times the run's steps are not crossed: the
    finding stays a labelled prediction there."""
    found = persistence_subject(search)
    if found is None:
        return
    epoch = found.epoch
    if epoch > MAX_EPOCH_FACTOR * search.options.steps:
        search.progress("note", {"text": f"workers restart every epoch of {epoch} steps: too "
                                         "long to cross in a probe, persistent_workers=True "
                                         "is not measured"})
        return
    # two whole epochs at least (probes that each span one read far apart)
    steps = spanning(epoch, search.options.steps)
    roles = order(min(search.options.pairs, LAUNCH_PAIRS))
    if not room_for_noise(len(roles), 1):
        search.progress("note", {"text": "persistent_workers=True is not measured: A B A leaves "
                                         "no room for its noise (--pairs 2 or more)"})
        return
    sides = ("the best settings as they are (A) and with it (B)" if found.same else
             f"the script's settings (A) and {found.candidate.label()} with it (B)")
    search.progress("note", {"text": f"measuring persistent_workers=True: {sides}, alternated, "
                                     f"{letters(roles)}, {steps} steps each (epochs of {epoch})"})
    group = f"persistent-{len(search.entries):03d}"

    def so_far() -> list[ProbeRecord]:
        return [e for e in search.entries if e.pair is not None and e.pair.group == group]

    launch_each(search, roles, lambda role, index: Window(
        found.reference if role == REFERENCE else found.candidate, Kind.PERSISTENT,
        steps=steps, pair={"role": role, "index": index, "group": group},
        persistent_workers=True if role == CANDIDATE else None),
        lambda allowed: ROUNDS, check="the persistent-workers check",  # no pair more
        early=lambda: persistence_stop(so_far(), roles, DEFAULTS.interval_confidence))
