"""How a rank process ends under the patches: ranks started by
``torch.multiprocessing.spawn`` and uncaught exceptions, both reported to the ``Hooks``; and
ranks spawned inside a rank torchrun started, refused where they are spawned."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Mapping

from ddp_profile.profiler.rank.patches.registry import SPAWNED_DDP, Hooks, originals, patch


def patch_spawn(instr: Hooks) -> None:
    """Ranks started by ``torch.multiprocessing.spawn`` report their exceptions too, and end
    as a probe does once their function returns (``stop``: records, workers, ``os._exit``),
    their DDP modules kept alive until then. Freed as the function returns, a DDP module's
    reducer destroys its gloo process group, which joins its worker thread while holding the
    GIL; a worker thread still destroying the last all-reduce's work waits for the GIL to
    release a Python object that work captured: the rank hangs (1 launch in 10 of a spawn
    script whose probes ran to its end, each a 60 s timeout and a lost probe; py-spy: the
    main thread in ``~ProcessGroupGloo`` -> ``thread::join``, the worker in
    ``~AsyncAllreduceWork`` -> ``gil_scoped_acquire``)."""
    import importlib

    # the module: ``import torch.multiprocessing.spawn as m`` binds the function ``spawn``,
    # which torch.multiprocessing exports under the module's name (and which has no ``_wrap``)
    spawn_module = importlib.import_module("torch.multiprocessing.spawn")

    def make_wrap(original: Any) -> Any:
        @functools.wraps(original)
        def _wrap(fn: Any, i: int, args: Any, *rest: Any, **kwargs: Any) -> Any:
            def recorded(*fn_args: Any) -> Any:
                SPAWNED_DDP.append(None)  # this process is a spawned rank: keep its modules
                try:
                    result = fn(*fn_args)
                except Exception as exc:
                    instr.on_exception(type(exc), exc, exc.__traceback__)
                    raise
                if len(SPAWNED_DDP) > 1:  # its records may be written (it destroyed its
                    instr.stop("script_exit")  # process group): it still ends here
                return result
            return original(recorded, i, args, *rest, **kwargs)
        return _wrap

    def make_start(original: Any) -> Any:
        @functools.wraps(original)
        def start_processes(fn: Any, args: Any = (), nprocs: int = 1, *rest: Any,
                            **kwargs: Any) -> Any:
            refuse_ranks_inside_a_rank(nprocs, os.environ)
            return original(fn, args, nprocs, *rest, **kwargs)
        return start_processes

    if hasattr(spawn_module, "_wrap"):
        patch(spawn_module, "_wrap", make_wrap)
    if hasattr(spawn_module, "start_processes"):  # ``spawn`` calls it by its module's name
        patch(spawn_module, "start_processes", make_start)


class RanksInsideARank(RuntimeError):
    """The script starts its own ranks in a process torchrun started as a rank."""


def refuse_ranks_inside_a_rank(nprocs: int, environ: Mapping[str, str]) -> None:
    """Raise where a rank that torch's launcher started (``profiler.allocation.detect``: a
    ``torchrun`` allocation) starts ranks of its own with ``torch.multiprocessing.spawn``:
    each of the launcher's ranks would spawn its own set, every set on one rendezvous address
    (the DDP tutorial's ``mp.spawn`` script under torchrun: both sets waited on one port until
    the probe's 600 s timeout). Such a script is run as ``python train.py`` is: ``--launcher
    none``."""
    from ddp_profile.profiler.allocation import detect

    found = detect(environ)
    if found is None or found.kind != "torchrun":
        return
    raise RanksInsideARank(
        f"the script starts its own ranks with torch.multiprocessing.spawn (nprocs={nprocs}) "
        f"inside each of the {found.world_size} ranks torchrun started: run it with "
        "--launcher none, as `python script.py` starts it")


def install_excepthook(instr: Hooks) -> None:
    previous = sys.excepthook

    def excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
        try:
            if not issubclass(exc_type, KeyboardInterrupt):
                instr.on_exception(exc_type, exc, tb)
        finally:
            previous(exc_type, exc, tb)

    originals.append((sys, "excepthook", previous))
    sys.excepthook = excepthook
