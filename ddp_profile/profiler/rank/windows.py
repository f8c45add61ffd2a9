"""A screen's window boundary: rebuild the training loader's iterator with other settings.

``profiler.rank.instrument`` calls :func:`rebuilt_iterator` at each window's first step, in
every rank at the same step (see ``ProbePlan.windows``).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ddp_profile.profiler.settings import LoaderSettings


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
