"""Plan the probes of one run over an injected measurer: baseline, search, repeats, ceiling.

``Search(measurer, space, options).run()`` decides what to measure and asks a ``Measurer``
(``profiler.sweep.measure``) for each measurement; ``Sweep`` is the real run: the ledger
measurer, SIGHUP ignored, a killed harness's probe reaped, the followers released at the end.

Grid search measures every combination. Adaptive search runs two screens, then the batch
sizes (``Search.adaptive``); without screens it climbs the worker ladder (``sweep.climb``).
The best measured configuration is ``sweep.choose``'s alone, as in the recommendation;
``--repeat`` re-measures exactly that configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from ddp_profile.errors import NoDataLoader, ProbeTimeout, ScriptFailed
from ddp_profile.profiler.cpus import cpus_available, threads_to_fit
from ddp_profile.profiler.launch.coordinate import Coordinator
from ddp_profile.profiler.launch.ranks import LaunchSpec, ignore_hangup, restore_hangup
from ddp_profile.profiler.settings import LoaderSettings
from ddp_profile.profiler.store.probes import counts_for_choice, counts_for_gate
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.store.summary import latest_ceiling
from ddp_profile.profiler.sweep import communication
from ddp_profile.profiler.sweep.capacity import (
    CLIMB_STOP_CPU_SHARE,
    WORKER_CAP,
    Capacity,
    loading_line,
    next_workers,
    run_model,
)
from ddp_profile.profiler.sweep.choose import UNSTABLE_RSE, candidate_of, choose, relative_se
from ddp_profile.profiler.sweep.climb import (
    beats,
    climb_points,
    climb_workers,
    slower_than_baseline,
    waits_for_data,
    worth_tuning,
)
from ddp_profile.profiler.sweep.measure import (
    LedgerMeasurer,
    Measurer,
    ProgressFn,
    Window,
    no_progress,
)
from ddp_profile.profiler.sweep.space import Axes, SearchSpace, grid, normalise, resolve_axes

MAX_CLIMB_LAUNCHES = 3  # launches the climb may add past the first screen

Entry = dict[str, Any]
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
    cache: str = "auto"  # the page-cache regime asked for (``profiler.cache``)


def settings_of(entry: Entry) -> LoaderSettings:
    return LoaderSettings.from_dict(entry.get("config"))


class Search:
    """The decisions of one sweep, over a measurer (real or modelled)."""

    def __init__(self, measurer: Measurer, space: SearchSpace, options: SweepOptions,
                 nproc_per_node: int = 1, progress: ProgressFn = no_progress,
                 script: str = "the script"):
        self.measurer, self.space, self.options = measurer, space, options
        self.script = script
        self.nproc_per_node = nproc_per_node
        self.progress = progress
        self.axes: Optional[Axes] = None
        self.baseline: Optional[Entry] = None
        self.oom_batch: Optional[int] = None
        self._ceiling_skip_noted = False

    @property
    def entries(self) -> list[Entry]:
        return self.measurer.entries

    def run(self) -> list[Entry]:
        """Baseline, then the search, the repeats and the ceiling; every entry, in order."""
        self.baseline = self.measurer.measure(LoaderSettings(), kind="baseline")
        self._check_baseline(self.baseline)
        self.baseline = self.measurer.settle_cache(self.baseline, self.options.cache)
        self._check_baseline(self.baseline)
        self.axes = self._axes()
        self.measurer.calibrate(self.baseline, self.axes)
        self.progress("axes", {"axes": self.axes, "grid": grid(self.axes),
                               "counted": self.options.single or self.options.search == "grid"})
        if self.options.single:
            self.measure_config(self._requested_single())
        elif self.options.search == "grid":
            for config in grid(self.axes):
                self.measure_config(config)
        else:
            self.adaptive()
        if self.options.comm:
            communication.measure(self, larger_batches=not self.options.single
                                  and self.options.search == "adaptive")
        self.threads()
        self.repeat()
        if self.wants_ceiling():
            self.ceiling()
        return self.entries

    def wants_ceiling(self) -> bool:
        """The compute-only probe is worth a launch only when loading settings could win back
        a measurable share of the baseline's steps (``climb.worth_tuning``): otherwise the
        loop is at its ceiling already (a note says so)."""
        if not self.options.ceiling or self.baseline is None:
            return False
        if self.baseline.get("status") == "ok" and not worth_tuning(self.baseline):
            if not self._ceiling_skip_noted:
                self._ceiling_skip_noted = True
                self.progress("note", {"text": "no compute-only ceiling probe: loading takes "
                                               "too little of the baseline's steps to win back"})
            return False
        return True

    # ---- measuring ------------------------------------------------------------------------
    def measure_config(self, config: LoaderSettings) -> Entry:
        """Measure a full configuration; re-measure longer once if its steps are unstable."""
        known = self.find(config)
        if known is not None:
            return known
        if self.oom_batch is not None and (config.batch_size or 0) > self.oom_batch:
            return {"status": "skipped", "config": config.to_dict(), "throughput": None}
        rate = self.steps_per_s(config)
        entry = self.measurer.measure(config, steps_per_s=rate)
        if entry["status"] == "ok" and relative_se(entry) > UNSTABLE_RSE:
            entry = self.measurer.measure(config, steps=self.options.steps * 2, steps_per_s=rate)
        if entry["status"] == "oom" and config.batch_size is not None:
            self.oom_batch = min(self.oom_batch or config.batch_size, config.batch_size - 1)
        return entry

    def find(self, config: LoaderSettings) -> Optional[Entry]:
        """The latest ok measurement of exactly this configuration, if any."""
        for entry in reversed(self.entries):
            if counts_for_choice(entry) and normalise(settings_of(entry)) == config:
                return entry
        return None

    def launches_of(self, config: LoaderSettings) -> list[Entry]:
        """The launches of exactly ``config`` that the gate may pool (``counts_for_gate``: a
        threads or DDP counterfactual runs the script otherwise, and is none of them)."""
        return [e for e in self.entries if counts_for_gate(e)
                and normalise(settings_of(e)) == normalise(config)]

    # ---- choosing -------------------------------------------------------------------------
    def ok_entries(self) -> list[Entry]:
        return [e for e in self.entries if counts_for_choice(e) and e.get("throughput")]

    def best(self) -> Optional[Entry]:
        """The entry ``choose`` picks among the baseline and sweep measurements so far."""
        entries = {str(e.get("id")): e for e in self.ok_entries()}
        base = self.baseline if self.baseline and self.baseline.get("status") == "ok" else None
        chosen = choose([candidate_of(e) for e in entries.values()],
                        candidate_of(base) if base is not None else None)
        return entries.get(chosen.id) if chosen is not None else None

    # ---- after the search -----------------------------------------------------------------
    def repeat(self) -> None:
        """Measure the recommended configuration again in fresh launches (kind ``repeat``),
        until ``options.repeat`` successful launches of it exist. Repeats never choose: they
        show how much whole launches of one configuration differ, which the gate needs."""
        best = self.best() or self.baseline
        if self.options.repeat <= 1 or best is None or best["status"] != "ok":
            return
        config = settings_of(best)
        for _ in range(self.options.repeat - len(self.launches_of(config))):
            entry = self.measurer.measure(config, kind="repeat")
            if entry["status"] != "ok":
                break  # a crash or an OOM would only repeat itself

    def threads(self) -> None:
        """The threads counterfactuals (kind ``threads``, never in the choice): where the
        baseline, or the best configuration found (its workers can tip the CPUs over: one rank
        of 16 latency-bound workers and torch's 2 threads on 2 CPUs ran 1.26x with 1 thread),
        oversubscribes the CPUs with intra-op threads (``cpus.threads_to_fit``), the same
        settings again with the threads that fit."""
        base, best = self.baseline, self.best()
        if base is None or base.get("status") != "ok":
            return
        subjects = [(base, LoaderSettings(), None)]
        if best is not None and normalise(settings_of(best)) != normalise(settings_of(base)):
            config = normalise(settings_of(best))
            subjects.append((best, config, self.steps_per_s(config)))
        for entry, config, rate in subjects:
            fit = threads_to_fit(entry.get("intra_op_threads"),
                                 entry.get("ranks_per_host") or self.nproc_per_node,
                                 entry.get("worker_cores") or 0.0, entry.get("cpus_available"))
            if fit is not None:
                self.measurer.measure(config, kind="threads", threads=fit, steps_per_s=rate)

    def ceiling(self) -> None:
        """The compute-only probe, at the recommended configuration's batch size."""
        best = self.best() or self.baseline
        ceiling = latest_ceiling(self.entries)
        if ceiling is None or settings_of(ceiling).batch_size != settings_of(best).batch_size:
            self.measurer.measure(settings_of(best), kind="ceiling", mode="ceiling",
                                  steps_per_s=self.steps_per_s(settings_of(best), "ceiling"))

    # ---- the baseline ---------------------------------------------------------------------
    def _check_baseline(self, entry: Entry) -> None:
        if entry["status"] == "ok":
            return
        if entry.get("reason") == "no_dataloader":
            raise NoDataLoader(f"{self.script}: "
                               f"{entry.get('error') or 'no DataLoader was iterated'}; "
                               f"nothing to measure")
        if entry["status"] == "timeout":
            raise ProbeTimeout(f"the script's own settings did not finish a probe: "
                               f"{entry.get('error')}")
        raise ScriptFailed(f"the script failed with its own settings: {entry.get('error')}")

    def _host(self) -> tuple[int, int]:
        """The CPUs the baseline's ranks could use (their context's ``cpus_available``) and
        how many ranks shared one host, as observed."""
        assert self.baseline is not None
        context = self.measurer.context(self.baseline)
        return (int(context.get("cpus_available") or cpus_available()),
                int(self.baseline.get("ranks_per_host") or self.nproc_per_node))

    def _axes(self) -> Axes:
        assert self.baseline is not None
        context = self.measurer.context(self.baseline)
        cpus, local_ranks = self._host()
        return resolve_axes(self.space, settings_of(self.baseline),
                            context.get("device", "cpu"), cpus, local_ranks)

    def _requested_single(self) -> LoaderSettings:
        space = self.space
        return LoaderSettings(*(values[0] if values else None for values in (
            space.num_workers, space.pin_memory, space.prefetch_factor, space.batch_size))
        ).merged_over(settings_of(self.baseline))

    # ---- adaptive -------------------------------------------------------------------------
    def adaptive(self) -> None:
        """Two screens, then the batch sizes. The first screen runs the whole worker ladder
        (and the ceiling) in one launch; the second confirms the best screened configuration
        in a fresh launch and, in the same launch, tries its prefetch and pinning variants.
        A baseline whose loading could win back little (``climb.worth_tuning``) gets no
        ladder, only its pinning variants.
        Batch sizes need launches of their own. A loader that cannot be rebuilt falls back to
        climbing the ladder with one probe per configuration."""
        assert self.axes is not None and self.baseline is not None
        own = settings_of(self.baseline)
        start = LoaderSettings(None, own.pin_memory if own.pin_memory is not None else False,
                               min(self.axes.prefetch_factor), own.batch_size)
        if worth_tuning(self.baseline):
            configs = [normalise(replace(start, num_workers=w)) for w in self._first_workers()]
        else:  # loading settings cannot win back more than the little time spent waiting
            configs = [normalise(replace(own, pin_memory=v)) for v in self.axes.pin_memory]
        windows = [self.window(c) for c in configs if self.find(c) is None]
        if self.wants_ceiling():
            windows.append(self.window(windows[-1].config if windows else normalise(own),
                                       "ceiling", "ceiling"))
        self.measurer.measure_screen(windows)
        if self.measurer.screen_unsupported:
            self.progress("note", {"text": "the DataLoader cannot be rebuilt in place "
                                           f"({self.measurer.screen_unsupported}): one probe each"})
            best = climb_workers(self.measure_config, self.baseline, start,
                                 list(self.axes.num_workers))
            for axis in ("prefetch_factor", "pin_memory"):
                best = self._try_axis(best, axis) if best is not None else None
        else:
            if worth_tuning(self.baseline) and self.space.num_workers is None:
                self._climb(start)
            best = self.best()
            if best is not None:
                self.measurer.measure_screen(self._second_screen(best))
                best = self.best()
        if best is not None:
            self._try_axis(best, "batch_size")

    def window(self, config: LoaderSettings, kind: str = "sweep", mode: str = "normal",
               steps: Optional[int] = None) -> Window:
        return Window(config, kind, mode, steps, self.steps_per_s(config, mode))

    def steps_per_s(self, config: LoaderSettings, mode: str = "normal") -> Optional[float]:
        """Training steps per second one rank is predicted to make with ``config``: as measured
        where this configuration was measured before, else from the capacity model (the
        compute-only demand for a ceiling window); None where unknown. It lengthens the
        measurement of a fast window (``settings.burst_steps``)."""
        model = self.capacity() if self.baseline is not None else None
        batch = config.batch_size or (settings_of(self.baseline).batch_size
                                      if self.baseline is not None else None)
        if model is None or not batch:
            return None
        known = self.find(config) if mode == "normal" else None
        if known is not None:
            samples = float(known["throughput"])
        elif mode == "ceiling":
            samples = model.demand
        else:
            samples = model.throughput(config.num_workers or 0)
        return samples / model.ranks / batch if math.isfinite(samples) and samples > 0 else None

    def capacity(self) -> Optional[Capacity]:
        """The capacity model from what was measured so far (``sweep.capacity``)."""
        assert self.baseline is not None
        cpus, local_ranks = self._host()
        context = {**self.measurer.context(self.baseline), "cpus_available": cpus}
        ceiling = latest_ceiling(self.entries)
        return run_model(self.ok_entries(), context, local_ranks,
                         ceiling.get("throughput") if ceiling else None)

    def _first_workers(self) -> list[int]:
        """The worker counts of the first screen: the ones the user gave (always measured),
        else the ladder up to the CPUs and the count the capacity model predicts meets the
        loop's demand (past the CPU count when loading mostly waits; then half and twice that
        too, in the same launch)."""
        assert self.axes is not None
        workers = set(self.axes.num_workers)
        model = self.capacity() if self.space.num_workers is None else None
        if model is not None:
            predicted = model.workers_for_demand()
            workers.add(predicted)
            if model.cpu_share < CLIMB_STOP_CPU_SHARE and predicted < model.max_workers:
                # a waiting loader's first climb step rides in the same launch, and so does
                # half the prediction, which rests on the compute-only demand: on 2 CPUs, 2
                # ranks of 16 latency-bound workers each ran 0.77x 8 workers, never measured
                workers.add(min(2 * predicted, model.max_workers))
                if predicted // 2 > max(workers - {predicted, 2 * predicted}, default=0):
                    workers.add(predicted // 2)
            self.progress("note", {"text": f"loading: {loading_line(model.to_dict())}; {predicted} "
                                           "worker(s) per rank predicted to meet the loop's "
                                           "demand"})
            self._recalibrate(max(workers))
        return sorted(workers)

    def _recalibrate(self, workers: int) -> None:
        """Window timeouts sized for ``workers`` (their prefetch backlog is longer)."""
        assert self.axes is not None and self.baseline is not None
        if workers > max(self.axes.num_workers):
            self.measurer.calibrate(self.baseline, replace(
                self.axes, num_workers=tuple(sorted({*self.axes.num_workers, workers}))))

    def _climb(self, start: LoaderSettings, launches: int = MAX_CLIMB_LAUNCHES) -> None:
        """Past the first screen: one more worker count per launch while ``next_workers``
        says the loop still gains (``sweep.capacity``) and none is slower than the baseline."""
        for _ in range(launches):
            model = self.capacity()
            limit = model.max_workers if model is not None else WORKER_CAP
            following = next_workers(climb_points(self.ok_entries(), start), limit)
            if following is None:
                return
            self._recalibrate(following)
            config = normalise(replace(start, num_workers=following))
            self.measurer.measure_screen([self.window(config)])
            if slower_than_baseline(self.find(config) or {}, self.baseline or {}):
                return  # more workers cost the loop: the climb stops here

    def _contender(self, best: Entry) -> Optional[Window]:
        """A screened window faster than the choice, but tied with it only because its
        throughput is uncertain (relative SE above ``UNSTABLE_RSE``: a window's few steps of a
        bursty loader): measured again, twice as long, in the second screen, so that the
        choice rests on a measurement that can tell them apart."""
        top = max(self.ok_entries(), key=lambda e: e["throughput"], default=None)
        if top is None or top is best or not top.get("screened") \
                or top["throughput"] <= best["throughput"] or relative_se(top) <= UNSTABLE_RSE:
            return None
        return self.window(normalise(settings_of(top)), steps=self.options.steps * 2)

    def _second_screen(self, best: Entry) -> list[Window]:
        """A fresh measurement of a screened best, an uncertain contender twice as long, then
        the best's prefetch and pinning variants."""
        assert self.axes is not None
        current = normalise(settings_of(best))
        configs = [current] if best.get("screened") else []
        if current.num_workers and waits_for_data(best):
            configs += [normalise(replace(current, prefetch_factor=v))
                        for v in self.axes.prefetch_factor]
        configs += [normalise(replace(current, pin_memory=v)) for v in self.axes.pin_memory]
        unique: list[LoaderSettings] = []
        for config in configs:
            if config not in unique and (config == current and best.get("screened")
                                         or self.find(config) is None):
                unique.append(config)
        windows = [self.window(c) for c in unique]
        contender = self._contender(best)
        if contender is not None and contender.config not in unique:
            windows.insert(1 if best.get("screened") else 0, contender)
        return windows

    def _try_axis(self, best: Entry, axis: str) -> Entry:
        assert self.axes is not None
        current = normalise(settings_of(best))
        values = getattr(self.axes, axis)
        if axis == "prefetch_factor" and (not current.num_workers or not waits_for_data(best)):
            return best  # prefetching only helps a loop that still waits for data
        for value in values:
            candidate = normalise(replace(current, **{axis: value}))
            if candidate == current:
                continue
            entry = self.measure_config(candidate)
            if beats(entry, best):
                best = entry
            elif axis == "batch_size" and entry.get("status") == "oom":
                break
        return best


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
    def entries(self) -> list[Entry]:
        return self.measurer.entries

    @property
    def axes(self) -> Optional[Axes]:
        return self.search.axes

    @property
    def timeout_s(self) -> float:
        return self.measurer.timeout_s

    def run(self) -> list[Entry]:
        """The whole sweep; a closed terminal (SIGHUP) does not stop it."""
        previous = ignore_hangup()
        try:
            self.measurer.reap_inflight()
            return self.search.run()
        finally:
            if self.coordinator is not None:
                self.coordinator.finish(self.measurer.launches)
            restore_hangup(previous)
