"""The real measurer of the search, ``LedgerMeasurer`` (the protocol: ``sweep.state.Measurer``).

The search (``profiler.sweep.search``) decides *what* to measure; a measurer turns a
configuration into a probe record (``store.probes.ProbeRecord`` of its ledger line: id, kind,
status, config, throughput, data_wait_fraction, throughput_rse, ...). ``LedgerMeasurer``
launches the user's script for each probe (or one launch for a screen of several
configurations, ``profiler.sweep.screen``) and first looks in the ledger: a resumed run
replays the same deterministic decisions and re-uses every probe that already finished, so
``--resume`` neither re-runs nor loses a probe. Tests inject a modelled measurer instead.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Optional

from ddp_profile.errors import BadRunDir
from ddp_profile.profiler.cache import (
    AS_IS,
    FITS_SHARE,
    CacheMode,
    Regime,
    chill,
    decide,
    misses_are_new_files,
    out_of_regime,
    recorded_files,
    warm,
)
from ddp_profile.profiler.decide.worker_restarts import run_steps
from ddp_profile.profiler.launch.coordinate import Coordinator, merge_outcomes
from ddp_profile.profiler.launch.ranks import (
    LaunchOutcome,
    LaunchSpec,
    kill_tagged,
    launch,
    new_tag,
)
from ddp_profile.profiler.settings import (
    LoaderSettings,
    Mode,
    ProbePlan,
    burst_steps,
    capped,
    warmup_room,
    window_warmup,
)
from ddp_profile.profiler.store.probedir import RankData, read_probe_dir
from ddp_profile.profiler.store.probes import Kind, ProbeRecord, set_aside
from ddp_profile.profiler.store.rundir import RunDir
from ddp_profile.profiler.sweep.climb import watched
from ddp_profile.profiler.sweep.probe import ScreenLaunch, summarise_probe
from ddp_profile.profiler.sweep.screen import split_screen
from ddp_profile.profiler.sweep.space import Axes
from ddp_profile.profiler.sweep.state import Budget, Condemned, ProgressFn, Window, no_progress

DEFAULT_FIRST_TIMEOUT_S = 600.0
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 4.0
FOLLOWER_GRACE_S = 120.0  # how long the leader waits for a follower's records after its own
MIN_WINDOW_TIMEOUT_S = 30.0

class LedgerMeasurer:
    """The real measurer: launches probes, appends them to the ledger, re-uses finished ones."""

    def __init__(self, run_dir: RunDir, spec: LaunchSpec, steps: int, warmup: int,
                 timeout_s: Optional[float] = None, progress: ProgressFn = no_progress,
                 coordinator: Optional[Coordinator] = None, cache: str = CacheMode.AUTO):
        self.run_dir, self.spec, self.steps, self.warmup = run_dir, spec, steps, warmup
        self.fixed_timeout = timeout_s is not None
        self.timeout_s = timeout_s or DEFAULT_FIRST_TIMEOUT_S
        self.progress = progress
        self.coordinator = coordinator  # set on the leader of a multi-node or allocation run
        self.launches = 0  # probes launched by this process (the coordinated probe index)
        self.run_token = new_tag()[:12]
        self.ledger = run_dir.ledger()
        self.entries: list[ProbeRecord] = []
        self.screen_unsupported: Optional[str] = None
        self.stopped_screen: Optional[str] = None  # the last screen launch stopped while it ran
        self.window_loop_s = 0.0  # estimated seconds of one screen window's loop
        # the page cache's state for every launch (``profiler.cache``): asked for cold, from the
        # first launch on; else decided after the baseline (``settle_cache``)
        cold = Regime(CacheMode.COLD, CacheMode.COLD, f"--cache {CacheMode.COLD}")
        self.regime: Regime = cold if cache == CacheMode.COLD else AS_IS
        self.files: dict[str, None] = {}  # every file the producers read so far, in order
        self.warmed: list[dict[str, Any]] = []  # what warming the cache read, per launch
        # a probe measured again read out of the regime again: this machine does not hold it
        # (a memory limit below MemAvailable, a reclaim daemon), and no probe is measured
        # again from then on (each would cost two launches for nothing); the reason, or None
        self.regime_unheld: Optional[str] = None
        self.budget = Budget()  # the run's time (``--budget``), and its launches' walls
        self._ranks: dict[str, list[RankData]] = {}  # each probe's rank records, read once

    def rank_data(self, probe_id: str) -> list[RankData]:
        """A finished probe's (or launch's) rank records, read once for every reader."""
        if probe_id not in self._ranks:
            self._ranks[probe_id] = read_probe_dir(self.run_dir.probe_dir(probe_id))
        return self._ranks[probe_id]

    def _discard(self, probe_id: str) -> None:  # a launch that never finished: moved aside
        self._ranks.pop(probe_id, None)
        self.run_dir.discard_partial_probe(probe_id)

    def measure(self, window: Window) -> ProbeRecord:
        entry = self._probe(window)
        if not self._out_of_regime(entry):
            return entry
        before = list(self.files)
        entry = self._probe(window)  # measured again in the regime; once more where what it
        # missed was files no launch before it had read (``cache.misses_are_new_files``)
        if self.regime.warm and out_of_regime(self.regime, entry) and entry.ok \
                and misses_are_new_files(entry, self.run_dir.probe_dir(entry.id), before) \
                and self._out_of_regime(entry):
            entry = self._probe(window)
        return self._held(entry)

    def _held(self, entry: ProbeRecord) -> ProbeRecord:
        """``entry``, measured again because the first read out of the regime; where it read
        out of it again, the regime is not held here (``regime_unheld``), said once."""
        if self.regime_unheld is None and entry.ok and out_of_regime(self.regime, entry):
            share = entry.loading.storage_share if entry.loading is not None else None
            self.regime_unheld = (f"{entry.id}, measured again, read {share:.0%} of its "
                                  f"bytes from storage again: this machine does not hold the "
                                  f"{self.regime.mode} regime")
            self.progress("note", {"text": f"{self.regime_unheld}; no probe is measured again"})
        return entry

    def _probe(self, window: Window) -> ProbeRecord:
        """One launch of one configuration (or its finished entry of a resumed run)."""
        probe_id = f"p{len(self.entries):03d}"
        steps = window.steps or self.steps
        done = self._finished(probe_id, window.config, window.kind, steps, screened=False)
        if done is not None and (done.threads != window.threads
                                 or done.comm.options != window.ddp
                                 or done.persistent_workers != window.persistent_workers):
            done = None
        if done is not None:
            return self._record(done, reused=True)
        self._refuse_diverged(probe_id, window)
        self.budget.room_for(1, f"{window.kind} {window.config.label()}", self)
        self._discard(probe_id)
        room = self.warmup_room(window.config)
        plan = ProbePlan(probe_id=probe_id, out_dir=self.run_dir.probe_dir(probe_id),
                         overrides=window.config, steps=steps, warmup_cap=room,
                         warmup=capped(window.warmup or self.warmup, room),
                         mode=window.mode, inject_local_rank=self.local_rank_flag(),
                         rdzv_id=f"{self.run_token}-{probe_id}", threads=window.threads,
                         steps_per_s=window.steps_per_s, ddp=window.ddp, cache=self.plan_cache,
                         persistent_workers=window.persistent_workers)
        self.progress("start", {"probe_id": probe_id, "config": window.config,
                                "kind": window.kind})
        outcome = self._launch(plan, self.timeout_s)
        return self._record(summarise_probe(plan, outcome, window.kind, self.timeout_s,
                                            ranks=self.rank_data(probe_id), pair=window.pair))

    def _finished(self, probe_id: str, requested: LoaderSettings, kind: Kind, steps: int,
                  screened: bool) -> Optional[ProbeRecord]:
        """The probe of a resumed run's ledger that measured exactly this, if any."""
        line = self._ledger_line(probe_id)
        done = ProbeRecord.from_json(line) if line is not None else None
        if done is None or done.requested != requested \
                or (done.cache.measured_as if done.cache is not None else done.kind) != kind \
                or done.steps_asked != steps or done.screened != screened:
            return None
        return done

    def _launch(self, plan: ProbePlan, timeout_s: float,
                watch: Optional[Callable[[], bool]] = None) -> LaunchOutcome:
        """Launch one probe (on every node of a coordinated run) and wait for its records."""
        if self.regime.warm and self.files:
            budget = FITS_SHARE * self.regime.memory_available \
                if self.regime.memory_available else None
            self.warmed.append({"probe_id": plan.probe_id, **warm(self.files, budget)})
        elif self.regime.cold and self.files:
            chill(self.files)  # what earlier probes read and a producer could not drop
        tag = new_tag()
        self.run_dir.mark_inflight(plan.probe_id, tag)
        if self.coordinator is not None:
            self.coordinator.publish(self.launches, {"plan": plan.to_json(),
                                                     "timeout_s": timeout_s})
        begun = time.monotonic()
        outcome = launch(self.spec, plan, timeout_s, tag=tag,
                         watch=watch if self.coordinator is None else None)
        self.budget.timed(time.monotonic() - begun, len(plan.windows))
        if self.coordinator is not None:
            outcome = merge_outcomes(outcome, self.coordinator.gather(
                self.launches, plan.out_dir, timeout_s + FOLLOWER_GRACE_S))
        self.launches += 1
        self.files.update(dict.fromkeys(recorded_files(plan.out_dir)))
        return outcome

    @property
    def plan_cache(self) -> Optional[str]:
        return CacheMode.COLD if self.regime.cold else None

    def settle_cache(self, baseline: ProbeRecord, requested: str) -> ProbeRecord:
        from ddp_profile.profiler.rank.facts import memory_available

        loader = self.context(baseline).get("loader") or {}
        self.regime = decide(requested, baseline, loader.get("dataset_len"), memory_available())
        self.progress("note", {"text": f"page cache: {self.regime.mode} ({self.regime.reason})"})
        if not self._out_of_regime(baseline):
            return baseline
        return self.measure(Window(LoaderSettings(), Kind.BASELINE))

    def _out_of_regime(self, entry: ProbeRecord) -> bool:
        """Whether ``entry`` read its data in another page-cache state than the run's regime
        (``cache.out_of_regime``); if so it is set aside as kind ``cache`` (by an appended
        ledger line, ``measured_as`` its own kind), for the caller to measure it again. An
        entry a resumed run set aside already is one too."""
        if entry.cache is not None:
            return True
        if self.regime_unheld is not None or not entry.ok \
                or not out_of_regime(self.regime, entry):
            return False
        share = entry.loading.storage_share if entry.loading is not None else None
        self.progress("note", {"text": f"{entry.id} ({entry.kind}) read {share:.0%} "
                                       f"of its bytes from storage, out of the "
                                       f"{self.regime.mode} regime: measured again in it"})
        self.amend(entry, set_aside(entry, self.regime.mode, share))
        return True

    def amend(self, entry: ProbeRecord, fields: dict[str, Any]) -> ProbeRecord:
        """A recorded entry corrected: an appended ledger line, and the amended record in
        its place among the entries."""
        amended = entry.amended(fields)
        self.entries[:] = [amended if e is entry else e for e in self.entries]
        self.run_dir.amend(entry.id, fields)
        return amended

    def _record(self, record: ProbeRecord, reused: bool = False) -> ProbeRecord:
        """A measured probe among the entries (its line appended to the ledger unless a
        resumed run's)."""
        if not reused:
            self.run_dir.append(record.to_json())
            self.run_dir.clear_inflight()
        self.entries.append(record)
        self.progress("reused" if reused else "done", {"entry": record})
        return record

    def measure_screen(self, windows: list[Window],
                       condemned: Optional[Condemned] = None) -> list[ProbeRecord]:
        """Measure several configurations in as few launches as possible (see
        ``profiler.sweep.screen``): one launch runs them one after another; when it stops
        early (a crash, an OOM, a hang, the script's end), the window it stopped in is
        recorded as that failure and the windows after it get a launch of their own, less
        those ``condemned(measured so far, window)`` by what the screen measured. Each window
        becomes a ledger entry with ``screened`` true. Sets ``screen_unsupported`` when the
        loader cannot be rebuilt."""
        if any(w.persistent_workers or w.warmup for w in windows):
            raise ValueError("persistent_workers and a warm-up of its own need a launch of "
                             "their own")
        done: list[ProbeRecord] = []
        ran: list[Window] = []
        pending = list(windows)
        while pending and not self.screen_unsupported:
            if condemned is not None and done:
                dropped = [w for w in pending if condemned(done, w)]
                pending = [w for w in pending if w not in dropped]
                if dropped:
                    condemned.skip(dropped, self.stopped_screen)
                    self.stopped_screen = None
                if not pending:
                    break
            first = len(self.entries)
            ids = [f"p{first + i:03d}" for i in range(len(pending))]
            reused = self._reuse_screened(pending, ids)
            done += reused
            ran += pending[:len(reused)]
            pending, ids = pending[len(reused):], ids[len(reused):]
            if not pending:
                break
            consumed = self._screen_launch(pending, ids, done, condemned)
            if consumed == 0:
                break
            ran += pending[:consumed]
            pending = pending[consumed:]
        return [self._in_regime(entry, window) for entry, window in zip(done, ran)]

    def _in_regime(self, entry: ProbeRecord, window: Window) -> ProbeRecord:
        """A screened window, or its configuration measured again in a launch of its own where
        the window read out of the run's page-cache regime."""
        if not self._out_of_regime(entry):
            return entry
        return self._held(self._probe(window))

    def _screen_launch(self, pending: list[Window], ids: list[str], done: list[ProbeRecord],
                       condemned: Optional[Condemned] = None) -> int:
        """One launch running ``pending``; the windows it finished (or failed in) are appended
        to ``done``; returns how many. Stopped early where the windows it finished condemn
        every one it has left (``watched``): the window it stopped in is not recorded."""
        launch_id = f"{ids[0]}-screen"
        self.budget.room_for(len(pending), f"a screen of {len(pending)} window(s) from "
                             f"{pending[0].config.label()}", self)
        for probe_id in (launch_id, *ids):
            self._discard(probe_id)
        plan = ProbePlan(
            probe_id=launch_id, out_dir=self.run_dir.probe_dir(launch_id),
            overrides=pending[0].config, warmup=self.warmup, steps=self.steps, mode=Mode.SCREEN,
            windows=tuple(self._window_spec(w) for w in pending),
            inject_local_rank=self.local_rank_flag(), rdzv_id=f"{self.run_token}-{launch_id}",
            cache=self.plan_cache)
        timeout_s = self.screen_timeout(len(pending))
        self.progress("start", {"probe_id": launch_id, "config": pending[0].config,
                                "kind": Mode.SCREEN, "windows": len(pending)})
        outcome = self._launch(plan, timeout_s, watched(plan, pending, done, condemned))
        self.stopped_screen = launch_id if outcome.stopped else None  # said with its windows
        splits = split_screen(plan.out_dir, [self.run_dir.probe_dir(i) for i in ids],
                              plan.window_starts(), plan.window_lengths())
        consumed = 0
        for index, (split, window, probe_id) in enumerate(zip(splits, pending, ids)):
            if split.unsupported is not None:
                self.screen_unsupported = split.unsupported
                break
            if not split.complete and (outcome.stopped or not split.started and consumed):
                break  # the launch stopped in an earlier window, or was stopped in this one
            window_outcome = outcome if not split.complete else replace(
                outcome, returncode=0, timed_out=False, wall_s=split.span_s)
            window_plan = ProbePlan(probe_id=probe_id, out_dir=self.run_dir.probe_dir(probe_id),
                                    overrides=window.config, warmup=plan.window_warmup(index),
                                    steps=window.steps or self.steps, mode=window.mode,
                                    ddp=window.ddp, threads=window.threads)
            entry = summarise_probe(window_plan, window_outcome, window.kind, timeout_s,
                                    ranks=self.rank_data(probe_id), pair=window.pair,
                                    screen=ScreenLaunch(launch_id, outcome.wall_s,
                                                        partial(self.rank_data, launch_id)))
            if entry.reason == "too_few_steps" and consumed:
                break  # the script ended in its warm-up: the next launch starts with it
            done.append(self._record(entry))
            consumed += 1
            if not split.complete:
                break
        if consumed < len(pending) and outcome.returncode == 0 and not outcome.stopped:
            self.progress("note", {"text": f"{launch_id}: the script ended after {consumed} "
                                           f"of {len(pending)} windows, the rest go on next"})
        self.run_dir.clear_inflight()
        return consumed

    def _window_spec(self, window: Window) -> dict[str, Any]:
        """A screen window as its launch's plan has it."""
        return {"overrides": window.config.to_dict(), "mode": window.mode,
                "warmup": window_warmup(self.warmup, window.config, window.mode,
                                        self.warmup_room(window.config)),
                **({"ddp": dict(window.ddp)} if window.ddp is not None else {}),
                **({"threads": window.threads} if window.threads is not None else {}),
                "steps": burst_steps(window.steps or self.steps, window.config.num_workers,
                                     window.mode, window.steps_per_s)}

    def screen_steps(self, windows: list[Window]) -> int:
        return sum(spec["warmup"] + spec["steps"] for spec in map(self._window_spec, windows))

    def screen_launches(self, windows: list[Window]) -> Optional[list[int]]:
        """How many of ``windows`` each launch of a screen is predicted to hold, by the steps
        a launch that ran the script to its end made (``run_steps``; None where none did): a
        window whose warm-up the run cannot hold starts the next launch."""
        counts, used = [0], 0
        for window in windows:
            spec = self._window_spec(window)
            run = run_steps(self.entries, window.config.batch_size)
            if run is None:
                return None
            if counts[-1] and used + spec["warmup"] >= run:
                counts, used = [*counts, 0], 0
            counts[-1] += 1
            used += spec["warmup"] + spec["steps"]
        return counts

    def launch_estimate_s(self, windows: int = 1) -> Optional[float]:
        return self.budget.estimate_s(windows, self.entries)

    def warmup_room(self, config: LoaderSettings) -> Optional[int]:
        """A launch's most warm-up steps where one ran the script to its end."""
        return warmup_room(run_steps(self.entries, config.batch_size), self.steps)

    def _reuse_screened(self, pending: list[Window], ids: list[str]) -> list[ProbeRecord]:
        """The leading windows a resumed run already measured (same ids, same requests)."""
        reused = []
        for window, probe_id in zip(pending, ids):
            entry = self._finished(probe_id, window.config, window.kind,
                                   window.steps or self.steps, screened=True)
            if entry is None or entry.comm.options != window.ddp \
                    or entry.threads != window.threads:
                self._refuse_diverged(probe_id, window)
                break
            reused.append(self._record(entry, reused=True))
        return reused

    def _ledger_line(self, probe_id: str) -> Optional[dict[str, Any]]:
        """A resumed run's ledger line of ``probe_id``, if it holds one."""
        return next((e for e in self.ledger if e.get("id") == probe_id), None)

    def _refuse_diverged(self, probe_id: str, window: Window) -> None:
        """A resumed run whose search asks, under an id its ledger holds, for something
        other than what that probe measured (another version of the tool, or other options):
        measured again under the same id, the ledger would hold two probes of one id, and an
        alternation would pair launches made apart in time. Refused in one line, the run
        directory left as it is."""
        line = self._ledger_line(probe_id)
        if line is None:
            return
        held = ProbeRecord.from_json(line)
        raise BadRunDir(
            f"{self.run_dir.path}: its probe {probe_id} measured {held.kind} "
            f"{held.requested.label()}, and the search now asks for {window.kind} "
            f"{window.config.label()} there (a run made by another version of ddp-profile, "
            "or with other options): finish it with that version, or start a new run with "
            "another --out; nothing in it was changed")

    def calibrate(self, baseline: ProbeRecord, axes: Axes) -> None:
        """Size the timeouts from the baseline: a probe gets ``TIMEOUT_FACTOR`` times the
        baseline's wall time (unless ``--timeout`` was given), a screen window its loop's."""
        if not self.fixed_timeout:
            self.timeout_s = max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * (baseline.wall_s or 0.0))
        medians = [r.step_time_median_s or 0.0 for r in baseline.ranks]
        workers = max(axes.num_workers)
        self.window_loop_s = max(medians, default=0.0) * (
            max(self.warmup, workers * max(axes.prefetch_factor))
            + burst_steps(self.steps, workers))
        self.window_loop_s += baseline.time_to_first_batch_s or 0.0
        self.budget.window_s = max(medians, default=0.0) * (self.warmup + self.steps) \
            + (baseline.time_to_first_batch_s or 0.0)  # a typical window, for the budget

    def screen_timeout(self, windows: int) -> float:
        """The first window gets a probe's timeout; each further one what its steps and a
        new set of workers take, four times over, and at least ``MIN_WINDOW_TIMEOUT_S``."""
        per_window = max(MIN_WINDOW_TIMEOUT_S, TIMEOUT_FACTOR * self.window_loop_s)
        return self.timeout_s + (windows - 1) * per_window

    def context(self, entry: ProbeRecord) -> dict[str, Any]:
        for data in self.rank_data(entry.id):
            if data.context:
                return data.context
        return {}

    def local_rank_flag(self) -> Optional[str]:
        return dict(self.spec.extra_env).get("DDP_PROFILE_LOCAL_RANK_FLAG")

    def reap_inflight(self) -> None:
        """Kill what a killed harness left running, before anything else starts."""
        inflight = self.run_dir.inflight()
        if inflight and inflight.get("tag"):
            kill_tagged(str(inflight["tag"]))
        self.run_dir.clear_inflight()
