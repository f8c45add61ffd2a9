"""The threads counterfactuals of a sweep: ``measure(search)``, called by ``Search.run``.

Each is a probe of kind ``threads`` (``store.probes.Kind.THREADS``), never in the choice: a
configuration whose ranks oversubscribe the CPUs with torch's intra-op threads
(``cpus.threads_to_fit``) run with the threads that fit. It is measured beside the same
configuration with the script's own threads, alternated, so that a launch's level and the
machine's drift cancel: in windows of one launch (``A B A B A B A``; every rank switches its
threads at the window's first step, ``ProbePlan.window_threads``), then, where those leave
the gain open, in launches (``A B A B A`` and a pair more at a time while undecided,
``claim.launch_each``). A script that ends before the windows, a refused screen or
``--pairs 0``: one launch with the threads that fit (then, but for ``--pairs 0``, the
launches where it read a gain).
The finding reads the alternation's fit (``rules.threads``). ``search``: the
``sweep.search.Search`` that calls in (``sweep.state.SearchState``).
"""

from __future__ import annotations

from itertools import groupby
from typing import NamedTuple, Optional

from ddp_profile.profiler.cpus import threads_to_fit
from ddp_profile.profiler.decide.choose import ChoiceThresholds
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    alternation_open,
    alternations,
    letters,
    order,
    paired,
    room_for_noise,
)
from ddp_profile.profiler.decide.stopping import alternation_stop
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.sweep import claim
from ddp_profile.profiler.sweep.space import normalise
from ddp_profile.profiler.sweep.state import SearchState, Window, where_windows


class Subject(NamedTuple):
    """A measured configuration whose ranks oversubscribe the CPUs (``entry``): the settings
    a window asks to run it again (``config``: none for the script's own), those in full
    (``settings``), the intra-op threads per rank that fit and its predicted steps/s."""

    entry: ProbeRecord
    config: LoaderSettings
    settings: LoaderSettings
    fit: int
    rate: Optional[float]


def subjects(search: SearchState) -> list[Subject]:
    """The baseline, and the best configuration found where it differs (its workers can tip
    the CPUs over), each where its ranks oversubscribe the CPUs."""
    base, best = search.baseline, search.best()
    if base is None or not base.ok:
        return []
    measured = [(base, LoaderSettings(), None)]
    if best is not None and normalise(best.config) != normalise(base.config):
        config = normalise(best.config)
        measured.append((best, config, search.steps_per_s(config)))
    found = []
    for entry, config, rate in measured:
        fit = threads_to_fit(entry.host.intra_op_threads,
                             entry.host.ranks_per_host or search.nproc_per_node,
                             entry.host.worker_cores or 0.0, entry.host.cpus_available)
        if fit is not None:
            found.append(Subject(entry, config, normalise(entry.config), fit, rate))
    return found


def measure(search: SearchState) -> None:
    """Each subject (``subjects``) with the script's threads (A) and the threads that fit (B),
    in windows of one launch (``in_windows``) where a launch holds them: not ``--pairs 0``, no
    refused screen, no probe that the script's end cut short (the conditions of the claim's
    check in one launch). The subjects left: the threads that fit in a launch of their own,
    and where the largest gain read more than ``noise_floor``, the check in launches
    (``in_launches``)."""
    left = subjects(search)
    if left and search.options.pairs > 0 and not search.measurer.screen_unsupported \
            and not any(e.short for e in search.entries):
        left = in_windows(search, left)
    gains = []
    for subject in left:
        probe = search.measurer.measure(Window(subject.config, Kind.THREADS,
                                               threads=subject.fit, steps_per_s=subject.rate))
        if probe.ok and probe.throughput and subject.entry.throughput:
            gains.append((probe.throughput / subject.entry.throughput, subject))
    if gains and search.options.pairs > 0:
        gain, subject = max(gains, key=lambda item: item[0])
        if gain > 1 + ChoiceThresholds().noise_floor:
            in_launches(search, subject)


