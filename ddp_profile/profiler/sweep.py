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
import os
import signal
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from ddp_profile.errors import NoDataLoader, ProbeTimeout, ScriptFailed
from ddp_profile.profiler.config import LoaderSettings, ProbePlan
from ddp_profile.profiler.coordinate import Coordinator
from ddp_profile.profiler.launch import LaunchOutcome, LaunchSpec, kill_tagged, launch, new_tag
from ddp_profile.profiler.probe import summarise_probe
from ddp_profile.profiler.rundir import RunDir
from ddp_profile.profiler.space import Axes, SearchSpace, cost_key, grid, normalise, resolve_axes

DEFAULT_FIRST_TIMEOUT_S = 600.0
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 4.0
FOLLOWER_GRACE_S = 120.0  # how long the leader waits for a follower's records after its own
UNSTABLE_RSE = 0.05  # a probe whose throughput is this uncertain is measured again, longer
MIN_TIE_TOLERANCE = 0.02
SETTLED_DATA_WAIT = 0.05
CLIMB_PATIENCE = 1  # rungs of the worker ladder tried past one that did not pay (noise)  # below this share of waiting, loading settings cannot help more


@dataclass(frozen=True)
class SweepOptions:
    search: str = "adaptive"  # grid | adaptive
    steps: int = 30
    warmup: int = 5
    timeout_s: Optional[float] = None
    ceiling: bool = True
    single: bool = False  # measure the requested settings only (no search)


ProgressFn = Callable[[str, dict[str, Any]], None]


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

    # ---- measuring ------------------------------------------------------------------------
    def measure(self, requested: LoaderSettings, kind: str = "sweep", steps: Optional[int] = None,
                mode: str = "normal") -> dict[str, Any]:
        probe_id = f"p{len(self.entries):03d}"
        steps = steps or self.options.steps
        done = next((e for e in self.ledger if e.get("id") == probe_id), None)
        if done is not None and done.get("requested") == requested.to_dict() \
                and done.get("kind") == kind and done.get("steps") == steps:
            self.entries.append(done)
            self.progress("reused", {"entry": done})
            return done
        self.run_dir.discard_partial_probe(probe_id)
        plan = ProbePlan(probe_id=probe_id, out_dir=self.run_dir.probe_dir(probe_id),
                         overrides=requested, warmup=self.options.warmup, steps=steps, mode=mode,
                         inject_local_rank=self.spec_local_rank_flag(),
                         rdzv_id=f"{self.run_token}-{probe_id}")
        self.progress("start", {"probe_id": probe_id, "config": requested, "kind": kind})
        tag = new_tag()
        self.run_dir.mark_inflight(probe_id, tag)
        if self.coordinator is not None:
            self.coordinator.publish(self.launches, {"plan": plan.to_json(),
                                                     "timeout_s": self.timeout_s})
        outcome = launch(self.spec, plan, self.timeout_s, tag=tag)
        if self.coordinator is not None:
            outcome = merge_outcomes(outcome, self.coordinator.gather(
                self.launches, plan.out_dir, self.timeout_s + FOLLOWER_GRACE_S))
        self.launches += 1
        entry = summarise_probe(plan, outcome, kind, self.timeout_s)
        self.run_dir.append(entry)
        self.run_dir.clear_inflight()
        self.entries.append(entry)
        self.progress("done", {"entry": entry})
        return entry

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
            if self.options.ceiling:
                best = self.best() or self.baseline
                self.measure(settings_of(best), kind="ceiling", mode="ceiling")
        finally:
            if self.coordinator is not None:
                self.coordinator.finish(self.launches)
            if previous is not None:
                signal.signal(signal.SIGHUP, previous)
        return self.entries

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
                            int(contexts.get("cpus_available") or os.cpu_count() or 1),
                            self.spec.nproc_per_node)

    def _baseline_context(self) -> dict[str, Any]:
        from ddp_profile.profiler.results import read_probe_dir

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
        assert self.axes is not None and self.baseline is not None
        own = settings_of(self.baseline)
        start = LoaderSettings(None, own.pin_memory if own.pin_memory is not None else False,
                               min(self.axes.prefetch_factor), own.batch_size)
        best = self._climb_workers(start, list(self.axes.num_workers))
        if best is None:
            return
        for axis in ("prefetch_factor", "pin_memory", "batch_size"):
            best = self._try_axis(best, axis)

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
