"""One probe directory read back: ``read_probe_dir(path) -> [RankData]``, one per rank file.

Each rank's records by kind (``store.record``), with its DataLoader workers' files (under
``workers/``: their batch costs, starts and files read) attached to it, the loaders that kept an
iterator across epochs marked (``keeps_iterator``), the training loader's settings copied
into its context, and the steps of a loop that fetches a batch ahead folded (``fold_fetch_ahead``).
A torn last line is skipped, never fatal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from ddp_profile.profiler.store.record import (
    ITERATOR_OUTLIVES_EPOCH,
    SCRIPT_EXIT,
    WORKER_DIR,
    read_jsonl,
)


@dataclass
class RankData:
    """Everything one rank wrote for one probe, split by record kind."""

    rank: int
    context: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    loader_iters: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    loaders: dict[int, dict[str, Any]] = field(default_factory=dict)
    gpu_steps: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    batch_costs: list[dict[str, Any]] = field(default_factory=list)  # where batches are made
    pin_costs: list[dict[str, Any]] = field(default_factory=list)  # where batches are pinned
    worker_starts: list[dict[str, Any]] = field(default_factory=list)  # DataLoader workers
    files: list[str] = field(default_factory=list)  # read by its producers (``pagecache``)
    error: Optional[dict[str, Any]] = None
    end: Optional[dict[str, Any]] = None
    torn_lines: int = 0

    @property
    def training_loader_id(self) -> Optional[int]:
        if self.end and self.end.get("training_loader_id") is not None:
            return int(self.end["training_loader_id"])
        counts: dict[int, int] = {}
        for step in self.steps:
            counts[step["loader_id"]] = counts.get(step["loader_id"], 0) + 1
        return max(counts, key=counts.get) if counts else None

    def training_steps(self) -> list[dict[str, Any]]:
        loader_id = self.training_loader_id
        return [s for s in self.steps if s.get("loader_id") == loader_id]


def read_probe_dir(probe_dir: str) -> list[RankData]:
    """Read every rank file of one probe; a torn last line is skipped, never fatal."""
    ranks: list[RankData] = []
    if not os.path.isdir(probe_dir):
        return ranks
    for name in sorted(os.listdir(probe_dir)):
        if not name.endswith(".jsonl"):
            continue
        records, torn = read_jsonl(os.path.join(probe_dir, name))
        data = RankData(rank=-1, torn_lines=torn)
        for record in records:
            kind = record.get("kind")
            if kind == "context":
                data.context = record
            elif kind == "step":
                data.steps.append(record)
            elif kind == "sample":
                data.samples.append(record)
            elif kind == "loader_iter":
                data.loader_iters.append(record)
            elif kind == "event":
                data.events.append(record)
            elif kind == "error" and data.error is None:
                data.error = record
            elif kind == "end":
                data.end = record
            elif kind == "loader":
                data.loaders[int(record.get("loader_id", -1))] = record
            elif kind == "gpu_step":
                data.gpu_steps[(record.get("loader_id"), record.get("step"))] = record
            elif kind == "batch_cost":
                data.batch_costs.append(record)
            elif kind == "pin_cost":
                data.pin_costs.append(record)
            elif kind == "files":
                data.files.extend(record.get("paths") or [])
        rank = next((r.get("rank") for r in records if r.get("rank") is not None), None)
        data.rank = int(rank) if rank is not None else -1
        _mark_kept_iterators(data)
        _attach_training_loader(data)
        fold_fetch_ahead(data)
        ranks.append(data)
    ranks.sort(key=lambda r: r.rank)
    _attach_worker_records(os.path.join(probe_dir, WORKER_DIR), ranks)
    return ranks


def whole_run(ranks: list[RankData]) -> Optional[tuple[int, float]]:
    """The script's whole run, where each rank ran it to its end (its end record's reason is
    ``SCRIPT_EXIT``: the harness stopped none): the samples its training loop took, every
    rank's together, and the seconds from a rank's first training batch asked for to its end
    (validation, checkpoints and epoch boundaries in between), the slowest rank's. None where
    any rank was stopped or wrote no end. A script without a process group (one process, as
    a single-GPU script runs) has no rank: the process whose training loop ran is the run."""
    ranks = [r for r in ranks if r.rank >= 0] or [r for r in ranks if r.training_steps()]
    if not ranks or any(r.end is None or r.end.get("reason") != SCRIPT_EXIT for r in ranks):
        return None
    samples, seconds = 0, 0.0
    for data in ranks:
        steps = data.training_steps()
        if not steps or not isinstance(data.end.get("t_ns"), int):
            return None
        samples += sum(int(s.get("samples") or 0) + int(s.get("fetched_ahead") or 0)
                       for s in steps)
        seconds = max(seconds, (data.end["t_ns"] - min(int(s["t_ns"]) for s in steps)) / 1e9)
    return (samples, seconds) if samples and seconds > 0 else None


def read_worker_dir(worker_dir: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each DataLoader worker's file (name, records) under ``worker_dir``; torn lines skipped."""
    if not os.path.isdir(worker_dir):
        return []
    return [(name, read_jsonl(os.path.join(worker_dir, name))[0])
            for name in sorted(os.listdir(worker_dir)) if name.endswith(".jsonl")]


