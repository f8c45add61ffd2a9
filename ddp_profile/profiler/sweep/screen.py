"""Split the records of a screen (one launch, several loader configurations) into probes.

A screen's ranks write one record file each, in which the training loader's step records carry
their ``window`` (see ``rank.instrument``). ``split_screen`` writes, for each window, an
ordinary probe directory that holds exactly what a separate probe of that configuration would
have recorded, so everything downstream reads it unchanged (pure file work, no torch):

* the training loader's steps of the window, renumbered from 0, and their GPU step timings;
* records with a time (telemetry samples, events during training, errors) whose time falls in
  the window, per rank: from the window's first step to the next window's first step;
* the set-up facts (context, loader records, DDP options, events before training) in every
  window, with the training loader's ``applied`` settings and the context's intra-op threads
  replaced by the window's own (its switch's ``window`` event);
* an ``end`` record: "steps_done" for a window every rank finished, the rank's real end (or
  none) for the window the launch stopped in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ddp_profile.profiler.settings import window_index
from ddp_profile.profiler.store.epochs import rank_step_stats
from ddp_profile.profiler.store.probedir import read_worker_dir
from ddp_profile.profiler.store.record import (
    ITERATOR_OUTLIVES_EPOCH,
    WORKER_DIR,
    dumps,
    rank_files,
    read_jsonl,
)

# Facts about the script, true for every window whenever they were recorded.
STATIC_EVENTS = frozenset({"ddp", "data_parallel", "process_group", "ddp_unused_parameters",
                           "gpu_status", "cuda_memory", ITERATOR_OUTLIVES_EPOCH})


@dataclass
class WindowSplit:
    """What one window of a screen holds after the split."""

    index: int
    out_dir: str
    complete: bool  # every rank recorded all of the window's steps
    started: bool  # some rank recorded a step of it
    unsupported: Optional[str] = None  # the loader could not be rebuilt for this window
    span_s: float = 0.0  # first step start to last step end, over the ranks


def _training_loader_id(records: list[dict[str, Any]]) -> Optional[int]:
    for record in records:
        if record.get("kind") == "end" and record.get("training_loader_id") is not None:
            return int(record["training_loader_id"])
    counts: dict[int, int] = {}
    for record in records:
        if record.get("kind") == "step" and record.get("window") is not None:
            counts[record["loader_id"]] = counts.get(record["loader_id"], 0) + 1
    return max(counts, key=counts.get) if counts else None


def _step_end_ns(step: dict[str, Any]) -> int:
    return int(step["t_ns"] + 1e9 * (step["data_wait_s"] + step["compute_s"] + step["other_s"]))


class _RankScreen:
    """One rank's records of a screen, indexed by window."""

    def __init__(self, records: list[dict[str, Any]], starts: list[int], lengths: list[int]):
        self.records = records
        self.starts, self.lengths = starts, lengths
        self.loader_id = _training_loader_id(records)
        self.rank = next((r.get("rank") for r in records if r.get("rank") is not None), None)
        self.steps: dict[int, list[dict[str, Any]]] = {}
        for record in records:
            if record.get("kind") == "step" and record.get("loader_id") == self.loader_id:
                self.steps.setdefault(self.window_of(int(record["step"])), []).append(record)
        self.applied: dict[int, dict[str, Any]] = {}
        self.switched: dict[int, int] = {}  # window -> wall clock of the switch into it
        self.threads: dict[int, int] = {}  # window -> torch's intra-op threads from its switch
        self.unsupported: dict[int, str] = {}
        for record in records:
            if record.get("kind") != "event":
                continue
            data = record.get("data") or {}
            if record.get("name") == "window":
                self.applied[int(data.get("window", -1))] = dict(data.get("applied") or {})
                self.switched[int(data.get("window", -1))] = int(
                    data.get("switched_ns") or record.get("t_ns") or 0)
                if data.get("threads"):
                    self.threads[int(data.get("window", -1))] = int(data["threads"])
            elif record.get("name") == "screen_unsupported":
                self.unsupported[int(data.get("window", -1))] = str(data.get("error"))

    def window_of(self, step: int) -> int:
        return window_index(self.starts, step)

    def start_ns(self, window: int) -> Optional[int]:
        steps = self.steps.get(window)
        return min(s["t_ns"] for s in steps) if steps else None

    def bounds(self, window: int) -> tuple[float, float]:
        """[start, end) in wall-clock ns: window 0 from the beginning, the last to the end."""
        low = float("-inf") if window == 0 else float(self.start_ns(window) or float("inf"))
        following = [self.start_ns(w) for w in self.steps if w > window]
        # a later window that failed before its first step still began at its switch: what
        # happened from then on (its workers' first batches, an error) is not this window's
        following += [t for w, t in self.switched.items() if w > window and t]
        following = [t for t in following if t is not None]
        return low, float(min(following)) if following else float("inf")

    def complete(self, window: int) -> bool:
        return len(self.steps.get(window, [])) >= self.lengths[window]

    def _context(self, record: dict[str, Any], window: int) -> dict[str, Any]:
        """The context as ``window`` ran: its intra-op threads those in force from its switch
        (window 0, and a run recorded before switches kept them: the context's own)."""
        context = {**record, "window": window}
        if window in self.threads:
            context["threads"] = {**(record.get("threads") or {}),
                                  "intra_op": self.threads[window]}
        return context

    def window_records(self, window: int, settings_applied: Optional[dict[str, Any]],
                       complete: bool) -> list[dict[str, Any]]:
        low, high = self.bounds(window)
        first_step = self.starts[window]
        out: list[dict[str, Any]] = []
        iter_index = 0
        for record in self.records:
            kind = record.get("kind")
            if kind == "step":
                if record.get("loader_id") == self.loader_id:
                    if self.window_of(int(record["step"])) == window:
                        out.append({**record, "step": int(record["step"]) - first_step})
                elif low <= record.get("t_ns", 0) < high:
                    out.append(record)
            elif kind == "gpu_step":
                if record.get("loader_id") != self.loader_id:
                    if low <= record.get("t_ns", low) < high:
                        out.append(record)
                elif self.window_of(int(record.get("step", -1))) == window:
                    out.append({**record, "step": int(record["step"]) - first_step})
            elif kind == "loader_iter":
                if record.get("loader_id") == self.loader_id:
                    if int(record.get("window") or 0) == window:
                        out.append({**record, "iter_index": iter_index})
                        iter_index += 1
                elif low <= record.get("t_ns", 0) < high:
                    out.append(record)
            elif kind == "loader":
                if record.get("loader_id") == self.loader_id and settings_applied:
                    applied = {**(record.get("applied") or {}), **{
                        k: v for k, v in settings_applied.items() if k != "batch_size"}}
                    out.append({**record, "applied": applied})
                else:
                    out.append(record)
            elif kind == "context":
                out.append(self._context(record, window))
            elif kind == "event" and record.get("name") in STATIC_EVENTS:
                out.append(record)
            elif kind == "end":
                if not complete:
                    out.append(record)
            elif kind in ("event", "sample", "error", "batch_cost", "pin_cost"):
                if low <= record.get("t_ns", 0) < high:
                    out.append(record)
            else:
                out.append(record)
        if complete:
            out.append({"kind": "end", "rank": self.rank, "reason": "steps_done",
                        "training_loader_id": self.loader_id,
                        "steps_recorded": self.lengths[window],
                        "t_ns": max(_step_end_ns(s) for s in self.steps[window])})
        return out