def in_windows(search: SearchState, found: list[Subject]) -> list[Subject]:
    """Each subject's settings with the script's threads (A) and with the threads that fit
    (B), ``A B A B A B A`` (``claim.WINDOW_PAIRS`` pairs, more where ``--pairs`` asks) in
    windows of one launch, the subjects at one batch size in the same launch (a screen keeps
    its batch size); those at another batch size than the script's are not checked where the
    script's own settings established the gain (``_not_checked``). Where the windows leave
    the largest gain open, having read one (``decide.paired.alternation_open``), that
    subject is alternated again a launch each (``in_launches``). The subjects whose windows
    did not all run (the screen was refused) are returned, for launches of their own."""
    roles = order(max(search.options.pairs, claim.WINDOW_PAIRS))
    left: list[Subject] = []
    fits: list[tuple[float, Subject, list[ProbeRecord], bool]] = []
    for _, sharing in groupby(found, key=lambda subject: subject.settings.batch_size):
        sharing = list(sharing)
        established = next((f for f in fits if f[3] and f[1].entry.id == search.baseline.id),
                           None)
        if established is not None:
            _not_checked(search, sharing, established)
            continue
        planned = [(subject, _windows(search, subject, roles, f"threads-"
                                      f"{len(search.entries) + len(roles) * place:03d}"))
                   for place, subject in enumerate(sharing)]
        for subject, windows in planned:
            search.progress("note", {"text": f"checking the threads: {subject.settings.label()} "
                                             f"with the script's threads (A) and {subject.fit} "
                                             f"thread(s) per rank (B) alternated, "
                                             f"{letters(roles)}, "
                                             f"{where_windows(search.measurer, windows)}"})
        entries = search.measurer.measure_screen([w for _, ws in planned for w in ws])
        for place, (subject, _) in enumerate(planned):
            mine = entries[place * len(roles):(place + 1) * len(roles)]
            fit = paired(search.entries, mine, claim.DEFAULTS.interval_confidence,
                         claim.DEFAULTS.launch_sd) if len(mine) == len(roles) else None
            if len(mine) < len(roles):
                left.append(subject)
            elif fit is not None:
                fits.append((fit.ratio, subject, mine, fit.faster))
    if fits:
        _, subject, entries, _ = max(fits, key=lambda item: item[0])
        if alternation_open(search.entries, entries, claim.DEFAULTS, gained=True):
            in_launches(search, subject, again=True)
    return left


def _not_checked(search: SearchState, subjects: list[Subject],
                 established: tuple[float, Subject, list[ProbeRecord], bool]) -> None:
    """Said where ``subjects`` (at another batch size than the script's) are not checked:
    the script's own settings established the gain in windows, so the finding stands, and
    their check would need a launch of its own, or several where the script ends first."""
    ratio, _, entries, _ = established
    for subject in subjects:
        search.progress("note", {"text": (
            f"the threads are not checked again with {subject.settings.label()}: the script's "
            f"own settings read {ratio:.2f}x with {subject.fit} thread(s) per rank, beyond "
            f"noise, in windows of one launch ({entries[0].id}-{entries[-1].id})")})


def _windows(search: SearchState, subject: Subject, roles: list[str], group: str
             ) -> list[Window]:
    """The alternation ``group`` of ``subject`` as windows of one launch, whole epochs where
    its workers restart (``claim.whole_epoch_steps``)."""
    steps = claim.whole_epoch_steps(search, [subject.settings])
    return [Window(subject.config, Kind.THREADS, steps=steps, steps_per_s=subject.rate,
                   threads=subject.fit if role == CANDIDATE else None,
                   pair={"role": role, "index": index, "group": group})
            for index, role in enumerate(roles)]


def in_launches(search: SearchState, subject: Subject, again: bool = False) -> None:
    """``subject``'s settings with the script's threads (A) and with the threads that fit
    (B), a launch each, ``A B A B A`` (``claim.launch_pairs``; one more pair at a time while
    undecided, up to ``claim.MAX_CLAIM_LAUNCHES``), whole epochs where its workers restart:
    one counterfactual probe against its subject, launches minutes apart, carries the
    machine's drift. ``again``: after windows of one launch that left its gain open."""
    group = f"threads-{len(search.entries):03d}"
    roles = order(claim.launch_pairs(search.options.pairs))
    if not room_for_noise(len(roles), 1):
        search.progress("note", {"text": f"the threads are not checked: {letters(roles)} "
                                         "leaves no room for its noise (--pairs 2 or more)"})
        return
    search.progress("note", {"text": (
        "the threads check's windows measured a gain they cannot tell from none: alternated "
        "again" if again else f"checking the threads: {subject.settings.label()} with the "
        f"script's threads (A) and {subject.fit} thread(s) per rank (B) alternated")
        + f", {letters(roles)}, a launch each"})
    steps = claim.whole_epoch_steps(search, [subject.settings])
    claim.launch_each(
        search, roles,
        lambda role, index: Window(subject.config, Kind.THREADS, steps=steps,
                                   steps_per_s=subject.rate,
                                   threads=subject.fit if role == CANDIDATE else None,
                                   pair={"role": role, "index": index, "group": group}),
        lambda allowed: alternation_stop(
            search.entries, alternations(search.entries, Kind.THREADS)[-1], claim.DEFAULTS,
            allowed),
        check="the threads check")
