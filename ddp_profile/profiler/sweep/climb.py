"""The worker climb: where on the ``num_workers`` ladder to start, and the hill-climb from there.

Used by the adaptive search when the DataLoader cannot be rebuilt in place (no screens): one
probe per rung. It starts from the rung the baseline's data-wait share predicts, steps down
while a cheaper rung does as well and up while throughput rises beyond noise (one rung of
patience; only while the loop still waits for data). Where it can (screens), the climb adds
worker counts past the largest measured one (``next_workers``), as windows of one launch. A
``Ladder`` is the ``state.Condemned`` a screen is measured with: it condemns a rung the rungs
measured so far rule out (``ladder_evidence``) and keeps the first such evidence
(``LadderStop``), said once (``Search.ladder_stopped``) and kept in summary.json
(``search.ladder_stop``); a ``Climb`` also condemns a climb rung the rungs below it do not
climb to (``rising``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from ddp_profile.profiler.decide.capacity import DEFAULT_THRESHOLDS, bound_of
from ddp_profile.profiler.decide.choose import (
    UNSTABLE_RSE,
    Candidate,
    ChoiceThresholds,
    better,
    candidate_of,
    not_worse,
)
from ddp_profile.profiler.decide.evidence import outside_steps
from ddp_profile.profiler.decide.worker_restarts import restart_bound
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, is_measured, is_ok
from ddp_profile.profiler.sweep.screen import window_rates
from ddp_profile.profiler.sweep.space import normalise

SETTLED_DATA_WAIT = 0.05  # below this share of waiting, loading settings cannot help more
CLIMB_PATIENCE = 1  # rungs of the worker ladder tried past one that did not pay (noise)
CLIMB_STOP_CPU_SHARE = 0.5  # loading mostly CPU: more workers than the CPUs cannot help
CPU_SATURATED = 0.9  # share of the available CPUs busy at which more workers cannot help
STRONG_GAIN = 1.25  # ... unless the last climb step still gained this much


def waits_for_data(entry: ProbeRecord) -> bool:
    """Whether waiting for data still costs a measurable share of each step."""
    fraction = entry.data_wait_share
    return fraction is None or fraction >= SETTLED_DATA_WAIT


def winnable_share(entry: ProbeRecord) -> Optional[float]:
    """Share of each step that loading settings could win back, from direct evidence.

    With workers, what the loop's data wait costs (``data_wait_share``). Without, the time the
    loop spent making its own batches, measured where they were made (CPU, runnable and blocked
    time per sample x each rank's samples/s), at most that: the rest of the wait (the
    iterator's own bookkeeping) stays whatever the workers do, and workers add a transfer per
    batch.
    """
    fraction = entry.data_wait_share
    loading, throughput, ranks = entry.loading, entry.throughput, len(entry.ranks) or 1
    if entry.config.num_workers or loading is None or not throughput:
        return fraction
    per_sample = sum(part or 0.0 for part in (
        loading.cpu_per_sample_s, loading.wait_per_sample_s, loading.runq_per_sample_s,
        loading.pin_per_sample_s))
    share = per_sample * throughput / ranks
    return min(share, fraction) if fraction is not None else share


def worth_tuning(entry: ProbeRecord) -> bool:
    """Whether loading settings could win back a measurable share of the baseline's steps
    (``winnable_share`` at least ``SETTLED_DATA_WAIT``); unknown counts as yes."""
    share = winnable_share(entry)
    return share is None or share >= SETTLED_DATA_WAIT


def worth_screening(entry: ProbeRecord) -> bool:
    """Whether the worker ladder is worth a screen from the script's settings (``entry``):
    loading could win back a share of its steps (``worth_tuning``), or its whole run at them
    paid markedly more than its steps (``decide.evidence.outside_steps``): the workers'
    start-ups every epoch, a validation pass on the same workers, which worker settings
    change and no step holds. accelerate's ``cv_example.py`` waited 4 % of its steps in one
    run and 6-7 % in three others, its whole run 28 % longer than its steps each time: the
    ladder was screened in the three alone, as the wait fell either side of 5 %."""
    return worth_tuning(entry) or outside_steps(entry) is not None


def beats(candidate: Optional[ProbeRecord], incumbent: Optional[ProbeRecord]) -> bool:
    """A successful measurement faster than the incumbent beyond noise (or the first one);
    None (not launched) beats nothing."""
    if not is_measured(candidate):
        return False
    return incumbent is None or better(candidate_of(candidate), candidate_of(incumbent))


def slower_than_baseline(entry: Optional[ProbeRecord], baseline: Optional[ProbeRecord]
                         ) -> bool:
    """A successful measurement slower than the script's own settings beyond noise, which
    more workers cannot turn into a gain.

    Where its workers start again every epoch, the loss may be those restarts alone: its
    steps between them can still be faster, and more workers faster again. It counts as
    slower only where no worker count could beat the script's settings even with data free,
    given that restart (``worker_restarts.restart_bound``): a rung slower as run whose bound
    lies above the script's settings is no reason to stop climbing."""
    if not (is_measured(entry) and is_measured(baseline)):
        return False
    assert entry is not None and baseline is not None
    if not better(candidate_of(baseline), candidate_of(entry)):
        return False
    bound = restart_bound(entry, baseline)
    return bound is None or bound <= (baseline.throughput or 0.0)


def condemned_by(entries: list[ProbeRecord], config: LoaderSettings,
                 baseline: ProbeRecord) -> bool:
    """Whether ``entries`` condemn ``config`` (``ladder_evidence``)."""
    return ladder_evidence(entries, config, baseline) is not None


def ladder_evidence(entries: list[ProbeRecord], config: LoaderSettings,
                    baseline: ProbeRecord) -> Optional[list[ProbeRecord]]:
    """The measured rungs that condemn ``config``, or None. Of the rungs of its batch size
    that added workers to the script's own and have fewer than it (``adding``), the largest
    ran slower than the script's settings beyond noise (``slower_than_baseline``: unless its
    measured restarts say more workers could still win); or the two largest both lost beyond
    noise as run, the larger more: a ladder whose rungs lose more as they add workers ends
    there, whatever a model predicts of the rungs above (a 2-rank script whose samples sleep
    2 ms lost more with every rung: 52 workers were killed, and a ceiling at 26 timed out).
    A rung with fewer workers than the script's losing says the opposite (a script with 1
    worker kept alive: no workers ran slower)."""
    workers = config.num_workers or 0
    lower = sorted((e for e in adding(entries, baseline) if (e.config.num_workers or 0) < workers
                    and e.config.batch_size == config.batch_size),
                   key=lambda e: (e.config.num_workers or 0))
    if not workers or not lower:
        return None
    top = lower[-1]
    if slower_than_baseline(top, baseline):
        return [top]
    if len(lower) >= 2:
        below = lower[-2]
        loses = [better(candidate_of(baseline), candidate_of(e)) for e in (below, top)]
        if all(loses) and (top.throughput or 0.0) < (below.throughput or 0.0):
            return [below, top]
    return None


def adding(entries: list[ProbeRecord], baseline: ProbeRecord) -> list[ProbeRecord]:
    """The measured worker rungs (a failed rung says nothing) with more workers than the
    script's own settings: the rungs whose loss says that more workers cost the loop."""
    own = baseline.config.num_workers or 0
    return [e for e in entries if e.kind == Kind.SWEEP and is_measured(e)
            and (e.config.num_workers or 0) > own]


WATCHED = "-watched-"  # in the id of a running window's provisional record
WATCHED_RSE = 0.1  # the error a running window's rate is read with: stopped only well beyond


def watched(plan: Any, pending: list[Any], done: list[ProbeRecord],
            condemned: Optional[Callable[[list[ProbeRecord], Any], bool]]
            ) -> Optional[Callable[[], bool]]:
    """What a running screen is watched with: whether the windows every rank has left
    (``screen.window_rates``), read with ``WATCHED_RSE``, condemn every window it has yet to
    finish (``condemned``, over ``done`` and them); None without ``condemned``."""
    if condemned is None:
        return None

    def stop() -> bool:
        rates = window_rates(plan.out_dir, [w.config.to_dict() for w in pending])
        seen = [ProbeRecord.from_json({
            "id": f"{plan.probe_id}{WATCHED}{index}", "kind": pending[index].kind.value,
            "status": "ok", "config": pending[index].config.to_dict(), "throughput": rate,
            "throughput_rse": WATCHED_RSE, "epoch_restart_s": None,
            "steady_throughput": steady}) for index, (rate, steady) in rates.items()
            if index < len(pending)]
        rest = pending[len(rates):]
        return bool(seen and rest) and all(condemned([*done, *seen], w) for w in rest)
    return stop


def holds(candidate: Optional[ProbeRecord], incumbent: ProbeRecord) -> bool:
    """A successful measurement at least as fast as the incumbent, within noise."""
    return is_measured(candidate) and not_worse(candidate_of(candidate), candidate_of(incumbent))


def predicted_rung(baseline: Optional[ProbeRecord], ladder: list[int]) -> int:
    """The worker-ladder rung the baseline's own measurement points at.

    A data-bound loop consumes one batch per step time T, of which (1 - f) is compute (f the
    data-wait share); ``w`` workers each deliver a batch every L = T * max(w, 1). Enough
    workers to keep up: L / ((1 - f) T) = max(w, 1) / (1 - f). Not data-bound: stay put.
    """
    if baseline is None or not is_ok(baseline):
        return 0
    workers = baseline.config.num_workers or 0
    fraction = baseline.data_wait_share
    needed = workers
    if fraction is not None and fraction >= SETTLED_DATA_WAIT:
        needed = math.ceil(max(workers, 1) / max(1.0 - fraction, 0.05))
    for index, rung in enumerate(ladder):
        if rung >= needed:
            return index
    return len(ladder) - 1


def climb_workers(measure: Callable[[LoaderSettings], Optional[ProbeRecord]],
                  baseline: ProbeRecord, start: LoaderSettings, ladder: list[int]
                  ) -> Optional[ProbeRecord]:
    """Hill-climb the worker ladder from the rung the baseline predicts; the best entry.

    Down while a cheaper rung is at least as fast (within noise), else up while a rung is
    faster beyond noise (one rung of patience) and the loop still waits for data; a rung
    slower than the baseline beyond noise ends the climb at once. A rung ``measure`` did not
    launch (None) is no better than a failed one.
    """
    def at(index: int) -> Optional[ProbeRecord]:
        return measure(normalise(replace(start, num_workers=ladder[index])))

    index = predicted_rung(baseline, ladder)
    best, best_index = at(index), index
    if not is_ok(best):
        best, best_index = None, -1
    for lower in range(index - 1, -1, -1):
        entry = at(lower)
        if best is not None and not holds(entry, best):
            break
        if is_ok(entry):
            best, best_index = entry, lower
    if best is not None and best_index < index:
        return best  # a cheaper rung did as well: going up will not pay
    misses = 0
    for upper in range(index + 1, len(ladder)):
        if best is not None and not waits_for_data(best):
            break  # no data wait left for more workers to hide
        entry = at(upper)
        if slower_than_baseline(entry, baseline):
            break  # more workers cost the loop: the rungs above will not pay
        if beats(entry, best):
            best, misses = entry, 0
        elif is_ok(entry):
            misses += 1
            if misses > CLIMB_PATIENCE:
                break
    return best


def climb_points(entries: list[ProbeRecord], start: LoaderSettings) -> list[ClimbPoint]:
    """The measured worker counts of ``start``'s pinning and batch size, as
    ``next_workers`` sees them: the latest measurement of each configuration (one
    measured again, longer, replaces its screen's)."""
    points: dict[tuple, ClimbPoint] = {}
    for entry in entries:
        config, seen = entry.config, candidate_of(entry)
        if (config.pin_memory, config.batch_size) != (start.pin_memory, start.batch_size):
            continue
        points[(config.num_workers or 0, config.prefetch_factor)] = ClimbPoint(
            int(config.num_workers or 0), seen.throughput, seen.rse, waits_for_data(entry),
            entry.loading.cpu_share if entry.loading is not None else None,
            entry.host.cpu_busy, launch=seen.launch)
    return list(points.values())


# ---- the screens' climb: one worker count more per launch, while it pays ----------------

@dataclass(frozen=True)
class ClimbPoint:
    """One measured worker count, as the climb sees it."""

    workers: int
    throughput: float  # global samples/s
    rse: float = 0.0  # relative standard error of the throughput
    waits: bool = True  # the loop still waits for data
    cpu_share: Optional[float] = None  # measured CPU share of producing a sample
    cpu_busy: Optional[float] = None  # share of the available CPUs busy while measured
    launch: Optional[str] = None  # the launch that measured it (None: unknown)

    def candidate(self) -> Candidate:
        """As the choice sees it: whether one count beats another is ``choose.better``'s."""
        return Candidate(id=f"w{self.workers}", config=LoaderSettings(self.workers),
                         throughput=self.throughput, rse=self.rse, launch=self.launch)


def uncertain_rise(top: ClimbPoint, below: ClimbPoint,
                   thresholds: ChoiceThresholds = DEFAULT_THRESHOLDS) -> bool:
    """The top rung ran faster than the best smaller one by more than ``clear_gain``, and its
    own measurement is too uncertain to say whether beyond noise (relative SE above
    ``UNSTABLE_RSE``: a screen window's few steps of a bursty loader, such as cold files
    read one per sample). The climb is exploration: it takes that rise as a reason to measure
    one more rung; the choice and the claim's alternation, not the climb, decide on noise."""
    return top.rse > UNSTABLE_RSE and top.throughput > (1 + thresholds.clear_gain) \
        * below.throughput


def next_workers(points: list[ClimbPoint], limit: int) -> Optional[int]:
    """The next worker count to measure past the largest measured one, or None to stop.

    Climb (double, up to ``limit``: memory bound and cap) while the largest count measured is
    faster beyond noise than every smaller one (``choose.better``, the choice's one test: two
    launches also differ by a launch's own level), or faster by more than ``clear_gain`` where
    its measurement is too uncertain to tell (``uncertain_rise``), its loop still waits for
    data, and the CPUs are not saturated: measured, less than ``CPU_SATURATED`` of the
    available CPUs busy while its steps ran (whoever kept them busy), and loading is not
    CPU-bound (``bound_of``, runnable time not counted as waiting); where CPU use was not
    sampled, loading that is mostly CPU (``CLIMB_STOP_CPU_SHARE``) counts as saturated.

    Busy CPUs stop the climb only where the largest count gained less than ``STRONG_GAIN``
    over the best smaller one: they predict that the next doubling will not pay, and a strong
    last step is measured evidence against that prediction (latency-bound workers, 7 then 14
    per rank on 2 CPUs, ran 1.5x faster with the CPUs 93 % busy).
    """
    if not points:
        return None
    top = max(points, key=lambda p: p.workers)
    below = [p for p in points if p.workers < top.workers]
    if below:
        best_below = max(below, key=lambda p: p.throughput)
        if not better(top.candidate(), best_below.candidate()) and not uncertain_rise(
                top, best_below):
            return None  # no longer rising beyond noise
    if not top.waits:
        return None  # nothing left to hide
    gain = top.throughput / max(p.throughput for p in below) if below else math.inf
    if top.cpu_busy is not None and top.cpu_busy >= CPU_SATURATED and gain < STRONG_GAIN:
        return None  # the CPUs are saturated: more workers only queue for them
    share = top.cpu_share
    if share is not None and (bound_of(share) == "cpu" if top.cpu_busy is not None
                              else share >= CLIMB_STOP_CPU_SHARE):
        return None  # CPU-bound loading: the CPUs, not the worker count, limit it
    following = min(max(2 * top.workers, 1), limit)
    return following if following > top.workers else None


# ---- the end of the ladder ------------------------------------------------------------------
@dataclass
class LadderStop:
    """Why the ladder ended: the rungs that lost (against the script's settings) and the
    configurations that were then not measured."""

    baseline: ProbeRecord
    rungs: list[ProbeRecord]
    skipped: list[str] = field(default_factory=list)  # labels of windows not measured
    stopped_launch: Optional[str] = None  # a launch stopped while it ran, if any

    def words(self) -> str:
        """One line: the evidence, then what it saved."""
        base = self.baseline.throughput or 0.0
        lost = ", ".join(f"{r.config.num_workers} worker(s) {r.throughput:,.0f} ({r.id})"
                         for r in self.rungs)
        why = ("each rung lost more than the one below it" if len(self.rungs) > 1
               else "more workers than a rung that lost")
        skipped = sorted({int(label.split()[0][2:]) for label in self.skipped
                          if label.startswith("w=")})
        tail = (f"; not measured: {', '.join(map(str, skipped))} worker(s)" if skipped else "")
        stopped = f" ({self.stopped_launch} stopped early)" if self.stopped_launch else ""
        return (f"worker ladder ended: {lost} samples/s against the script's {base:,.0f}: "
                f"{why}{tail}{stopped}")

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": {"probe": self.baseline.id, "throughput": self.baseline.throughput},
                "rungs": [{"probe": r.id, "num_workers": r.config.num_workers,
                           "throughput": r.throughput} for r in self.rungs],
                "skipped": list(self.skipped), "stopped_launch": self.stopped_launch,
                "text": self.words()}