def split_screen(launch_dir: str, out_dirs: list[str], starts: list[int], lengths: list[int]
                 ) -> list[WindowSplit]:
    """Write one probe directory per window (``out_dirs[i]`` for window ``i``, which spans
    training steps ``starts[i]`` to ``starts[i] + lengths[i]``).

    Returns one :class:`WindowSplit` per window; a window after the one the launch stopped in
    has ``started`` false and its directory is not written.
    """
    ranks = []
    for name in sorted(os.listdir(launch_dir)) if os.path.isdir(launch_dir) else []:
        if name.endswith(".jsonl"):
            records, _torn = read_jsonl(os.path.join(launch_dir, name))
            ranks.append((name, _RankScreen(records, starts, lengths)))
    ranks_by_id = [(r.rank, r) for _, r in ranks]
    results = []
    stopped = False  # the launch ended in an earlier window: this one never ran
    for index, out_dir in enumerate(out_dirs):
        started = not stopped and any(index in r.steps for _, r in ranks)
        unsupported = next((r.unsupported[index] for _, r in ranks if index in r.unsupported),
                           None)
        complete = started and unsupported is None and all(r.complete(index) for _, r in ranks)
        split = WindowSplit(index, out_dir, complete=complete, started=started,
                            unsupported=unsupported)
        results.append(split)
        if unsupported is not None or not started:
            stopped = True
            continue
        os.makedirs(out_dir, exist_ok=True)
        first_ns, last_ns = [], []
        for name, rank in ranks:
            records = rank.window_records(index, rank.applied.get(index), complete)
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as handle:
                handle.write("".join(dumps(r) + "\n" for r in records))
            steps = rank.steps.get(index) or []
            if steps:
                first_ns.append(min(s["t_ns"] for s in steps))
                last_ns.append(max(_step_end_ns(s) for s in steps))
        _split_workers(launch_dir, out_dir, dict(ranks_by_id), index)
        split.span_s = (max(last_ns) - min(first_ns)) / 1e9 if first_ns else 0.0
        stopped = not complete
    return results


