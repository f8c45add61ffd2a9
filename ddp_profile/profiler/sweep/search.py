"""Plan and run the probes of one run: baseline, search (grid or adaptive), ceiling.

Every measurement goes through ``Sweep.measure``, which first looks in the ledger: a resumed run
replays the same deterministic decisions and re-uses every probe that already finished, so
``--resume`` neither re-runs nor loses a probe, for grid and adaptive search alike.

Adaptive search is coordinate ascent: on the ``num_workers`` ladder it starts from the rung the
baseline's data-wait share predicts, steps down while a cheaper rung does as well and up while
throughput rises beyond noise (one rung of patience; only while the loop still waits for data), then try the other prefetch factors (only
while it still waits), pinning and batch sizes around the best.
Configurations within noise of each other are ties, resolved toward the cheaper one.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from ddp_profile.errors import NoDataLoader, ProbeTimeout, ScriptFailed
from ddp_profile.profiler.cpus import cpus_available
from ddp_profile.profiler.settings import LoaderSettings, ProbePlan, backlog_warmup
from ddp_profile.profiler.sweep.coordinate import Coordinator
from ddp_profile.profiler.sweep.launch import LaunchOutcome, LaunchSpec, kill_tagged, launch, new_tag
from ddp_profile.profiler.sweep.probe import summarise_probe
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.screen import split_screen
from ddp_profile.profiler.sweep.space import Axes, SearchSpace, cost_key, grid, normalise, resolve_axes
from ddp_profile.profiler.store.summary import latest_ceiling

DEFAULT_FIRST_TIMEOUT_S = 600.0
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 4.0
FOLLOWER_GRACE_S = 120.0  # how long the leader waits for a follower's records after its own
UNSTABLE_RSE = 0.05  # a probe whose throughput is this uncertain is measured again, longer
MIN_TIE_TOLERANCE = 0.02
SETTLED_DATA_WAIT = 0.05
MIN_WINDOW_TIMEOUT_S = 30.0
CLIMB_PATIENCE = 1  # rungs of the worker ladder tried past one that did not pay (noise)  # below this share of waiting, loading settings cannot help more


@dataclass(frozen=True)
class SweepOptions:
    search: str = "adaptive"  # grid | adaptive
    steps: int = 30
    warmup: int = 5
    timeout_s: Optional[float] = None
    ceiling: bool = True
    single: bool = False  # measure the requested settings only (no search)
    repeat: int = 1  # launches of the recommended configuration in all (the gate's repeats)


ProgressFn = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Window:
    """One configuration of a screen: what to apply, the entry's kind, the probe mode."""

    config: LoaderSettings
    kind: str = "sweep"
    mode: str = "normal"


def _noop(_event: str, _data: dict[str, Any]) -> None:
    pass


def settings_of(entry: dict[str, Any]) -> LoaderSettings:
    return LoaderSettings.from_dict(entry.get("config"))