class Ladder:
    """A screen's judge of the windows it has yet to run (``state.Condemned``)."""

    def __init__(self, baseline: ProbeRecord):
        self.baseline = baseline
        self.stop: Optional[LadderStop] = None

    def __call__(self, done: list[ProbeRecord], window: Any) -> bool:
        if window.kind not in (Kind.SWEEP, Kind.CEILING):
            return False
        rungs = ladder_evidence(done, window.config, self.baseline)
        if rungs is None:
            return False
        if self.stop is None and not any(WATCHED in r.id for r in rungs):
            self.stop = LadderStop(self.baseline, rungs)  # recorded rungs (not a running
            # launch's provisional rates, ``climb.watched``)
        return True

    def skip(self, windows: list[Any], stopped: Optional[str] = None) -> None:
        """``windows`` were not measured because condemned (a launch ``stopped`` for them)."""
        if self.stop is None:
            return
        self.stop.skipped += [w.config.label() + (" ceiling" if w.kind == Kind.CEILING else "")
                              for w in windows]
        if stopped:
            self.stop.stopped_launch = stopped


def rising(points: list[ClimbPoint], workers: int, limit: int, provisional: bool = False
           ) -> Optional[bool]:
    """Whether the rungs measured below ``workers`` climb on to it (``next_workers``): True,
    False where they stop first, None where the rung below it is yet to be measured.
    ``provisional``: a running launch's rates (``watched``: no error of their own, no CPU
    use), read less strictly: the climb stops there only where the top rung gained no more
    than the noise floor over the best below it (the rule proper reads recorded windows)."""
    below = [p for p in points if p.workers < workers]
    if not below:
        return None
    top = max(below, key=lambda p: p.workers)
    if not provisional:
        following = next_workers(below, limit)
    else:
        smaller = [p.throughput for p in below if p.workers < top.workers]
        gained = not smaller or top.throughput > max(smaller) * (
            1 + DEFAULT_THRESHOLDS.noise_floor)
        following = min(2 * top.workers, limit) if gained and top.waits else None
    if following is None or following <= top.workers:
        return False
    return True if following >= workers else None


class Climb(Ladder):
    """A screen's judge whose windows include climb rungs (``climbing``: their worker counts
    past the ladder's, at ``start``'s pinning and batch size): each also condemned where the
    rungs measured below it stop the climb first (``rising``), as a launch a rung would."""

    def __init__(self, baseline: ProbeRecord, start: LoaderSettings, climbing: list[int],
                 limit: int):
        super().__init__(baseline)
        self.start, self.climbing, self.limit = start, set(climbing), limit

    def __call__(self, done: list[ProbeRecord], window: Any) -> bool:
        if super().__call__(done, window):
            return True
        workers = window.config.num_workers or 0
        if window.kind != Kind.SWEEP or workers not in self.climbing:
            return False
        rungs = [e for e in done if e.kind == Kind.SWEEP and is_measured(e)]
        return rising(climb_points(rungs, self.start), workers, self.limit,
                      provisional=any(WATCHED in e.id for e in rungs)) is False