def _split_workers(launch_dir: str, out_dir: str, ranks: dict[Any, _RankScreen],
                   window: int) -> None:
    """Each DataLoader worker's batch records of ``window`` (by its rank's window bounds)."""
    for name, records in read_worker_dir(os.path.join(launch_dir, WORKER_DIR)):
        kept = []
        for record in records:
            rank = ranks.get(record.get("rank"))
            if rank is not None:
                low, high = rank.bounds(window)
                if low <= record.get("t_ns", 0) < high:
                    kept.append(record)
        if kept:
            os.makedirs(os.path.join(out_dir, WORKER_DIR), exist_ok=True)
            with open(os.path.join(out_dir, WORKER_DIR, name), "w", encoding="utf-8") as handle:
                handle.write("".join(dumps(r) + "\n" for r in kept))


def window_rates(launch_dir: str, overrides: list[dict[str, Any]]
                 ) -> dict[int, tuple[float, Optional[float]]]:
    """Global samples/s of each window that every rank has left (a step of a later window
    recorded), from what the ranks of a running screen flushed so far: as run
    (``store.epochs.rank_step_stats``: a restart charged per epoch where the window's workers
    restart) and between restarts (None where they do not restart); the slowest rank's rate
    times the ranks. {} until every rank (the context's ``world_size``) wrote steps.
    ``overrides``: each window's settings. What the sweep reads to stop a screen whose
    windows left are condemned (``sweep.climb.watched``)."""
    ranks: dict[Any, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    world = None
    for name in rank_files(launch_dir):
        records, _ = read_jsonl(name)
        loader_id = _training_loader_id(records)
        steps = [r for r in records if r.get("kind") == "step" and r.get("window") is not None
                 and r.get("loader_id") == loader_id]
        loader = next((r for r in records if r.get("kind") == "loader"
                       and r.get("loader_id") == loader_id), {})
        world = next((r.get("world_size") for r in records if r.get("kind") == "context"), world)
        if steps:
            ranks[name] = (steps, loader)
    if not world or len(ranks) < int(world):
        return {}
    rates = {}
    for window in range(min(max(s["window"] for s in steps) for steps, _ in ranks.values())):
        if window >= len(overrides):
            break
        per_rank, steady = [], []
        for steps, loader in ranks.values():
            applied = {**(loader.get("applied") or {}),
                       **{k: v for k, v in overrides[window].items() if v is not None}}
            stats = rank_step_stats([s for s in steps if s["window"] == window],
                                    {**loader, "applied": applied})
            per_rank.append(stats["throughput"])
            steady.append(stats["steady_throughput"])
        if per_rank and all(rate > 0 for rate in per_rank):
            restarting = all(rate is not None and rate > 0 for rate in steady)
            rates[window] = (min(per_rank) * len(per_rank),
                             min(steady) * len(steady) if restarting else None)
    return rates