class Sweep:
    def __init__(self, run_dir: RunDir, spec: LaunchSpec, space: SearchSpace,
                 options: SweepOptions, progress: ProgressFn = _noop,
                 coordinator: Optional[Coordinator] = None):
        self.run_dir, self.spec, self.space, self.options = run_dir, spec, space, options
        self.progress = progress
        self.coordinator = coordinator  # set on the leader of a multi-node or allocation run
        self.launches = 0  # probes launched by this process (the coordinated probe index)
        self.run_token = new_tag()[:12]
        self.ledger = run_dir.ledger()
        self.entries: list[dict[str, Any]] = []  # this sweep's measurements, in order
        self.timeout_s = options.timeout_s or DEFAULT_FIRST_TIMEOUT_S
        self.axes: Optional[Axes] = None
        self.baseline: Optional[dict[str, Any]] = None
        self.oom_batch: Optional[int] = None
        self.screen_unsupported: Optional[str] = None  # why the loader could not be rebuilt

    # ---- measuring ------------------------------------------------------------------------
    def measure(self, requested: LoaderSettings, kind: str = "sweep", steps: Optional[int] = None,
                mode: str = "normal") -> dict[str, Any]:
        probe_id = f"p{len(self.entries):03d}"
        steps = steps or self.options.steps
        done = self._finished(probe_id, requested, kind, steps, screened=False)
        if done is not None:
            self._record(done, reused=True)
            return done
        self.run_dir.discard_partial_probe(probe_id)
        plan = ProbePlan(probe_id=probe_id, out_dir=self.run_dir.probe_dir(probe_id),
                         overrides=requested, warmup=self.options.warmup, steps=steps, mode=mode,
                         inject_local_rank=self.spec_local_rank_flag(),
                         rdzv_id=f"{self.run_token}-{probe_id}")
        self.progress("start", {"probe_id": probe_id, "config": requested, "kind": kind})
        outcome = self._launch(plan, self.timeout_s)
        entry = summarise_probe(plan, outcome, kind, self.timeout_s)
        self._record(entry)
        return entry

    def _finished(self, probe_id: str, requested: LoaderSettings, kind: str, steps: int,
                  screened: bool) -> Optional[dict[str, Any]]:
        """The ledger entry of a resumed run that measured exactly this, if any."""
        done = next((e for e in self.ledger if e.get("id") == probe_id), None)
        if done is None or done.get("requested") != requested.to_dict() \
                or done.get("kind") != kind or done.get("steps") != steps \
                or bool(done.get("screened")) != screened:
            return None
        return done

    def _launch(self, plan: ProbePlan, timeout_s: float) -> LaunchOutcome:
        """Launch one probe (on every node of a coordinated run) and wait for its records."""
        tag = new_tag()
        self.run_dir.mark_inflight(plan.probe_id, tag)
        if self.coordinator is not None:
            self.coordinator.publish(self.launches, {"plan": plan.to_json(),
                                                     "timeout_s": timeout_s})
        outcome = launch(self.spec, plan, timeout_s, tag=tag)
        if self.coordinator is not None:
            outcome = merge_outcomes(outcome, self.coordinator.gather(
                self.launches, plan.out_dir, timeout_s + FOLLOWER_GRACE_S))
        self.launches += 1
        return outcome

    def _record(self, entry: dict[str, Any], reused: bool = False) -> None:
        if not reused:
            self.run_dir.append(entry)
            self.run_dir.clear_inflight()
        self.entries.append(entry)
        self.progress("reused" if reused else "done", {"entry": entry})

    def measure_screen(self, windows: list[Window]) -> list[dict[str, Any]]:
        """Measure several configurations in as few launches as possible (see
        ``profiler.screen``): one launch runs them one after another; when it stops early
        (a crash, an OOM, a hang), the window it stopped in is recorded as that failure and the
        windows after it get a launch of their own. Each window becomes a ledger entry with
        ``screened`` true. Sets ``screen_unsupported`` when the loader cannot be rebuilt."""
        done: list[dict[str, Any]] = []
        pending = list(windows)
        while pending and not self.screen_unsupported:
            first = len(self.entries)
            ids = [f"p{first + i:03d}" for i in range(len(pending))]
            reused = self._reuse_screened(pending, ids)
            done += reused
            pending, ids = pending[len(reused):], ids[len(reused):]
            if not pending:
                break
            launch_id = f"{ids[0]}-screen"
            for probe_id in (launch_id, *ids):
                self.run_dir.discard_partial_probe(probe_id)
            plan = ProbePlan(
                probe_id=launch_id, out_dir=self.run_dir.probe_dir(launch_id),
                overrides=pending[0].config, warmup=self.options.warmup,
                steps=self.options.steps, mode="screen",
                windows=tuple({"overrides": w.config.to_dict(), "mode": w.mode,
                               "warmup": self._window_warmup(w)} for w in pending),
                inject_local_rank=self.spec_local_rank_flag(),
                rdzv_id=f"{self.run_token}-{launch_id}")
            timeout_s = self.screen_timeout(len(pending))
            self.progress("start", {"probe_id": launch_id, "config": pending[0].config,
                                    "kind": "screen", "windows": len(pending)})
            outcome = self._launch(plan, timeout_s)
            splits = split_screen(plan.out_dir, [self.run_dir.probe_dir(i) for i in ids],
                                  plan.window_starts(), plan.window_lengths())
            consumed = 0
            for split, window, probe_id in zip(splits, pending, ids):
                if split.unsupported is not None:
                    self.screen_unsupported = split.unsupported
                    break
                if not split.complete and not split.started and consumed:
                    break  # the launch stopped in an earlier window
                window_outcome = outcome if not split.complete else replace(
                    outcome, returncode=0, timed_out=False, wall_s=split.span_s)
                window_plan = ProbePlan(probe_id=probe_id,
                                        out_dir=self.run_dir.probe_dir(probe_id),
                                        overrides=window.config,
                                        warmup=self._window_warmup(window),
                                        steps=self.options.steps, mode=window.mode)
                entry = summarise_probe(window_plan, window_outcome, window.kind, timeout_s)
                entry.update(screened=True, launch=launch_id,
                             launch_wall_s=round(outcome.wall_s, 3))
                self._record(entry)
                done.append(entry)
                consumed += 1
                if not split.complete:
                    break
            self.run_dir.clear_inflight()
            if consumed == 0:
                break
            pending = pending[consumed:]
        return done

    def _window_warmup(self, window: Window) -> int:
        if window.mode != "normal":
            return self.options.warmup
        return backlog_warmup(self.options.warmup, window.config.num_workers,
                              window.config.prefetch_factor)

    def _reuse_screened(self, pending: list[Window], ids: list[str]) -> list[dict[str, Any]]:
        """The leading windows a resumed run already measured (same ids, same requests)."""
        reused = []
        for window, probe_id in zip(pending, ids):
            entry = self._finished(probe_id, window.config, window.kind, self.options.steps,
                                   screened=True)
            if entry is None:
                break
            self._record(entry, reused=True)
            reused.append(entry)
        return reused

    def screen_timeout(self, windows: int) -> float:
        """The first window gets a probe's timeout; each further one what its steps and a
        new set of workers take, four times over, and at least ``MIN_WINDOW_TIMEOUT_S``."""
        loop_s = 0.0
        if self.baseline and self.baseline.get("status") == "ok":
            medians = [r.get("step_time_median_s") or 0.0
                       for r in self.baseline.get("per_rank") or []]
            backlog = (max(self.axes.num_workers) * max(self.axes.prefetch_factor)
                       if self.axes else 0)
            loop_s = max(medians, default=0.0) * (max(self.options.warmup, backlog)
                                                   + self.options.steps)
            loop_s += self.baseline.get("time_to_first_batch_s") or 0.0
        per_window = max(MIN_WINDOW_TIMEOUT_S, TIMEOUT_FACTOR * loop_s)
        return self.timeout_s + (windows - 1) * per_window

    def spec_local_rank_flag(self) -> Optional[str]:
        return dict(self.spec.extra_env).get("DDP_PROFILE_LOCAL_RANK_FLAG")

    def measure_config(self, config: LoaderSettings) -> dict[str, Any]:
        """Measure a full configuration; re-measure longer once if its steps are unstable."""
        known = self.find(config)
        if known is not None:
            return known
        if self.oom_batch is not None and (config.batch_size or 0) > self.oom_batch:
            return {"status": "skipped", "config": config.to_dict(), "throughput": None}
        entry = self.measure(config)
        if entry["status"] == "ok" and relative_se(entry) > UNSTABLE_RSE:
            entry = self.measure(config, steps=self.options.steps * 2)
        if entry["status"] == "oom" and config.batch_size is not None:
            self.oom_batch = min(self.oom_batch or config.batch_size, config.batch_size - 1)
        return entry

    def find(self, config: LoaderSettings) -> Optional[dict[str, Any]]:
        """The latest ok measurement of exactly this configuration, if any."""
        for entry in reversed(self.entries):
            if entry.get("kind") in ("baseline", "sweep") and entry["status"] == "ok" and \
                    normalise(settings_of(entry)) == config:
                return entry
        return None

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN) if hasattr(signal, "SIGHUP") \
            else None
        try:
            self._reap_inflight()
            self.baseline = self.measure(LoaderSettings(), kind="baseline")
            self._check_baseline(self.baseline)
            if self.options.timeout_s is None:
                self.timeout_s = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * self.baseline["wall_s"])
            self.axes = self._axes()
            self.progress("axes", {"axes": self.axes, "grid": grid(self.axes)})
            if self.options.single:
                self.measure_config(self._requested_single())
            elif self.options.search == "grid":
                for config in grid(self.axes):
                    self.measure_config(config)
            else:
                self._adaptive()
            self._repeat()
            if self.options.ceiling:
                best = self.best() or self.baseline
                ceiling = latest_ceiling(self.entries)
                if ceiling is None or settings_of(ceiling).batch_size != \
                        settings_of(best).batch_size:
                    self.measure(settings_of(best), kind="ceiling", mode="ceiling")
        finally:
            if self.coordinator is not None:
                self.coordinator.finish(self.launches)
            if previous is not None:
                signal.signal(signal.SIGHUP, previous)
        return self.entries

    def _repeat(self) -> None:
        """Measure the recommended configuration again in fresh launches (kind ``repeat``),
        until ``options.repeat`` successful launches of it exist.

        Repeats never choose anything (the rules read baseline and sweep probes only): they
        show how much whole launches of one configuration differ, which the gate needs.
        """
        best = self.best() or self.baseline
        if self.options.repeat <= 1 or best is None or best["status"] != "ok":
            return
        config = settings_of(best)
        for _ in range(self.options.repeat - len(self.launches_of(config))):
            entry = self.measure(config, kind="repeat")
            if entry["status"] != "ok":
                break  # a crash or an OOM would only repeat itself

    def launches_of(self, config: LoaderSettings) -> list[dict[str, Any]]:
        """The successful, non-ceiling measurements of exactly ``config``."""
        return [e for e in self.entries if e.get("kind") != "ceiling" and e["status"] == "ok"
                and normalise(settings_of(e)) == normalise(config)]

    def _reap_inflight(self) -> None:
        """Kill what a killed harness left running, before anything else starts."""
        inflight = self.run_dir.inflight()
        if inflight and inflight.get("tag"):
            kill_tagged(str(inflight["tag"]))
        self.run_dir.clear_inflight()

    def _check_baseline(self, entry: dict[str, Any]) -> None:
        if entry["status"] == "ok":
            return
        if entry.get("reason") == "no_dataloader":
            raise NoDataLoader(f"{self.spec.script} finished without iterating a DataLoader; "
                               f"nothing to measure")
        if entry["status"] == "timeout":
            raise ProbeTimeout(f"the script's own settings did not finish a probe: "
                               f"{entry.get('error')}")
        raise ScriptFailed(f"the script failed with its own settings: {entry.get('error')}")

    def _axes(self) -> Axes:
        assert self.baseline is not None
        contexts = self._baseline_context()
        own = LoaderSettings.from_dict(self.baseline.get("config"))
        return resolve_axes(self.space, own, contexts.get("device", "cpu"),
                            int(contexts.get("cpus_available") or cpus_available()),
                            int(self.baseline.get("ranks_per_host") or self.spec.nproc_per_node))

    def _baseline_context(self) -> dict[str, Any]:
        from ddp_profile.profiler.store.results import read_probe_dir

        for data in read_probe_dir(self.run_dir.probe_dir(self.baseline["id"])):
            if data.context:
                return data.context
        return {}

    def _requested_single(self) -> LoaderSettings:
        first = lambda values: values[0] if values else None  # noqa: E731
        return LoaderSettings(first(self.space.num_workers), first(self.space.pin_memory),
                              first(self.space.prefetch_factor), first(self.space.batch_size)
                              ).merged_over(settings_of(self.baseline))

    # ---- choosing -------------------------------------------------------------------------
    def ok_entries(self) -> list[dict[str, Any]]:
        return [e for e in self.entries if e.get("status") == "ok" and e.get("kind") in
                ("baseline", "sweep") and e.get("throughput")]

    def best(self) -> Optional[dict[str, Any]]:
        return choose_best(self.ok_entries(), self._baseline_batch())

    def _baseline_batch(self) -> Optional[int]:
        return (self.baseline or {}).get("config", {}).get("batch_size")

    def _better(self, candidate: dict[str, Any], incumbent: Optional[dict[str, Any]]) -> bool:
        if candidate.get("status") != "ok" or not candidate.get("throughput"):
            return False
        if incumbent is None:
            return True
        return candidate["throughput"] > incumbent["throughput"] * (1 + tie_tolerance(
            candidate, incumbent))

    def _adaptive(self) -> None:
        """Two screens, then the batch sizes. The first screen runs the whole worker ladder
        (and the ceiling) in one launch; the second confirms the best screened configuration
        in a fresh launch and, in the same launch, tries its prefetch and pinning variants.
        A baseline that hardly waits for data gets no ladder, only its pinning variants.
        Batch sizes need launches of their own. A loader that cannot be rebuilt falls back to
        climbing the ladder with one probe per configuration."""
        assert self.axes is not None and self.baseline is not None
        own = settings_of(self.baseline)
        start = LoaderSettings(None, own.pin_memory if own.pin_memory is not None else False,
                               min(self.axes.prefetch_factor), own.batch_size)
        if waits_for_data(self.baseline):
            configs = [normalise(replace(start, num_workers=w)) for w in self.axes.num_workers]
        else:  # loading settings cannot win back more than the little time spent waiting
            configs = [normalise(replace(own, pin_memory=v)) for v in self.axes.pin_memory]
        windows = [Window(c) for c in configs if self.find(c) is None]
        if self.options.ceiling:
            windows.append(Window(windows[-1].config if windows else normalise(own),
                                  "ceiling", "ceiling"))
        self.measure_screen(windows)
        if self.screen_unsupported:
            self.progress("note", {"text": "the DataLoader cannot be rebuilt in place "
                                           f"({self.screen_unsupported}): one probe each"})
            best = self._climb_workers(start, list(self.axes.num_workers))
            for axis in ("prefetch_factor", "pin_memory"):
                best = self._try_axis(best, axis) if best is not None else None
        else:
            best = self.best()
            if best is not None:
                self.measure_screen(self._second_screen(best))
                best = self.best()
        if best is not None:
            self._try_axis(best, "batch_size")

    def _second_screen(self, best: dict[str, Any]) -> list[Window]:
        """A fresh measurement of a screened best, then its prefetch and pinning variants."""
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
        return [Window(c) for c in unique]

    def _climb_workers(self, start: LoaderSettings, ladder: list[int]
                       ) -> Optional[dict[str, Any]]:
        """Hill-climb the worker ladder from the rung the baseline predicts.

        Down while a cheaper rung is at least as fast (within noise), else up while a rung is
        faster beyond noise (one rung of patience) and the loop still waits for data.
        """
        def at(index: int) -> dict[str, Any]:
            return self.measure_config(normalise(replace(start, num_workers=ladder[index])))

        index = predicted_rung(self.baseline, ladder)
        best, best_index = at(index), index
        if best.get("status") != "ok":
            best, best_index = None, -1
        for lower in range(index - 1, -1, -1):
            entry = at(lower)
            if best is not None and not self._not_worse(entry, best):
                break
            if entry.get("status") == "ok":
                best, best_index = entry, lower
        if best is not None and best_index < index:
            return best  # a cheaper rung did as well: going up will not pay
        misses = 0
        for upper in range(index + 1, len(ladder)):
            if best is not None and not waits_for_data(best):
                break  # no data wait left for more workers to hide
            entry = at(upper)
            if self._better(entry, best):
                best, misses = entry, 0
            elif entry.get("status") == "ok":
                misses += 1
                if misses > CLIMB_PATIENCE:
                    break
        return best

    def _not_worse(self, candidate: dict[str, Any], incumbent: dict[str, Any]) -> bool:
        if candidate.get("status") != "ok" or not candidate.get("throughput"):
            return False
        return candidate["throughput"] >= incumbent["throughput"] * (1 - tie_tolerance(
            candidate, incumbent))

    def _try_axis(self, best: dict[str, Any], axis: str) -> dict[str, Any]:
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
            if self._better(entry, best):
                best = entry
            elif axis == "batch_size" and entry.get("status") == "oom":
                break
        return best


