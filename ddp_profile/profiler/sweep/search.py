"""Plan the probes of one run over an injected measurer: baseline, search, ceiling, repeats.

``Search(measurer, space, options).run()`` decides what to measure and asks a ``Measurer``
(``profiler.sweep.measure``) for each measurement; ``Sweep`` is the real run: the ledger
measurer, SIGHUP ignored, a killed harness's probe reaped, the followers released at the end.

Grid search measures every combination. Adaptive search runs two screens, then the batch
sizes (``sweep.adaptive``); without screens it climbs the worker ladder (``sweep.climb``).
The compute-only ceiling is ``sweep.ceiling``'s, the communication counterfactuals
``sweep.communication``'s, the threads counterfactuals ``sweep.threads_check``'s.
The best measured configuration is ``decide.choose``'s alone, as in the recommendation;
``--repeat`` re-measures exactly the configuration recommended (``sweep.claim.recommended``:
that one, or the script's own where the claim's check did not find it faster).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from ddp_profile.errors import NoDataLoader, ProbeTimeout, ScriptFailed
from ddp_profile.profiler.cpus import cpus_available
from ddp_profile.profiler.decide.capacity import Capacity, run_model
from ddp_profile.profiler.decide.choose import (
    UNSTABLE_RSE,
    candidate_of,
    choose,
    relative_se,
)
from ddp_profile.profiler.decide.worker_restarts import run_steps
from ddp_profile.profiler.launch.coordinate import Coordinator
from ddp_profile.profiler.launch.ranks import LaunchSpec, ignore_hangup, restore_hangup
from ddp_profile.profiler.settings import LoaderSettings, Mode
from ddp_profile.profiler.store.probes import (
    Kind,
    ProbeRecord,
    Status,
    counts_for_choice,
    counts_for_gate,
    is_measured,
    latest_ceiling,
)
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep import adaptive, ceiling, claim, communication, threads_check
from ddp_profile.profiler.sweep.climb import LadderStop
from ddp_profile.profiler.sweep.measure import LedgerMeasurer
from ddp_profile.profiler.sweep.space import Axes, SearchSpace, grid, normalise, resolve_axes
from ddp_profile.profiler.sweep.state import (
    BudgetSpent,
    Carrier,
    Measurer,
    PlanStep,
    ProgressFn,
    SweepOptions,
    Window,
    no_progress,
    plan,
)


class Search:
    """The decisions of one sweep, over a measurer (real or modelled)."""

    def __init__(self, measurer: Measurer, space: SearchSpace, options: SweepOptions,
                 nproc_per_node: int = 1, progress: ProgressFn = no_progress,
                 script: str = "the script"):
        self.measurer: Any = Carrier(measurer)  # ``Measurer``'s, with windows carried
        self.space, self.options = space, options
        self.script = script
        self.nproc_per_node = nproc_per_node
        self.progress = progress
        self.axes: Optional[Axes] = None
        self.baseline: Optional[ProbeRecord] = None
        self.oom_batch: Optional[int] = None
        self._noted: set[str] = set()  # topics already told the user (``note_once``)
        self.ladder_stop: Optional[LadderStop] = None  # why the worker ladder ended
        self.budget_stop: Optional[dict[str, Any]] = None  # where the budget stopped the sweep
        self.alternation_stops: list[dict[str, Any]] = []  # how each launch alternation ended

    @property
    def entries(self) -> list[ProbeRecord]:
        return self.measurer.entries

    def run(self) -> list[ProbeRecord]:
        """Baseline, then the search, the ceiling, the claim's check and the repeats; every
        entry, in order. Where the budget has no room for a launch (``state.BudgetSpent``),
        the phases left are not run and ``budget_stop`` says which."""
        self.progress("plan", {"plan": self.plan(),
                               "budget_s": self.options.budget_s})
        self.baseline = self.measurer.measure(Window(LoaderSettings(), Kind.BASELINE))
        self._check_baseline(self.baseline)
        phases = self._phases()
        for index, (name, step) in enumerate(phases):
            try:
                step()
            except BudgetSpent as spent:
                self.budget_stop = {"phase": name, "launch": spent.what,
                                    "estimate_s": round(spent.estimate_s, 1),
                                    "left_s": round(max(spent.left_s, 0.0), 1),
                                    "not_done": [n for n, _ in phases[index:] if n]}
                self.progress("budget", dict(self.budget_stop))
                break
        return self.entries

    def _phases(self) -> list[tuple[str, Callable[[], None]]]:
        """The sweep after the baseline, in order: (what it is, for a budget's stop; step)."""
        def settle() -> None:
            assert self.baseline is not None
            self.baseline = self.measurer.settle_cache(self.baseline, self.options.cache)
            self._check_baseline(self.baseline)
            self.axes = self._axes()
            self.measurer.calibrate(self.baseline, self.axes)
            self.progress("axes", {"axes": self.axes, "grid": grid(self.axes),
                                   "counted": self.options.single
                                   or self.options.search == "grid"})
            self.progress("estimate", {"plan": self.plan(),
                                       "launch_s": self.measurer.launch_estimate_s(),
                                       "budget_s": self.options.budget_s})

        def search() -> None:
            if self.options.single:
                self.measure_config(self._requested_single())
            elif self.options.search == "grid":
                for config in grid(self.axes):
                    self.measure_config(config)
            else:
                self.adaptive()

        adaptive_run = not self.options.single and self.options.search == "adaptive"
        return [
            ("the page-cache regime's baseline", settle),
            ("the search" if not adaptive_run else
             "the search (worker ladder, prefetch and pinning, batch sizes)", search),
            ("the communication counterfactuals" if self.options.comm else "",
             lambda: communication.measure(self, larger_batches=adaptive_run)
             if self.options.comm else None),
            ("the threads counterfactuals", lambda: threads_check.measure(self)),
            ("the compute-only ceiling" if self.options.ceiling else "",
             lambda: ceiling.measure(self) if self.wants_ceiling() else None),
            ("", lambda: ceiling.vet(self)),
            ("the claim's check (A B alternation)" if self.options.pairs > 0 else "",
             self._check),
            # after the claim's check, which can keep the script's settings
            ("the repeats" if self.options.repeat > 1 else "", self.repeat),
            ("the persistent_workers check" if self.options.pairs > 0 else "",
             lambda: claim.confirm_persistence(self)),
        ]

    def _check(self) -> None:
        """The claim's check; then what it did not carry (``carry``: none to check)."""
        claim.confirm(self)
        self.measurer.flush()

    def carry(self, windows: list[Window]) -> None:
        self.measurer.carry(windows)

    def take_carried(self) -> list[Window]:
        return self.measurer.take()

    def epoch_holds(self, windows: list[Window]) -> bool:
        return communication.epoch_holds(self, windows)

    def riding_windows(self, others: list[Window]) -> list[Window]:
        """Windows of a later phase the worker ladder's launch holds as well as ``others``
        (``communication.riding_windows``)."""
        return communication.riding_windows(self, others)

    def plan(self) -> list[PlanStep]:
        """The sweep's phases in launches (``state.plan``), the axes' where known."""
        return plan(self.options, self.space, self.axes, claim.MAX_CLAIM_LAUNCHES)

    def wants_ceiling(self) -> bool:
        return ceiling.wanted(self)

    def note_once(self, topic: str, text: str) -> None:
        """Tell the user ``text`` the first time ``topic`` comes up in this sweep."""
        if topic not in self._noted:
            self._noted.add(topic)
            self.progress("note", {"text": text})

    def ladder_stopped(self, stop: LadderStop) -> None:
        """The first end of the worker ladder, kept for summary.json and said in one line."""
        if self.ladder_stop is None:
            self.ladder_stop = stop
            self.progress("ladder", {"text": stop.words()})

    def alternation_stopped(self, record: dict[str, Any]) -> None:
        """How an alternation in launches ended (``claim.launch_each``), kept for summary.json
        (``search.alternations``) and the verbose console's detail, not said as it runs."""
        self.alternation_stops.append(dict(record))

    def no_screens(self, why: str) -> None:
        """Screens cannot run in this sweep (``why``): every configuration from now on is a
        launch of its own (the measurer's ``screen_unsupported``, as a refused screen sets)."""
        self.measurer.screen_unsupported = why

    def loader(self) -> dict[str, Any]:
        """The training loader as the script built it (the baseline's context)."""
        if self.baseline is None:
            return {}
        return self.measurer.context(self.baseline).get("loader") or {}

    # ---- measuring ------------------------------------------------------------------------
    def measure_config(self, config: LoaderSettings) -> Optional[ProbeRecord]:
        """Measure a full configuration; re-measure longer once if its steps are unstable and
        the script's run can hold the longer probe. None: not launched (a smaller batch size
        already ran out of memory)."""
        known = self.find(config)
        if known is not None:
            return known
        if self.oom_batch is not None and (config.batch_size or 0) > self.oom_batch:
            return None
        rate = self.steps_per_s(config)
        entry = self.measurer.measure(Window(config, steps_per_s=rate))
        longer = self.options.steps * 2  # unless the script's run cannot hold them: a launch
        # that ran it to its end says how many steps it makes (the longer probe would stop there)
        run = run_steps(self.entries, config.batch_size)
        if entry.ok and relative_se(entry) > UNSTABLE_RSE and not entry.short \
                and (run is None or run >= longer + self.options.warmup):
            entry = self.measurer.measure(Window(config, steps=longer, steps_per_s=rate))
        if entry.status == Status.OOM and config.batch_size is not None:
            self.oom_batch = min(self.oom_batch or config.batch_size, config.batch_size - 1)
        return entry

    def find(self, config: LoaderSettings) -> Optional[ProbeRecord]:
        """The latest ok measurement of exactly this configuration, if any."""
        for entry in reversed(self.entries):
            if counts_for_choice(entry) and normalise(entry.config) == config:
                return entry
        return None

    def launches_of(self, config: LoaderSettings) -> list[ProbeRecord]:
        """The launches of exactly ``config`` that the gate may pool (``counts_for_gate``: a
        threads or DDP counterfactual runs the script otherwise, and is none of them)."""
        return [e for e in self.entries if counts_for_gate(e)
                and normalise(e.config) == normalise(config)]

    # ---- choosing -------------------------------------------------------------------------
    def ok_entries(self) -> list[ProbeRecord]:
        return [e for e in self.entries if counts_for_choice(e) and is_measured(e)]

    def best(self) -> Optional[ProbeRecord]:
        """The entry ``choose`` picks among the baseline and sweep measurements so far."""
        entries = {e.id: e for e in self.ok_entries()}
        base = self.baseline if self.baseline is not None and self.baseline.ok else None
        chosen = choose([candidate_of(e) for e in entries.values()],
                        candidate_of(base) if base is not None else None)
        return entries.get(chosen.id) if chosen is not None else None

    # ---- after the search -----------------------------------------------------------------
    def repeat(self) -> None:
        """Measure the recommended configuration (``claim.recommended``) again in fresh
        launches (kind ``repeat``), until ``options.repeat`` successful launches of it exist.
        Repeats never choose: they show how much whole launches of one configuration differ,
        which the gate needs."""
        best = claim.recommended(self) or self.baseline
        if self.options.repeat <= 1 or best is None or not best.ok:
            return
        config = best.config
        for _ in range(self.options.repeat - len(self.launches_of(config))):
            entry = self.measurer.measure(Window(config, Kind.REPEAT))
            if not entry.ok:
                break  # a crash or an OOM would only repeat itself

    # ---- the baseline ---------------------------------------------------------------------
    def _check_baseline(self, entry: ProbeRecord) -> None:
        if entry.ok:
            return
        if entry.reason == "no_dataloader":
            raise NoDataLoader(f"{self.script}: "
                               f"{entry.error or 'no DataLoader was iterated'}; "
                               f"nothing to measure")
        if entry.status == Status.TIMEOUT:
            raise ProbeTimeout(f"the script's own settings did not finish a probe: "
                               f"{entry.error}")
        raise ScriptFailed(f"the script failed with its own settings: {entry.error}")

    def _host(self) -> tuple[int, int]:
        """The CPUs the baseline's ranks could use (their context's ``cpus_available``) and
        how many ranks shared one host, as observed."""
        assert self.baseline is not None
        context = self.measurer.context(self.baseline)
        return (int(context.get("cpus_available") or cpus_available()),
                self.baseline.host.ranks_per_host or self.nproc_per_node)

    def _axes(self) -> Axes:
        assert self.baseline is not None
        context = self.measurer.context(self.baseline)
        cpus, local_ranks = self._host()
        return resolve_axes(self.space, self.baseline.config,
                            context.get("device", "cpu"), cpus, local_ranks)

    def _requested_single(self) -> LoaderSettings:
        space = self.space
        return LoaderSettings(*(values[0] if values else None for values in (
            space.num_workers, space.pin_memory, space.prefetch_factor, space.batch_size))
        ).merged_over(self.baseline.config)

    # ---- adaptive -------------------------------------------------------------------------
    def adaptive(self) -> None:
        adaptive.run(self)

    def window(self, config: LoaderSettings, kind: Kind = Kind.SWEEP, mode: Mode = Mode.NORMAL,
               steps: Optional[int] = None) -> Window:
        return Window(config, kind, mode, steps, self.steps_per_s(config, mode))

    def steps_per_s(self, config: LoaderSettings, mode: Mode = Mode.NORMAL) -> Optional[float]:
        """Training steps per second one rank is predicted to make with ``config``: as measured
        where this configuration was measured before, else from the capacity model (the
        compute-only demand for a ceiling window); None where unknown. It lengthens the
        measurement of a fast window (``settings.burst_steps``)."""
        model = self.capacity() if self.baseline is not None else None
        batch = config.batch_size or (self.baseline.config.batch_size
                                      if self.baseline is not None else None)
        if model is None or not batch:
            return None
        known = self.find(config) if mode == Mode.NORMAL else None
        if known is not None:
            samples = known.throughput or 0.0
        elif mode == Mode.CEILING:
            samples = model.demand
        else:
            samples = model.throughput(config.num_workers or 0)
        return samples / model.ranks / batch if math.isfinite(samples) and samples > 0 else None

    def capacity(self) -> Optional[Capacity]:
        """The capacity model from what was measured so far (``decide.capacity``)."""
        assert self.baseline is not None
        cpus, local_ranks = self._host()
        context = {**self.measurer.context(self.baseline), "cpus_available": cpus}
        ceiling = latest_ceiling(self.entries)
        return run_model(self.ok_entries(), context, local_ranks,
                         ceiling.throughput if ceiling else None)

class Sweep:
    """The real sweep of one run directory: ``Search`` over a ``LedgerMeasurer``."""

    def __init__(self, run_dir: RunDir, spec: LaunchSpec, space: SearchSpace,
                 options: SweepOptions, progress: ProgressFn = no_progress,
                 coordinator: Optional[Coordinator] = None):
        self.measurer = LedgerMeasurer(run_dir, spec, options.steps, options.warmup,
                                       options.timeout_s, progress, coordinator, options.cache)
        self.search = Search(self.measurer, space, options, spec.nproc_per_node, progress,
                             spec.script)
        self.coordinator = coordinator

    @property
    def entries(self) -> list[ProbeRecord]:
        return self.measurer.entries

    @property
    def axes(self) -> Optional[Axes]:
        return self.search.axes

    @property
    def timeout_s(self) -> float:
        return self.measurer.timeout_s

    def run(self) -> list[ProbeRecord]:
        """The whole sweep; a closed terminal (SIGHUP) does not stop it."""
        previous = ignore_hangup()
        try:
            self.measurer.reap_inflight()
            self.measurer.budget.start(self.search.options.budget_s)
            return self.search.run()
        finally:
            if self.coordinator is not None:
                self.coordinator.finish(self.measurer.launches)
            restore_hangup(previous)
