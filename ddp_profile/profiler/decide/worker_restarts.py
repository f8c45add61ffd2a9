"""What workers that start again every epoch cost the script, from measurements of this run:
the most any worker count restarting so can run (``restart_bound``, read by the ladder's
climb and the io-bound-loading finding), and a restarting configuration kept alive over the
script's whole run (``kept_alive``, read by the persistence check and the persistent-workers
finding). Pure functions over records."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from ddp_profile.profiler.store.probes import ProbeRecord


def restart_bound(entry: ProbeRecord, baseline: ProbeRecord) -> Optional[float]:
    """The most any worker count can run (global samples/s) as the script runs it, from a
    measurement of ``entry`` whose workers start again every epoch: its restart with data
    free. At the loop's demand ``D`` (samples/s with free data, the baseline's or its own,
    the higher) plus the restart it paid per sample, ``1/r - 1/s`` (``r`` as run, ``s``
    between restarts): ``1 / (1/D + 1/r - 1/s)``; more workers start at least as slowly as
    fewer. None where no restart was measured (its rate as run is all there is)."""
    steady = entry.epochs.steady_throughput if entry.epochs is not None else None
    rate = entry.throughput
    if not steady or not rate or steady <= rate:
        return None
    demand = max((d for d in (baseline.host.loop_demand, entry.host.loop_demand) if d),
                 default=math.inf)
    return 1.0 / (1.0 / demand + 1.0 / rate - 1.0 / steady)


START_MARGIN = 0.5  # a whole run "loses" kept alive even were its start this share of a restart


@dataclass(frozen=True)
class KeptAlive:
    """A prediction over the script's whole run from measurements of this run: the script's
    settings as run against a restarting configuration's workers kept alive, which start once
    (what a restart cost them) and then make batches at their rate between restarts."""

    probe: str  # the launch that ran the script to its end (``script_samples``)
    samples: int  # every rank's, over the whole run
    start_s: float  # a start of the configuration's workers: its restart, measured
    script_s: float  # the script's settings: ``samples`` at their rate as run
    kept_s: float  # kept alive: one start, then ``samples`` at the rate between restarts

    @property
    def loses(self) -> bool:
        """Slower over the whole run even were its start ``START_MARGIN`` of a restart."""
        return self.kept_s - (1 - START_MARGIN) * self.start_s >= self.script_s

    @property
    def break_even_s(self) -> Optional[float]:
        """The training time past which the start is won back (None: never)."""
        saved = 1.0 - (self.kept_s - self.start_s) / self.script_s  # of each second trained
        return self.start_s / saved if saved > 0 else None

    def words(self) -> str:
        return (f"the script's whole run ({self.samples:,} samples, run to its end in "
                f"{self.probe}) takes {self.script_s:.1f} s at its settings; kept alive, "
                f"those workers would start once ({self.start_s:.1f} s, what a restart cost "
                f"them) and take {self.kept_s:.1f} s")


def whole_run(records: Sequence[ProbeRecord]) -> Optional[ProbeRecord]:
    """The last ok launch that ran the script to its end (``script_samples``: the script's
    length as it counted it); None where none did."""
    return next((r for r in reversed(records) if r.ok and r.script_samples), None)


def run_steps(records: Sequence[ProbeRecord], batch_size: Optional[int]) -> Optional[int]:
    """A rank's training steps over the script's whole run at ``batch_size`` (None: the
    script's own, as its first launch, the baseline, ran it): ``whole_run``'s samples over the
    batch on every rank; None where no launch ran the script to its end."""
    run = whole_run(records)
    batch = batch_size or (records[0].config.batch_size if records else None)
    if run is None or not run.ranks or not batch:
        return None
    return (run.script_samples or 0) // (batch * len(run.ranks))


WHOLE_RUN_HEADROOM = 1.25  # steps asked of a launch that is to run the script to its end, over
# those the samples of a whole run make at its batch size


def whole_run_steps(records: Sequence[ProbeRecord], batch_size: Optional[int], steps: int,
                    warmup: int, factor: int) -> Optional[int]:
    """Where a launch ran the script to its end (``whole_run``: a short script), the measured
    steps that take a launch at ``batch_size`` there too: that run's samples over the batch on
    every rank (the baseline's, ``records[0]``), a quarter more (``steps`` at least). Where
    the claim changes the batch size, its launches then time the whole run on both sides
    (``decide.paired.timed_runs``), as a user's check does; at one batch size the steps are
    kept (whole runs add the noise of what is not a step). None where no launch ran to the
    end, or that run is longer than ``factor`` probes' steps and warm-up."""
    run = whole_run(records)
    base = records[0] if records else None
    if run is None or base is None or not base.ranks or not batch_size:
        return None
    samples = run.script_samples or 0
    needed = math.ceil(WHOLE_RUN_HEADROOM * samples / (batch_size * len(base.ranks)))
    if needed > factor * (steps + warmup):
        return None
    return max(needed, steps)


def kept_alive(records: Sequence[ProbeRecord], restarting: ProbeRecord,
               baseline: ProbeRecord) -> Optional[KeptAlive]:
    """``KeptAlive`` for ``restarting`` (a probe whose workers start again every epoch, with
    the cost measured) against ``baseline``, over the script's length as the last ok launch
    that ran it to its end counted it; None where no launch did, or a figure is missing."""
    epochs = restarting.epochs
    whole = whole_run(records)
    if whole is None or epochs is None or not epochs.steady_throughput or not epochs.restart_s \
            or not baseline.throughput:
        return None
    samples = whole.script_samples or 0
    return KeptAlive(whole.id, samples, epochs.restart_s, samples / baseline.throughput,
                     epochs.restart_s + samples / epochs.steady_throughput)
