"""The search's contracts: with its measurer (``Window``, ``Measurer``) and with its parts
(``SearchState``), and its options (``SweepOptions``).

A measurer turns a ``Window`` (a configuration, its kind and probe mode) into a probe record;
the real one is ``sweep.measure.LedgerMeasurer``, tests inject a modelled one. The adaptive
search, the ceiling, the claim's check and the communication counterfactuals are handed the
one ``sweep.search.Search`` of a sweep, which imports them; they type it by ``SearchState``
instead of importing it (no cycle). They read its state and call its methods; only ``Search``
assigns its attributes.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from ddp_profile.profiler.cache import CacheMode
from ddp_profile.profiler.decide.capacity import Capacity
from ddp_profile.profiler.settings import LoaderSettings, Mode
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.sweep.space import Axes, SearchSpace

ProgressFn = Callable[[str, dict[str, Any]], None]


def no_progress(_event: str, _data: dict[str, Any]) -> None:
    """The default progress callback: reports nothing."""


@dataclass(frozen=True)
class Window:
    """One configuration to measure: what to apply, the entry's kind, the probe mode; a probe
    of its own (``Measurer.measure``) or one window of a screen (``measure_screen``)."""

    config: LoaderSettings
    kind: Kind = Kind.SWEEP
    mode: Mode = Mode.NORMAL
    steps: Optional[int] = None  # measured steps asked (None: the run's ``--steps``)
    steps_per_s: Optional[float] = None  # predicted steps/s of a rank (``burst_steps``)
    pair: Optional[dict[str, Any]] = None  # its place in the claim's alternation (``claim``)
    ddp: Optional[dict[str, Any]] = None  # DDP options of the window: in a screen, gradient
    # synchronisation alone (``GRADIENT_SYNC``) switches between windows; None: the script's
    # own
    threads: Optional[int] = None  # torch's intra-op threads in every rank (None: the
    # script's own); in a screen, set at the window's switch (``ProbePlan.window_threads``)
    # In a launch of its own only (a loader is rebuilt at every switch; a window's warm-up is
    # ``settings.window_warmup``'s):
    persistent_workers: Optional[bool] = None  # True: every loader keeps its workers
    warmup: Optional[int] = None  # warm-up steps (None: the run's --warmup)


class Condemned(Protocol):
    """What a screen is measured with to drop windows its measurements rule out
    (``sweep.climb.Ladder``)."""

    def __call__(self, done: list[ProbeRecord], window: Window) -> bool:
        """Whether ``done`` (the screen's entries so far) condemn ``window``, yet to run."""

    def skip(self, windows: list[Window], stopped: Optional[str] = None) -> None:
        """Told the windows not measured because condemned (a launch ``stopped`` for them)."""


class Measurer(Protocol):
    """Turns configurations into ledger entries; the search's only way to measure."""

    entries: list[ProbeRecord]  # every measurement of this sweep, in order
    screen_unsupported: Optional[str]  # why screens cannot run (set by ``measure_screen``)
    timeout_s: float  # how long a launch of one probe may run

    def measure(self, window: Window) -> ProbeRecord:
        """One probe of ``window``, a launch of its own (``None`` settings: the script's own;
        ``steps_per_s``, the steps a rank is predicted to make per second, lengthens a fast
        probe's measurement, ``settings.burst_steps``)."""

    def measure_screen(self, windows: list[Window],
                       condemned: Optional[Condemned] = None) -> list[ProbeRecord]:
        """Several configurations in as few launches as possible, one entry each (in order);
        fewer entries than windows when a launch stopped early or screens are unsupported,
        and none for a window ``condemned`` before a further launch."""

    def context(self, entry: ProbeRecord) -> dict[str, Any]:
        """The rank context of a measured probe (device, cpus_available, ...), {} if none."""

    def calibrate(self, baseline: ProbeRecord, axes: Axes) -> None:
        """Told the baseline's measurement and the axes once they are known."""

    def settle_cache(self, baseline: ProbeRecord, requested: str) -> ProbeRecord:
        """Decide the run's page-cache regime from the baseline (``profiler.cache``) and apply it
        to every later launch; the baseline, measured again in the regime where its reads
        were not in it (the first then kept as kind ``cache``)."""

    def amend(self, entry: ProbeRecord, fields: dict[str, Any]) -> ProbeRecord:
        """Correct a measured entry (in memory and, for good, in the run's record); the
        corrected one."""

    def launch_estimate_s(self, windows: int = 1) -> Optional[float]:
        """Seconds a launch of ``windows`` windows is expected to take (None: unknown)."""

    def screen_steps(self, windows: list[Window]) -> int:
        """A rank's training steps over ``windows`` run one after another in one launch."""

    def screen_launches(self, windows: list[Window]) -> Optional[list[int]]:
        """How many of ``windows`` each launch of a screen is predicted to hold (None: the
        script's length is not known)."""



@dataclass(frozen=True)
class SweepOptions:
    search: str = "adaptive"  # grid | adaptive
    steps: int = 30
    warmup: int = 5
    timeout_s: Optional[float] = None
    ceiling: bool = True
    comm: bool = True  # the communication counterfactuals (``Search.communication``)
    single: bool = False  # measure the requested settings only (no search)
    repeat: int = 1  # launches of the recommended configuration in all (the gate's repeats)
    pairs: int = 3  # the claim checked: A B alternations of the baseline and the best (claim)
    cache: str = CacheMode.AUTO  # the page-cache regime asked for, one of ``profiler.cache``'s
    # ``MODES`` (a plain string where read back from the run's metadata)
    budget_s: Optional[float] = None  # the run's time: no launch started that would end past it


class BudgetSpent(Exception):
    """A launch the budget has no room for (raised before it starts, ``Budget.room_for``)."""

    def __init__(self, what: str, estimate_s: float, left_s: float):
        super().__init__(f"{what}: about {estimate_s:.0f} s, {max(left_s, 0):.0f} s left")
        self.what, self.estimate_s, self.left_s = what, estimate_s, left_s


FINISH_RESERVE_S = 10.0  # of a budget, kept for the analysis and the report after the last launch


class Budget:
    """The run's time (``--budget``) as the measurer spends it: a launch is started only where
    the estimate of its wall time (``estimate_s``) fits what is left."""

    def __init__(self) -> None:
        self.deadline: Optional[float] = None  # monotonic clock past which no launch may end
        self.started = time.monotonic()
        self.walls: list[float] = []  # wall seconds of this process's one-probe launches
        self.window_s = 0.0  # a screen window's seconds, from the baseline's steps
        self.per_window: list[float] = []  # ... as screens of this process took them

    def start(self, budget_s: Optional[float]) -> None:
        """Count the run's time from now (no budget: None)."""
        self.started = time.monotonic()
        self.deadline = self.started + budget_s if budget_s else None

    def timed(self, wall_s: float, windows: int) -> None:
        """A launch of this process took ``wall_s`` for ``windows`` windows (0: one probe)."""
        if not windows:
            self.walls.append(wall_s)
        elif windows > 1 and self.walls:
            self.per_window.append(max(0.0, wall_s - statistics.median(self.walls))
                                   / (windows - 1))

    def estimate_s(self, windows: int, entries: list[ProbeRecord]) -> Optional[float]:
        """Seconds a launch of ``windows`` windows is expected to take: a one-probe launch as
        this run's took (their median; the baseline's recorded wall time before any), and each
        further window of a screen as this run's screens took them (the baseline's steps
        before any); None before any launch was timed."""
        walls = self.walls or [e.wall_s for e in entries
                               if e.kind == Kind.BASELINE and e.wall_s][:1]
        if not walls:
            return None
        window_s = statistics.median(self.per_window) if self.per_window else self.window_s
        return statistics.median(walls) + max(0, windows - 1) * window_s

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def left_s(self) -> Optional[float]:
        """Seconds of the budget left for launches (None: no budget)."""
        if self.deadline is None:
            return None
        return self.deadline - FINISH_RESERVE_S - time.monotonic()

    def room_for(self, windows: int, what: str, measurer: Any) -> None:
        """Raise ``BudgetSpent`` where a launch of ``windows`` windows (``what``) would end
        past the budget, by ``measurer``'s estimate."""
        left = self.left_s()
        estimate = measurer.launch_estimate_s(windows) if left is not None else None
        if left is not None and estimate is not None and estimate > left:
            raise BudgetSpent(what, estimate, left)


class SearchState(Protocol):
    """The one search of a sweep (``sweep.search.Search``), read-only to its parts."""

    @property
    def measurer(self) -> Measurer: ...

    @property
    def space(self) -> SearchSpace: ...

    @property
    def options(self) -> SweepOptions: ...

    @property
    def progress(self) -> ProgressFn: ...

    @property
    def nproc_per_node(self) -> int:
        """The ranks per machine the launch starts (where no probe observed them)."""

    @property
    def baseline(self) -> Optional[ProbeRecord]:
        """The script's own settings as measured (None until measured)."""

    @property
    def axes(self) -> Optional[Axes]:
        """The axes searched (None until the baseline was measured)."""

    @property
    def entries(self) -> list[ProbeRecord]:
        """Every measurement of this sweep, in order."""

    def note_once(self, topic: str, text: str) -> None:
        """Tell the user ``text`` the first time ``topic`` comes up in this sweep."""

    def ladder_stopped(self, stop: Any) -> None:
        """Record why the worker ladder ended (a ``sweep.climb.LadderStop``) and say it,
        once a sweep."""

    def alternation_stopped(self, record: dict[str, Any]) -> None:
        """Record how an alternation in launches ended: its group, check, letters, launches
        and ``stopped`` (``decide.stopping``: decided, futile, rounds or failed)."""

    def no_screens(self, why: str) -> None:
        """Screens cannot run in this sweep (``why``): one launch per configuration."""

    def loader(self) -> dict[str, Any]:
        """The training loader as the script built it (the baseline's context)."""

    def measure_config(self, config: LoaderSettings) -> Optional[ProbeRecord]:
        """Measure a full configuration (None: not launched)."""

    def find(self, config: LoaderSettings) -> Optional[ProbeRecord]:
        """The latest ok measurement of exactly this configuration, if any."""

    def ok_entries(self) -> list[ProbeRecord]:
        """The measurements that count for the choice."""

    def best(self) -> Optional[ProbeRecord]:
        """The entry the choice picks among the measurements so far."""

    def window(self, config: LoaderSettings, kind: Kind = Kind.SWEEP, mode: Mode = Mode.NORMAL,
               steps: Optional[int] = None) -> Window:
        """A window of ``config``, its measurement lengthened where it runs fast."""

    def steps_per_s(self, config: LoaderSettings, mode: Mode = Mode.NORMAL) -> Optional[float]:
        """Training steps per second one rank is predicted to make with ``config``."""

    def capacity(self) -> Optional[Capacity]:
        """The capacity model from what was measured so far."""

    def wants_ceiling(self) -> bool:
        """Whether a compute-only ceiling probe is worth a launch."""

    def riding_windows(self, others: list[Window]) -> list[Window]:
        """Windows of a later phase the worker ladder's launch holds as well as ``others``."""

    def epoch_holds(self, windows: list[Window]) -> bool:
        """Whether one launch holds ``windows`` (``communication.epoch_holds``)."""

    def carry(self, windows: list[Window]) -> None:
        """``windows`` measured ahead of the claim's check, in its launch (``take_carried``);
        on their own before any other launch that comes first (``Carrier``)."""

    def take_carried(self) -> list[Window]:
        """The windows carried so far (``carry``), for the launch that measures them."""


class Carrier:
    """The search's measurer, holding windows that ride in a later launch (``carry``): the
    screen that takes them (``take``) runs them ahead of its own windows; any other launch
    first measures them on their own, in the order they were asked, and so does ``flush``.
    Everything else is the measurer's own."""

    def __init__(self, measurer: Measurer):
        object.__setattr__(self, "inner", measurer)
        object.__setattr__(self, "carried", [])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def carry(self, windows: list[Window]) -> None:
        self.carried.extend(windows)

    def take(self) -> list[Window]:
        taken = list(self.carried)
        self.carried.clear()
        return taken

    def flush(self) -> list[ProbeRecord]:
        """Measure the windows carried so far, a screen of their own."""
        windows = self.take()
        return self.inner.measure_screen(windows) if windows else []

    def measure(self, window: Window) -> ProbeRecord:
        self.flush()
        return self.inner.measure(window)

    def measure_screen(self, windows: list[Window],
                       condemned: Optional[Condemned] = None) -> list[ProbeRecord]:
        self.flush()
        return self.inner.measure_screen(windows, condemned)


def where_windows(measurer: Measurer, windows: list[Window]) -> str:
    """How a screen of ``windows`` will run, in words: in one launch where a run of the
    script holds them, in the launches it takes where it does not, and where no launch ran
    the script to its end (its length unknown), one launch unless the script ends first."""
    counts = measurer.screen_launches(windows)
    if counts is None:
        return "in windows of one launch (more if the script ends first)"
    if len(counts) == 1:
        return "in one launch"
    return (f"in windows over about {len(counts)} launches ({'+'.join(map(str, counts))}: "
            "a run of the script holds no more)")


@dataclass(frozen=True)
class PlanStep:
    """A phase of the sweep in launches: the fewest, the usual and the most."""

    what: str
    low: int
    usual: int
    high: int

    def words(self) -> str:
        spread = f"{self.low}" if self.low == self.high else f"{self.low}-{self.high}"
        return f"{self.what} {spread}"


def plan(options: SweepOptions, space: SearchSpace, axes: Optional[Axes] = None,
         check_launches: int = 9) -> list[PlanStep]:
    """The sweep's phases in launches, as ``options`` and the axes (where known: after the
    baseline) have them, a claim checked in at most ``check_launches`` launches; what the
    progress prints before the first probe, and the estimate after the baseline multiplies
    by its launch."""
    steps = [PlanStep("baseline", 1, 1, 2)]  # measured again where it read out of the regime
    sizes = [len(v) for v in (axes.num_workers, axes.pin_memory, axes.prefetch_factor,
                              axes.batch_size)] if axes is not None else None
    if options.single:
        steps.append(PlanStep("the settings asked", 1, 1, 2))
    elif options.search == "grid":
        count = math.prod(sizes) if sizes else math.prod(
            len(v) for v in space.to_dict().values() if v) or 1
        steps.append(PlanStep("the grid", count, count, 2 * count))
    else:
        batches = len(space.batch_size or ()) or 4  # asked, else 2x and 4x (twice at most)
        # the climb rides in the ladder's launch and the second screen in the check's where
        # the script's run holds them (``sweep.adaptive``)
        steps += [PlanStep("worker-ladder screen", 1, 1, 2), PlanStep("climb", 0, 0, 3),
                  PlanStep("second screen", 0, 0 if options.pairs > 0 else 1, 2),
                  PlanStep("batch sizes", 0, 0, batches)]
    if options.ceiling:
        steps.append(PlanStep("ceiling", 0, 0, 1))  # in the first screen where it has one
    if options.pairs > 0:
        steps += [PlanStep("claim check", 0, 1, check_launches + 1),
                  PlanStep("persistent_workers check", 0, 0, 5)]
    if options.repeat > 1:
        steps.append(PlanStep("repeats", 0, options.repeat - 1, options.repeat - 1))
    return steps
