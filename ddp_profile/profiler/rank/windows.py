"""How a rank's loaders are driven through a probe: each iterator's state, a screen's windows
and the ceiling's replayed batches.

``IteratorState`` is what ``profiler.rank.instrument`` keeps on each DataLoader iterator it
sees. ``Screen`` is a screen's windows (``ProbePlan.windows``) as the training loader goes
through them: which window a step is in, whether it is measured, where a window begins and
when the probe is done; at each window's first step, in every rank at the same step,
:func:`rebuilt_iterator` rebuilds the training loader's iterator with the window's settings.
``CeilingReplay`` serves a ceiling probe (or window): a few real batches, then those again.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ddp_profile.profiler.settings import (
    CEILING_CACHE_BATCHES,
    LoaderSettings,
    ProbePlan,
    window_index,
)


@dataclass
class IteratorState:
    """One DataLoader iterator as the instrumentation follows it."""

    loader_id: int
    iter_index: int  # the loader's how-manieth iterator (its epoch, for most scripts)
    t_iter: int  # perf_counter_ns when it was made (its workers' start)
    loader: "weakref.ref[Any]"
    default_bs: int = 1  # samples per batch where a batch does not say
    first: bool = True  # its first batch not returned yet
    delegate: Any = None  # the iterator a screen window rebuilt, serving in its place
    fingerprints: int = 0  # batches fingerprinted (the sharding check)


class Screen:
    """The windows of a probe (one window, all steps, for a probe that is not a screen)."""

    def __init__(self, plan: ProbePlan):
        self.plan = plan
        self.windows = bool(plan.windows)
        self.starts = plan.window_starts() if plan.windows else [0]  # fixed per probe
        self.total_steps = plan.total_steps  # computed once, read at every step
        self.window = 0  # the window the training loader is in

    def label(self, record: dict[str, Any]) -> None:
        """A screen's step record gets its window, and is measured past the window's
        warm-up."""
        if self.windows:
            window = window_index(self.starts, record["step"])
            record["window"] = window
            record["measured"] = (record["step"] - self.starts[window]
                                  >= self.plan.window_warmup(window))

    def done(self, steps_closed: int, measured_steps: int, wanted: int) -> bool:
        """A screen ends after its last window; a probe once ``wanted`` steps were measured."""
        return steps_closed >= self.total_steps if self.windows else measured_steps >= wanted

    def boundary(self, steps_closed: int) -> Optional[int]:
        """The window that begins at this step (None where none does)."""
        if self.windows and steps_closed in self.starts:
            return self.starts.index(steps_closed)
        return None

    def mode(self, training: bool, step: int) -> tuple[str, int]:
        """The mode a batch is served in, and its step within its window."""
        if self.windows and training:
            return self.plan.window_mode(self.window), step - self.starts[self.window]
        return self.plan.mode, step


class CeilingReplay:
    """A ceiling's batches: the first ``CEILING_CACHE_BATCHES`` of each loader, then those
    again in turn (the loop runs without loading)."""

    def __init__(self) -> None:
        self._cache: dict[int, list[Any]] = {}

    def fetch(self, loader_id: int, step: int, next_batch: Callable[[], Any]) -> Any:
        cache = self._cache.setdefault(loader_id, [])
        if len(cache) < CEILING_CACHE_BATCHES:
            batch = next_batch()
            if len(cache) < CEILING_CACHE_BATCHES:
                cache.append(batch)
            return batch
        return cache[step % len(cache)]


def shutdown_workers(iterator: Any) -> None:
    """Stop a DataLoader iterator's worker processes (best effort)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # noqa: BLE001
            pass


def applied_settings(loader: Any) -> dict[str, Any]:
    """The settings a DataLoader runs with now."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    return {"num_workers": workers, "pin_memory": bool(getattr(loader, "pin_memory", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers else None,
            "batch_size": getattr(loader, "batch_size", None)}


def target_settings(applied: dict[str, Any], settings: LoaderSettings) -> dict[str, Any]:
    """The loader attributes for a window: its overrides over what runs now."""
    target = dict(applied)
    if settings.num_workers is not None:
        target["num_workers"] = settings.num_workers
    if settings.pin_memory is not None:
        target["pin_memory"] = settings.pin_memory
    if target["num_workers"]:
        target["prefetch_factor"] = (settings.prefetch_factor or applied.get("prefetch_factor")
                                     or 2)
    else:
        target["prefetch_factor"] = None
    return target


def rebuilt_iterator(loader: Any, running: Any,
                     settings: LoaderSettings) -> Optional[tuple[Any, int]]:
    """A fresh iterator of ``loader`` with ``settings`` and its start (``perf_counter_ns``).

    The ``running`` iterator's workers are shut down first, to free the CPUs. None when the
    loader already runs with these settings. Raises whatever the DataLoader raises (a subclass
    may forbid it); the caller ends the screen then.
    """
    if loader is None:
        raise RuntimeError("the DataLoader is gone")
    applied = applied_settings(loader)
    target = target_settings(applied, settings)
    if target == applied:
        return None
    shutdown_workers(running)
    for key, value in target.items():
        if key != "batch_size":
            setattr(loader, key, value)
    started = time.perf_counter_ns()
    fresh = loader._get_iterator()
    if getattr(loader, "persistent_workers", False):
        loader._iterator = fresh
    return fresh, started
