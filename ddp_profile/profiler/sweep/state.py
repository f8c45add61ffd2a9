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
    # own. In a launch of its own only (a screen's windows share their ranks' threads, and a
    # loader is rebuilt at every switch; a window's warm-up is ``settings.window_warmup``'s):
    threads: Optional[int] = None  # torch's intra-op threads in every rank
    persistent_workers: Optional[bool] = None  # True: every loader keeps its workers
    warmup: Optional[int] = None  # warm-up steps (None: the run's --warmup)


Condemned = Callable[[list, Window], bool]  # (a screen's entries so far, a window it has yet
# to launch) -> whether what it measured condemns that window (``sweep.climb.condemned``)


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