def predicted_rung(baseline: Optional[dict[str, Any]], ladder: list[int]) -> int:
    """The worker-ladder rung the baseline's own measurement points at.

    A data-bound loop consumes one batch per step time T, of which (1 - f) is compute (f the
    data-wait share); ``w`` workers each deliver a batch every L = T * max(w, 1). Enough
    workers to keep up: L / ((1 - f) T) = max(w, 1) / (1 - f). Not data-bound: stay put.
    """
    if not baseline or baseline.get("status") != "ok":
        return 0
    workers = (baseline.get("config") or {}).get("num_workers") or 0
    fraction = baseline.get("data_wait_fraction")
    needed = workers
    if fraction is not None and fraction >= SETTLED_DATA_WAIT:
        needed = math.ceil(max(workers, 1) / max(1.0 - fraction, 0.05))
    for index, rung in enumerate(ladder):
        if rung >= needed:
            return index
    return len(ladder) - 1


def waits_for_data(entry: dict[str, Any]) -> bool:
    """Whether a probe's ranks still wait for data for a measurable share of each step."""
    fraction = entry.get("data_wait_fraction")
    return fraction is None or fraction >= SETTLED_DATA_WAIT


def merge_outcomes(leader: LaunchOutcome, followers: list[dict[str, Any]]) -> LaunchOutcome:
    """One outcome for a probe that ran on several nodes: any timeout, the first failure."""
    returncode = leader.returncode
    timed_out = leader.timed_out
    for follower in followers:
        if follower.get("missing"):
            returncode = returncode or 1
            continue
        timed_out = timed_out or bool(follower.get("timed_out"))
        if not returncode and follower.get("returncode"):
            returncode = follower["returncode"]
    return replace(leader, returncode=returncode, timed_out=timed_out)


