"""The end of the worker ladder: what a screen's measured rungs condemn, and the one record of it.

A ``Ladder`` is the ``state.Condemned`` a screen is measured with: asked of each window still to
run (before a launch, and while a launch runs, ``climb.watched``), it condemns a rung, or the
ceiling at a rung's settings, that the rungs measured so far rule out (``climb.ladder_evidence``)
and keeps the first such evidence and the windows it cost (``stop``); the search says it once
(``Search.ladder_stopped``) and summary.json keeps it (``search.ladder_stop``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ddp_profile.profiler.store.probes import Kind, ProbeRecord
from ddp_profile.profiler.sweep.climb import WATCHED, ladder_evidence


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