def _attach_worker_records(worker_dir: str, ranks: list[RankData]) -> None:
    """Give each rank the batch records of its DataLoader workers."""
    by_rank = {r.rank: r for r in ranks}
    for _name, records in read_worker_dir(worker_dir):
        for record in records:
            rank = record.get("rank")
            owner = by_rank.get(-1 if rank is None else rank)
            if owner is None:
                continue
            if record.get("kind") == "batch_cost":
                owner.batch_costs.append(record)
            elif record.get("kind") == "worker_start":
                owner.worker_starts.append(record)
            elif record.get("kind") == "files":
                owner.files.extend(record.get("paths") or [])


def _mark_kept_iterators(data: RankData) -> None:
    """A loader one of whose iterators outlived an epoch keeps it across epochs
    (``keeps_iterator`` on its record): it starts no workers per epoch."""
    for event in data.events:
        if event.get("name") == ITERATOR_OUTLIVES_EPOCH:
            loader = data.loaders.get(int((event.get("data") or {}).get("loader_id", -1)))
            if loader is not None:
                loader["keeps_iterator"] = True


def _attach_training_loader(data: RankData) -> None:
    """Copy the training loader's settings into the context: ``loader``, ``applied``..."""
    loader = data.loaders.get(data.training_loader_id) if data.loaders else None
    if loader is None and data.loaders:
        loader = data.loaders[min(data.loaders)]
    if loader is not None:
        data.context["loader"] = loader.get("own") or {}
        data.context["keeps_iterator"] = bool(loader.get("keeps_iterator"))
        data.context["applied"] = loader.get("applied") or {}
        data.context["skipped_overrides"] = loader.get("skipped_overrides") or []


def _works(step: dict[str, Any]) -> bool:
    """The step trained: a backward, an optimizer step or a DDP forward fell inside it."""
    return step.get("forward_s") is not None or any(
        step.get(key) for key in ("opt_steps", "syncs", "unsynced"))


def fetches_ahead(steps: list[dict[str, Any]]) -> bool:
    """Whether the loop takes each batch one ``__next__`` ahead of training on it, as
    accelerate's prepared loader does (to know the epoch's last batch):
    every iterator's first step holds no training, while the loop trains, in its other steps
    or, where an epoch is one batch, between them (DDP's forward count moves outside every
    step)."""
    firsts = [s for s in steps if s.get("loader_start")]
    if not firsts or any(_works(s) for s in firsts):
        return False
    if any(_works(s) for s in steps if not s.get("loader_start")):
        return True
    forwards = [sum(s.get("ddp_n") or []) for s in sorted(steps, key=lambda s: s["step"])]
    return len(forwards) > 1 and forwards[-1] > forwards[0]


def fold_fetch_ahead(data: RankData) -> None:
    """A loop that fetches ahead trains on batch k between the calls that fetch k+1 and k+2, so
    the interval from an iterator's first call to its second holds no training, and the
    epoch's last batch trains after the call that ends it, in no step. Read as they come, its
    steps count one batch an epoch with no time: a 4-batch epoch reads 4/3 of its speed, a
    1-batch epoch hundreds of times it. So each iterator's first step is folded into the
    step after it (its wait, the iterator's start, its start time; its batch kept as
    ``fetched_ahead``, which the whole run counts and no step rate does); an iterator of one
    batch keeps it as a step that is not measured (``ahead``): no step of it can be timed."""
    steps = sorted(data.training_steps(), key=lambda s: s["step"])
    if not fetches_ahead(steps):
        return
    by_number = {s["step"]: s for s in steps}
    folded: set[int] = set()
    for first in [s for s in steps if s.get("loader_start")]:
        after = by_number.get(first["step"] + 1)
        if after is None or after.get("loader_start"):
            first["measured"], first["ahead"] = False, True
            continue
        if first.get("iter_start_s") is not None:  # from the iterator's creation
            after["iter_start_s"] = first["iter_start_s"] + after["data_wait_s"]
        after["data_wait_s"] += first["data_wait_s"]
        after["other_s"] += first["compute_s"] + first["other_s"]
        if first.get("runq_s") is not None and after.get("runq_s") is not None:
            after["runq_s"] += first["runq_s"]
        else:  # a part unread (a step not sampled, ``stepclock.runq_sampled``): not the sum
            after.pop("runq_s", None)
        after["t_ns"], after["loader_start"] = first["t_ns"], True
        after["fetched_ahead"] = first.get("samples") or 0
        folded.add(id(first))
    data.steps = [s for s in data.steps if id(s) not in folded]