def follow(coordinator: Coordinator, spec: LaunchSpec, run_dir: RunDir,
           local_rank_flag: Optional[str] = None) -> int:
    """A follower's whole sweep: launch what the leader publishes, upload the records."""
    index = 0
    while True:
        message = coordinator.next_plan(index)
        if message.get("done"):
            return index
        plan = ProbePlan.from_json(message["plan"])
        plan = replace(plan, out_dir=run_dir.probe_dir(plan.probe_id),
                       inject_local_rank=local_rank_flag)
        run_dir.discard_partial_probe(plan.probe_id)
        outcome = launch(spec, plan, float(message["timeout_s"]))
        coordinator.upload(index, plan.out_dir, {"returncode": outcome.returncode,
                                                 "timed_out": outcome.timed_out,
                                                 "wall_s": outcome.wall_s})
        index += 1


def relative_se(entry: dict[str, Any]) -> float:
    """Relative standard error of a probe's throughput: by batch means when recorded, else
    from the per-step coefficient of variation."""
    if entry.get("throughput_rse") is not None:
        return float(entry["throughput_rse"])
    cv = entry.get("step_time_cv") or 0.0
    return cv / math.sqrt(max(1, entry.get("steps_measured") or 1))


def tie_tolerance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Relative throughput difference that counts as noise between two probes: twice their
    combined relative standard error, at least 2 %."""
    return max(MIN_TIE_TOLERANCE, 2.0 * math.hypot(relative_se(a), relative_se(b)))


def choose_best(entries: list[dict[str, Any]], baseline_batch: Optional[int]
                ) -> Optional[dict[str, Any]]:
    """Highest throughput; among those within noise of it, the cheapest configuration."""
    if not entries:
        return None
    top = max(entries, key=lambda e: e["throughput"])
    ties = [e for e in entries
            if e["throughput"] >= top["throughput"] * (1 - tie_tolerance(e, top))]
    return min(ties, key=lambda e: (cost_key(settings_of(e), baseline_batch), -e["throughput"]))
