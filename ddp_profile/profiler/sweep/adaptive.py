"""The adaptive search: two screens, then the batch sizes (``run``), over a ``Search``.

The first screen runs the worker ladder (and the ceiling) in one launch, and the climb's first
rungs past it where that launch holds them; the climb goes on while the loop still gains; the
second screen confirms the best screened configuration in a fresh launch and tries its
prefetch and pinning variants there: the claim's check's launch, ahead of its windows, where
that runs in windows of one launch. The climb stops on evidence: at a screen whose every
worker count ran slower than the script's own settings, at a rung slower than them, at a rung
that did not rise (``climb.Climb``), and past a rung that outlasted a launch's timeout.
``search``: the ``sweep.search.Search`` that calls in (``sweep.state.SearchState``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ddp_profile.profiler.decide import evidence
from ddp_profile.profiler.decide.capacity import DEFAULT_THRESHOLDS, WORKER_CAP
from ddp_profile.profiler.decide.choose import (
    UNSTABLE_RSE,
    better,
    candidate_of,
    compute_bound,
    loading_free,
    relative_se,
)
from ddp_profile.profiler.settings import LoaderSettings, Mode
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, Status, is_measured
from ddp_profile.profiler.sweep import ceiling
from ddp_profile.profiler.sweep.climb import (
    CLIMB_STOP_CPU_SHARE,
    Climb,
    Ladder,
    LadderStop,
    adding,
    beats,
    climb_points,
    climb_workers,
    next_workers,
    slower_than_baseline,
    waits_for_data,
    worth_screening,
    worth_tuning,
)
from ddp_profile.profiler.sweep.space import normalise
from ddp_profile.profiler.sweep.state import SearchState, Window

MAX_CLIMB_RUNGS = 3  # worker counts the climb may add past the first screen's ladder


def run(search: SearchState) -> None:
    """Two screens, then the batch sizes. The first screen runs the whole worker ladder
    (and the ceiling, then the climb's first rungs: ``climb_rungs``) in one launch; the
    second confirms the best screened configuration in a fresh launch and, in the same
    launch, tries its prefetch and pinning variants (carried into the claim's check's launch
    where it can ride there: ``rides_with_the_check``).
    A baseline whose loading could win back little of its steps, and whose whole run pays
    little beyond them (``climb.worth_screening``), gets no ladder, only its pinning variants.
    Batch sizes need launches of their own. A loader that cannot be rebuilt (known from the
    baseline for an IterableDataset: its stream cannot continue in a new iterator) falls
    back to climbing the first screen's ladder with one probe per configuration."""
    assert search.axes is not None and search.baseline is not None
    own = search.baseline.config
    start = LoaderSettings(None, own.pin_memory if own.pin_memory is not None else False,
                           min(search.axes.prefetch_factor), own.batch_size)
    ladder = list(search.axes.num_workers)
    screening = worth_screening(search.baseline)
    if screening:
        ladder = first_workers(search)
        configs = [normalise(replace(start, num_workers=w)) for w in ladder]
    else:  # loading settings cannot win back more than the little time spent waiting
        configs = [normalise(replace(own, pin_memory=v)) for v in search.axes.pin_memory]
    windows = [search.window(c) for c in configs if search.find(c) is None]
    if search.wants_ceiling():
        windows.append(search.window(windows[-1].config if windows else normalise(own),
                                     Kind.CEILING, Mode.CEILING))
    # first: a screen's windows run in order, and those left are dropped once condemned
    windows = [*search.riding_windows(windows), *windows]
    if search.loader().get("iterable"):  # known from the baseline: no launch wasted on it
        search.no_screens("its IterableDataset's stream cannot continue in a new iterator "
                          "mid-epoch")
    rungs = climb_rungs(search, start, max(ladder, default=0), windows) if screening else []
    judge = Climb(search.baseline, start, rungs, climb_limit(search))
    screened = search.measurer.measure_screen(
        [*windows, *(search.window(normalise(replace(start, num_workers=w))) for w in rungs)],
        judge)
    if judge.stop is not None:
        search.ladder_stopped(judge.stop)
    ceiling.vet(search)
    if search.measurer.screen_unsupported:
        search.progress("note", {"text": "the DataLoader cannot be rebuilt in place "
                                         f"({search.measurer.screen_unsupported}): one probe "
                                         "each"})
        best = climb_workers(search.measure_config, search.baseline, start, ladder)
        for axis in ("prefetch_factor", "pin_memory"):
            best = try_axis(search, best, axis) if best is not None else None
    else:
        if worth_tuning(search.baseline) and search.space.num_workers is None \
                and not all_slower(search, screened):
            climb(search, start, MAX_CLIMB_RUNGS - len(rungs))
        best = search.best()
        if best is not None and rides_with_the_check(search, best):
            # measured in the check's launch, whose windows measure the best again
            search.carry(second_screen(search, best, again=False))
        elif best is not None:
            search.measurer.measure_screen(second_screen(search, best))
            best = search.best()
    if best is not None:
        batched = try_axis(search, best, "batch_size")
        if search.space.batch_size is None and compute_bound(candidate_of(search.baseline)):
            # loading settings cannot speed up a loop that hardly waits for its data: of the
            # sweep's axes, the per-rank batch is the one left (a change to the training, which
            # the choice's batch clause and the notes weigh and say)
            batched = measure_larger_batches(search, batched)
            leader = undecided_leader(search, batched)
            if leader is not None:
                measure_larger_batches(search, leader)
        if batched.config.batch_size != best.config.batch_size:
            rescreen(search, batched)


def undecided_leader(search: SearchState, best: ProbeRecord) -> Optional[ProbeRecord]:
    """Where the search kept the script's settings (``best`` is them) but another worker
    count at their batch measured faster, not beyond noise (``decide.evidence.subject``):
    that one, whose larger batches are worth a launch too. The claim checks the undecided
    gain by alternation; without its larger batches, a gain that stacks on it goes unseen
    (larger batches measured with the script's own workers only, where loading bounds them)."""
    base = search.baseline
    assert base is not None
    leader = evidence.subject(search.entries, base, best)  # the one the check will alternate
    if leader is None or leader.id == best.id \
            or leader.config.batch_size != base.config.batch_size:
        return None
    return leader


def first_workers(search: SearchState) -> list[int]:
    """The worker counts of the first screen: the ones the user gave (always measured),
    else the ladder up to the CPUs and the count the capacity model predicts meets the
    loop's demand (past the CPU count when loading mostly waits; then half and twice that
    too, in the same launch)."""
    assert search.axes is not None
    workers = set(search.axes.num_workers)
    model = search.capacity() if search.space.num_workers is None else None
    if model is not None:
        predicted = model.workers_for_demand()
        workers.add(predicted)
        if model.cpu_share < CLIMB_STOP_CPU_SHARE and predicted < model.max_workers:
            # a waiting loader's first climb step rides in the same launch, and so does
            # half the prediction, which rests on the compute-only demand (too many
            # latency-bound workers on few CPUs run slower than half as many)
            workers.add(min(2 * predicted, model.max_workers))
            if predicted // 2 > max(workers - {predicted, 2 * predicted}, default=0):
                workers.add(predicted // 2)
        search.progress("loading", {"capacity": model.to_dict(), "predicted": predicted})
        recalibrate(search, max(workers))
    return sorted(workers)


def climb_limit(search: SearchState) -> int:
    """The most workers per rank the climb may reach (the capacity model's bound)."""
    model = search.capacity()
    return model.max_workers if model is not None else WORKER_CAP


def climb_rungs(search: SearchState, start: LoaderSettings, top: int,
                windows: list[Window]) -> list[int]:
    """The climb's first rungs past the ladder's ``top``, doubling (``next_workers``' steps,
    up to ``MAX_CLIMB_RUNGS`` and the limit), as windows of the first screen's launch after
    ``windows``: where the climb would follow (the workers are not given, loading mostly
    waits: the capacity model's prediction rests on the compute-only demand) and one launch
    holds them all (``epoch_holds``). Each is measured only while the rungs below it still
    rise (``climb.Climb``): a launch of its own each saved, not a rung more."""
    model = search.capacity()
    if model is None or search.space.num_workers is not None or not top \
            or not worth_tuning(search.baseline) or model.cpu_share >= CLIMB_STOP_CPU_SHARE:
        return []
    limit, rungs = climb_limit(search), []
    while len(rungs) < MAX_CLIMB_RUNGS and min(2 * top, limit) > top:
        top = min(2 * top, limit)
        planned = [search.window(normalise(replace(start, num_workers=w))) for w in
                   (*rungs, top)]
        if not search.epoch_holds([*windows, *planned]):
            break
        rungs.append(top)
    if rungs:
        recalibrate(search, rungs[-1])
    return rungs


def rides_with_the_check(search: SearchState, best: ProbeRecord) -> bool:
    """Whether the second screen's windows can ride ahead of the claim's check, in its
    launch (``SearchState.carry``): the check is to run (``--pairs``) in windows of one
    launch (screens work, no launch ended short, the script's batch size) and nothing of the
    search reads them before it (no batch size to measure)."""
    base = search.baseline
    assert base is not None and search.axes is not None
    return search.options.pairs > 0 and in_one_launch(search, base, best) \
        and set(search.axes.batch_size) <= {base.config.batch_size} \
        and not compute_bound(candidate_of(base))


def in_one_launch(search: SearchState, base: ProbeRecord, subject: ProbeRecord) -> bool:
    """Whether the check of ``subject`` runs in windows of one launch: at the script's batch
    size, where screens work and no launch of the search ended before its steps (windows of
    one launch would outrun the script)."""
    return subject.config.batch_size == base.config.batch_size \
        and not search.measurer.screen_unsupported and not any(e.short for e in search.entries)


def recalibrate(search: SearchState, workers: int) -> None:
    """Window timeouts sized for ``workers`` (their prefetch backlog is longer)."""
    assert search.axes is not None and search.baseline is not None
    if workers > max(search.axes.num_workers):
        search.measurer.calibrate(search.baseline, replace(
            search.axes, num_workers=tuple(sorted({*search.axes.num_workers, workers}))))


def all_slower(search: SearchState, screened: list[ProbeRecord]) -> bool:
    """Whether every worker count a screen measured past the script's own ran slower than
    the script's settings beyond noise (``climb.adding``, ``climb.slower_than_baseline``):
    more workers cost the loop, and the climb does not go on (a note says so)."""
    assert search.baseline is not None
    rungs = adding(screened, search.baseline)  # fewer workers than the script's say nothing
    if not rungs or not all(slower_than_baseline(e, search.baseline) for e in rungs):
        return False
    search.ladder_stopped(LadderStop(search.baseline, rungs))  # said once, if not said yet
    return True


def climb(search: SearchState, start: LoaderSettings, rungs: int = MAX_CLIMB_RUNGS) -> None:
    """Past the first screen: the next worker counts while ``next_workers`` says the loop
    still gains, none is slower than the baseline, and the last rung took less than a
    launch's timeout (the next, with more workers to start, would not finish); at most
    ``rungs`` of them, as windows of one launch where it holds them (``climb_rungs``), each
    dropped once the rungs below it stop the climb (``climb.Climb``)."""
    while rungs > 0:
        limit = climb_limit(search)
        points = climb_points(search.ok_entries(), start)
        following = next_workers(points, limit)
        if following is None or outlasted(search, start, points):
            return
        config = normalise(replace(start, num_workers=following))
        ladder = Ladder(search.baseline)
        if ladder([*search.ok_entries()], search.window(config)):
            assert ladder.stop is not None
            ladder.stop.skipped.append(config.label())
            search.ladder_stopped(ladder.stop)
            return
        window = search.window(config)
        planned = [following, *climb_rungs(search, start, following, [window])][:rungs]
        rungs -= len(planned)
        recalibrate(search, planned[-1])
        judge = Climb(search.baseline, start, planned, limit)
        search.measurer.measure_screen(
            [search.window(normalise(replace(start, num_workers=w))) for w in planned], judge)
        if judge.stop is not None:
            search.ladder_stopped(judge.stop)
            return
        measured = [r for r in (search.find(normalise(replace(start, num_workers=w)))
                                for w in planned) if r is not None]
        if measured and slower_than_baseline(measured[-1], search.baseline):
            search.ladder_stopped(LadderStop(search.baseline, [measured[-1]]))
            return  # more workers cost the loop: the climb stops here
        if len(measured) < len(planned):
            return  # a rung the climb did not reach: the rungs below it stopped it


def outlasted(search: SearchState, start: LoaderSettings, points: list[Any]) -> bool:
    """Whether the climb's top rung so far took longer than a launch's timeout."""
    if not points:
        return False
    top = max(point.workers for point in points)
    entry = search.find(normalise(replace(start, num_workers=top)))
    wall = entry.wall_s if entry is not None else None
    if wall is None or wall <= search.measurer.timeout_s:
        return False
    search.progress("note", {"text": f"{top} workers took {wall:.0f} s, beyond the "
                                     f"{search.measurer.timeout_s:.0f} s a launch gets: no "
                                     "climb past them"})
    return True


def contender(search: SearchState, best: ProbeRecord) -> Optional[Window]:
    """A screened window faster than the choice, but tied with it only because its
    throughput is uncertain (relative SE above ``UNSTABLE_RSE``: a window's few steps of a
    bursty loader): measured again, twice as long, in the second screen, so that the
    choice rests on a measurement that can tell them apart."""
    top = max(search.ok_entries(), key=lambda e: e.throughput, default=None)
    if top is None or top is best or not top.screened \
            or top.throughput <= best.throughput or relative_se(top) <= UNSTABLE_RSE:
        return None
    return search.window(normalise(top.config), steps=search.options.steps * 2)


def second_screen(search: SearchState, best: ProbeRecord, again: bool = True) -> list[Window]:
    """A fresh measurement of a screened best (``again``: unless the claim's check in the same
    launch measures it), an uncertain contender twice as long, then the best's prefetch and
    pinning variants."""
    assert search.axes is not None
    current = normalise(best.config)
    configs = [current]
    if current.num_workers and waits_for_data(best):
        configs += [normalise(replace(current, prefetch_factor=v))
                    for v in search.axes.prefetch_factor]
    configs += [normalise(replace(current, pin_memory=v)) for v in search.axes.pin_memory]
    unique: list[LoaderSettings] = []
    for config in configs:
        if config not in unique and (config == current and best.screened and again
                                     or config != current and search.find(config) is None):
            unique.append(config)
    windows = [search.window(c) for c in unique]
    uncertain = contender(search, best)
    if uncertain is not None and uncertain.config not in unique:
        windows.insert(1 if current in unique else 0, uncertain)
    return windows


def rescreen(search: SearchState, best: ProbeRecord) -> None:
    """The worker counts measured before, again at the batch size the search moved to, in
    one screen: what a batch costs to load and to pass between processes changes with its
    size, so the best loader at the script's batch size need not be the best at another (a
    short MLP on in-memory data kept its 2 workers at batch 256 and ran 0.75 of batch 256
    without workers in plain launches)."""
    current = normalise(best.config)
    workers = sorted({e.config.num_workers or 0 for e in search.ok_entries()})
    configs = [normalise(replace(current, num_workers=w)) for w in workers]
    windows = [search.window(c) for c in dict.fromkeys(configs) if search.find(c) is None]
    if windows:
        ladder = Ladder(search.baseline)
        search.measurer.measure_screen(windows, ladder)
        if ladder.stop is not None:
            search.ladder_stopped(ladder.stop)


def measure_larger_batches(search: SearchState, best: ProbeRecord) -> ProbeRecord:
    """``best``'s loader settings with 2x, then 4x the script's per-rank batch, each a launch
    of its own, while it runs faster than the best so far (beyond noise, or within it by a
    gain worth a check, ``evidence.worth_checking``: an undecided 2x is no reason not to
    measure 4x: stopping at an undecided 2x can miss a 4x that is clearly faster); the fastest
    beyond noise. Called where the baseline is compute-bound
    (``run``) and where communication is exposed (``sweep.communication``: the all-reduce
    moves the same gradients per step whatever the batch). A configuration measured already
    is not launched again, so a second call measures nothing new; nor is one that what ran
    at its batch size says cannot beat ``best`` (``cannot_win``)."""
    assert search.baseline is not None
    loader = normalise(best.config)
    own = search.baseline.config.batch_size or loader.batch_size
    if not own:
        return best
    for factor in (2, 4):
        config = replace(loader, batch_size=own * factor)
        if cannot_win(search, config, best):
            break
        entry = search.measure_config(config)
        if beats(entry, best):
            assert entry is not None
            best = entry
        elif not (is_measured(entry)
                  and evidence.worth_checking(candidate_of(entry), candidate_of(best))):
            break  # no gain worth a check, or not measured: a larger batch is not worth more
    return best


def cannot_win(search: SearchState, config: LoaderSettings, best: ProbeRecord) -> bool:
    """Whether ``config`` would run slower than ``best`` beyond noise even without any wait
    for data, as what ran at its batch size shows (``decide.choose.loading_free``): its
    loader settings cannot win that back. Said once, with the measurement it rests on."""
    if search.find(normalise(config)) is not None:
        return False
    bound = loading_free([candidate_of(e) for e in search.ok_entries()], config)
    if bound is None or not better(candidate_of(best), bound):
        return False
    search.note_once(f"cannot win {config.label()}", f"{config.label()} is not measured: at "
                     f"batch {config.batch_size}, {bound.id} would run "
                     f"{bound.throughput:,.1f} samples/s with no wait for data at all, "
                     f"slower than {best.id}'s {best.throughput:,.1f}")
    return True


def try_axis(search: SearchState, best: ProbeRecord, axis: str) -> ProbeRecord:
    assert search.axes is not None
    current = normalise(best.config)
    values = getattr(search.axes, axis)
    if axis == "prefetch_factor" and (not current.num_workers or not waits_for_data(best)):
        return best  # prefetching only helps a loop that still waits for data
    for value in values:
        candidate = normalise(replace(current, **{axis: value}))
        if candidate == current:
            continue
        entry = search.measure_config(candidate)
        if beats(entry, best):
            best = entry
        elif axis == "batch_size" and entry is not None and entry.status == Status.OOM:
            break
    return best


def riding_variant(carried: list[Window], candidate: LoaderSettings) -> Optional[LoaderSettings]:
    """Of the second screen's windows carried into the claim's check (``second_screen``), the
    first of another configuration than ``candidate``'s at its batch size and worker count:
    its prefetch or pinning variant, which rides in the check's launch (``VariantRides``)."""
    for window in carried:
        config = normalise(window.config)
        if window.kind == Kind.SWEEP and config != candidate \
                and (config.batch_size, config.num_workers) == (candidate.batch_size,
                                                                candidate.num_workers):
            return config
    return None


class VariantRides:
    """The judge of a check's launch (``state.Condemned``) whose rider is a carried window's
    variant: its alternation's windows (``group``) are dropped where the variant's window
    measured no faster than the check's windows of ``candidate`` (their mean) by more than
    the noise floor (no contender then, ``decide.evidence.seen``); read from a running
    launch's rates too."""

    def __init__(self, group: str, variant: LoaderSettings, candidate: LoaderSettings):
        self.group, self.variant, self.candidate = group, variant, candidate

    def __call__(self, done: list[ProbeRecord], window: Window) -> bool:
        if (window.pair or {}).get("group") != self.group:
            return False
        variant = [e.throughput for e in done if e.kind == Kind.SWEEP and e.throughput
                   and normalise(e.config) == self.variant]
        candidate = [e.throughput for e in done if e.kind == Kind.PAIRED and e.throughput
                     and normalise(e.config) == self.candidate]
        if not variant or not candidate:
            return False
        return variant[-1] <= sum(candidate) / len(candidate) * (1 + DEFAULT_THRESHOLDS.noise_floor)

    def skip(self, windows: list[Window], stopped: Optional[str] = None) -> None:
        """Nothing to say: the variant's window says why (no faster)."""
