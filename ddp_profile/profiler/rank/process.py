"""What a rank process says about itself, and how it leaves: rank, context, errors, barrier.

Read by ``profiler.rank.instrument`` in a probe's rank processes. Everything here is best
effort: the user's training must never fail because of it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Optional

from ddp_profile.profiler.cpus import cpus_available
from ddp_profile.profiler.rank.facts import memory_available, thread_facts
from ddp_profile.profiler.settings import ProbePlan
from ddp_profile.profiler.store.record import SCHEMA_VERSION

_known_rank: tuple[int, int] = (-1, -1)  # (pid, rank) once the process group told it


def current_rank() -> Optional[int]:
    """The global rank: the process group's once initialised (then remembered, as it is asked
    at every step), else ``$RANK``."""
    global _known_rank
    pid = os.getpid()
    if _known_rank[0] == pid:
        return _known_rank[1]
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _known_rank = (pid, dist.get_rank())
        return _known_rank[1]
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def context_record(plan: ProbePlan) -> dict[str, Any]:
    """The rank's ``context`` record: who it is, where it runs, with which torch."""
    import socket

    import torch
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    return {
        "kind": "context", "schema_version": SCHEMA_VERSION, "rank": current_rank(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0),
        "node_rank": int(os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0")) or 0),
        "world_size": dist.get_world_size() if initialized else
        int(os.environ.get("WORLD_SIZE", "1") or 1),
        "backend": str(dist.get_backend()) if initialized else None,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "hostname": socket.gethostname(), "pid": os.getpid(),
        "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "cpus_available": cpus_available(), "threads": thread_facts(),
        "memory_available": memory_available(),
        "argv": list(sys.argv), "t_ns": time.time_ns(), "probe_id": plan.probe_id,
        "mode": plan.mode}


def error_record(exc_type: type, exc: BaseException) -> dict[str, Any]:
    """The rank's ``error`` record for an exception that ends the script."""
    import traceback

    lines = traceback.format_exception_only(exc_type, exc)
    message = str(exc)
    oom = exc_type.__name__ in ("OutOfMemoryError", "MemoryError") or \
        "out of memory" in message.lower()
    return {"kind": "error", "rank": current_rank(), "t_ns": time.time_ns(),
            "exc_type": exc_type.__name__, "message": message[:2000],
            "last_line": (lines[-1].strip() if lines else exc_type.__name__)[:500],
            "causes": _causes(exc), "oom": oom, "origin": error_origin(exc)}


def error_origin(exc: BaseException) -> Optional[str]:
    """Which part of torch raised ``exc``: ``"data_loader"`` (fetching a batch, its workers
    included), ``"distributed"`` (a collective or DDP), or None (the script itself, or torch
    elsewhere).

    Read from the innermost torch frame of the traceback. It tells a rank's own loader losing a
    worker's connection (a cause) from a collective losing a dead peer's (a symptom): both raise
    ``ConnectionResetError``.
    """
    import traceback

    origin = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = frame.filename.replace(os.sep, "/")
        if "/torch/utils/data/" in path:
            origin = "data_loader"
        elif "/torch/distributed/" in path or "/torch/nn/parallel/" in path:
            origin = "distributed"
    return origin


def _causes(exc: BaseException, limit: int = 3) -> list[str]:
    """The last lines of the exceptions this one was raised from or during."""
    import traceback

    causes, seen, inner = [], {id(exc)}, exc.__cause__ or exc.__context__
    while inner is not None and id(inner) not in seen and len(causes) < limit:
        seen.add(id(inner))
        causes.append(traceback.format_exception_only(type(inner), inner)[-1].strip()[:300])
        inner = inner.__cause__ or inner.__context__
    return causes


def barrier(timeout_s: float) -> None:
    """Best-effort barrier over the script's default process group, bounded in time."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
    except Exception:  # noqa: BLE001
        return
    done = threading.Event()

    def wait() -> None:
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001
            pass
        done.set()

    threading.Thread(target=wait, name="ddp-profile-stop-barrier", daemon=True).start()
    done.wait(timeout_s)


def flush_std_streams() -> None:
    """Flush stdout and stderr before ``os._exit`` (which would drop what they buffer)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
