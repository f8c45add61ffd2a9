"""The search as its parts see it (``SearchState``), and its options (``SweepOptions``).

The adaptive search, the ceiling, the claim's check and the communication counterfactuals are
handed the one ``sweep.search.Search`` of a sweep, which imports them; they type it by this
protocol instead of importing it (no cycle). They read its state and call its methods; only
``Search`` assigns its attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Protocol

from ddp_profile.profiler.decide.capacity import Capacity
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.sweep.measure import Measurer, ProgressFn, Window
from ddp_profile.profiler.sweep.space import Axes, SearchSpace


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
    cache: str = "auto"  # the page-cache regime asked for (``profiler.cache``)


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

    def window(self, config: LoaderSettings, kind: Kind = Kind.SWEEP, mode: str = "normal",
               steps: Optional[int] = None) -> Window:
        """A window of ``config``, its measurement lengthened where it runs fast."""

    def steps_per_s(self, config: LoaderSettings, mode: str = "normal") -> Optional[float]:
        """Training steps per second one rank is predicted to make with ``config``."""

    def capacity(self) -> Optional[Capacity]:
        """The capacity model from what was measured so far."""

    def wants_ceiling(self) -> bool:
        """Whether a compute-only ceiling probe is worth a launch."""
