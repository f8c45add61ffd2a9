"""The monkeypatches that connect torch to ``Instrumentation``; ``apply`` and ``remove``.

Every patched function passes straight through inside DataLoader worker processes
(``get_worker_info()`` is set there) and once the instrumentation is stopping.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import weakref
from typing import Any, Callable, Optional, Protocol

from ddp_profile.profiler.rank.comm import SCRIPT_COLLECTIVES, SYNC_PATTERN
from ddp_profile.profiler.rank.windows import noting_dispatch
from ddp_profile.profiler.settings import ProbePlan, constructor_options

_originals: list[tuple[Any, str, Any]] = []
_handles: list[Any] = []


def _patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
    _originals.append((owner, name, original))
    setattr(owner, name, make(original))


def is_applied() -> bool:
    return bool(_originals)


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


class Hooks(Protocol):
    """What the patches call: ``instrument.Instrumentation``'s hooks."""

    stopping: bool
    plan: ProbePlan
    comm: Any  # rank.comm.CommMeter
    pin_meter: Any  # rank.loadcost's pin-time meter
    ddp_modules: list[Any]

    def event(self, name: str, **data: Any) -> None: ...
    def on_loader_init(self, loader: Any, bound: inspect.BoundArguments) -> None: ...
    def before_iter(self, loader: Any) -> None: ...
    def on_iter(self, loader: Any, iterator: Any, started_ns: Optional[int] = None) -> None: ...
    def on_next(self, iterator: Any, original_next: Callable[[Any], Any]) -> Any: ...
    def on_backward(self) -> None: ...
    def on_optimizer_step(self) -> None: ...
    def gradient_sync(self) -> bool: ...
    def on_exception(self, exc_type: type, exc: BaseException, tb: Any) -> None: ...
    def stop(self, reason: str) -> None: ...


Maker = Callable[[Any], Any]  # the original function -> its patched replacement


def apply(instr: Hooks) -> None:
    """Install every patch for ``instr`` (an ``instrument.Instrumentation``)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import pin_memory as pin_module
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    from torch.utils.data.distributed import DistributedSampler

    _patch(DataLoader, "__init__", _loader_init(instr, inspect.signature(DataLoader.__init__)))
    _patch(DataLoader, "__iter__", _loader_iter(instr))
    _patch(_BaseDataLoaderIter, "__next__", _iterator_next(instr))
    if instr.plan.windows or instr.plan.mode == "ceiling":  # a pass may be continued
        _patch(_BaseDataLoaderIter, "_next_index", noting_dispatch)
    _patch(torch.Tensor, "backward", _backward(instr))
    _patch(DistributedDataParallel, "__init__",
           _ddp_init(instr, inspect.signature(DistributedDataParallel.__init__)))
    _patch(DistributedDataParallel, "forward", _ddp_forward(instr, _lockstep(dist.all_reduce)))
    _patch(DataParallel, "__init__", _event_after(instr, "data_parallel"))
    _patch(DistributedSampler, "set_epoch", _set_epoch(instr))
    _patch(pin_module, "pin_memory", instr.pin_meter.wrap)  # pin thread and loop alike
    if dist.is_available():
        _patch(dist, "init_process_group", _init_process_group(instr, dist))
        _patch_collectives(instr, dist)
    _patch_spawn(instr)
    _handles.append(register_optimizer_step_post_hook(lambda *_: instr.on_optimizer_step()))
    _install_excepthook(instr)


def _loader_init(instr: Hooks, signature: inspect.Signature) -> Maker:
    """``DataLoader.__init__``: the hooks see (and may override) its bound arguments."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if _in_worker() or instr.stopping:
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            instr.on_loader_init(self, bound)
            original(*bound.args, **bound.kwargs)
        return __init__
    return make


def _loader_iter(instr: Hooks) -> Maker:
    """``DataLoader.__iter__``: the iterator adopted, timed from before its workers start."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __iter__(self: Any) -> Any:
            if not (_in_worker() or instr.stopping):
                instr.before_iter(self)
            started = time.perf_counter_ns()  # making the iterator starts its workers
            iterator = original(self)
            if not (_in_worker() or instr.stopping):
                instr.on_iter(self, iterator, started)
            return iterator
        return __iter__
    return make


def _iterator_next(instr: Hooks) -> Maker:
    """``__next__`` of an adopted iterator goes through the hooks (the step clock)."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __next__(self: Any) -> Any:
            if instr.stopping or getattr(self, "_ddp_profile_state", None) is None:
                return original(self)
            return instr.on_next(self, original)
        return __next__
    return make


def _backward(instr: Hooks) -> Maker:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
            instr.on_backward()
            return original(self, *args, **kwargs)
        return backward
    return make


def _ddp_init(instr: Hooks, signature: inspect.Signature) -> Maker:
    """``DistributedDataParallel.__init__``: the probe's DDP options over the script's, the
    module recorded and its reducer timed (``rank.comm``)."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            if constructor_options(instr.plan.ddp) and not instr.stopping:
                args, kwargs = (), _ddp_options(signature, self, module, args, kwargs, instr)
            original(self, module, *args, **kwargs)
            if instr.stopping:
                return
            first = next(iter(module.parameters()), None)
            instr.event("ddp", find_unused_parameters=bool(self.find_unused_parameters),
                        broadcast_buffers=bool(getattr(self, "broadcast_buffers", True)),
                        device_type=first.device.type if first is not None else None,
                        module=len(instr.comm.modules))
            instr.ddp_modules.append(weakref.ref(self))
            if _SPAWNED_DDP:
                _SPAWNED_DDP.append(self)
            instr.comm.track(self)
        return __init__
    return make


def _ddp_forward(instr: Hooks, lockstep: Callable[[Any], None]) -> Maker:
    """``DistributedDataParallel.forward``: counted for the reducer's timers; in a step
    without gradient synchronisation (``Hooks.gradient_sync``: the communication
    counterfactual) run as under ``no_sync()`` (DDP reads the flag in forward alone), the
    script's own flag back after it."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            if instr.stopping:
                return original(self, *args, **kwargs)
            if instr.gradient_sync():
                instr.comm.forward(self)
                return original(self, *args, **kwargs)
            synced = self.require_backward_grad_sync
            self.require_backward_grad_sync = False
            if torch.is_grad_enabled():
                lockstep(self)
            instr.comm.forward(self)
            try:
                return original(self, *args, **kwargs)
            finally:
                self.require_backward_grad_sync = synced
        return forward
    return make


def _event_after(instr: Hooks, name: str) -> Maker:
    """A constructor that records event ``name`` once it ran."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            instr.event(name)
        return __init__
    return make


def _set_epoch(instr: Hooks) -> Maker:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def set_epoch(self: Any, epoch: int) -> None:
            instr.event("set_epoch", epoch=int(epoch))
            return original(self, epoch)
        return set_epoch
    return make


def _init_process_group(instr: Hooks, dist: Any) -> Maker:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            instr.event("process_group", backend=str(dist.get_backend()),
                        world_size=dist.get_world_size())
            return result
        return init_process_group
    return make


def _lockstep(all_reduce: Any) -> Callable[[Any], None]:
    """Without gradient synchronisation the ranks would drift apart, and on shared CPUs one
    that runs alone runs faster: a one-element all-reduce every ``LOCKSTEP_FORWARDS`` forwards
    keeps them within a few steps of each other (each costs an all-reduce's latency, hence
    not every forward), so the counterfactual differs in the gradients' transfer alone. The
    all-reduce is torch's own (not counted as the script's)."""
    tensors: dict[int, list[Any]] = {}

    def lockstep(ddp: Any) -> None:
        import torch

        slot = tensors.get(id(ddp))
        if slot is None:
            first = next(iter(ddp.parameters()), None)
            slot = tensors[id(ddp)] = [torch.zeros(
                1, device=first.device if first is not None else "cpu"), 0]
        slot[1] += 1
        if slot[1] % LOCKSTEP_FORWARDS == 0:
            all_reduce(slot[0], group=getattr(ddp, "process_group", None))
    return lockstep


def _ddp_options(signature: inspect.Signature, ddp: Any, module: Any, args: tuple,
                 kwargs: dict[str, Any], instr: Hooks) -> dict[str, Any]:
    """The script's DDP arguments with the probe's DDP options over them (those this torch's
    DDP accepts); the applied and skipped ones recorded (event ``ddp_overrides``)."""
    bound = signature.bind(ddp, module, *args, **kwargs)
    arguments = dict(bound.arguments)
    arguments.pop("self", None)
    arguments.pop("module", None)
    extra = arguments.pop("kwargs", {})
    applied, skipped = {}, []
    for key, value in constructor_options(instr.plan.ddp).items():
        if key in signature.parameters:
            applied[key] = {"own": arguments.get(key), "probe": value}
            arguments[key] = value
        else:
            skipped.append(key)
    instr.event("ddp_overrides", applied=applied, skipped=skipped)
    return {**arguments, **extra}


LOCKSTEP_FORWARDS = 4
GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_reduce_coalesced")


def _patch_collectives(instr: Hooks, dist: Any) -> None:
    """Time and count the script's collectives per step, with their call sites
    (``rank.comm.CommMeter``); record, once per process, that the script calls a collective
    that can sum gradients (event ``collective`` {op}), and that it builds an FSDP module
    (event ``fsdp``)."""
    reported: set[str] = set()
    instr.comm.active = lambda: not instr.stopping and not _in_worker()

    def make(op: str) -> Callable[[Any], Any]:
        def wrap(original: Any) -> Any:
            timed = instr.comm.wrap_collective(op, original)

            @functools.wraps(original)
            def collective(*args: Any, **kwargs: Any) -> Any:
                if op in GRADIENT_COLLECTIVES and op not in reported and not instr.stopping \
                        and not _in_worker():
                    reported.add(op)
                    instr.event("collective", op=op)
                return timed(*args, **kwargs)
            return collective
        return wrap

    for op in SCRIPT_COLLECTIVES:
        if hasattr(dist, op):
            _patch(dist, op, make(op))
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return

    _patch(FullyShardedDataParallel, "__init__", _event_after(instr, "fsdp"))


class _SyncDebugMode:
    """Handle that puts torch's sync debug mode and the warnings filter back (``remove``)."""

    def __init__(self, torch_c: Any, entry: Any):
        self._torch_c, self._entry = torch_c, entry

    def remove(self) -> None:
        import warnings

        self._torch_c._cuda_set_sync_debug_mode(0)
        if self._entry in warnings.filters:
            warnings.filters.remove(self._entry)
            getattr(warnings, "_filters_mutated", lambda: None)()


def watch_host_syncs(instr: Hooks) -> bool:
    """Count the script's host-GPU synchronisations from now on (``rank.comm``): called once
    the script uses CUDA. False, and nothing changed, where this torch has no sync debug mode
    or the script set one itself."""
    import warnings

    import torch

    get = getattr(torch._C, "_cuda_get_sync_debug_mode", None)
    if get is None or not hasattr(torch._C, "_cuda_set_sync_debug_mode") or get() != 0:
        return False
    warnings.filterwarnings("always", message=SYNC_PATTERN, category=UserWarning)
    _handles.append(_SyncDebugMode(torch._C, warnings.filters[0]))
    _patch(warnings, "showwarning", instr.comm.wrap_showwarning)
    _patch(torch.cuda, "synchronize", instr.comm.wrap_synchronize)
    torch._C._cuda_set_sync_debug_mode(1)
    return True


_SPAWNED_DDP: list[Any] = []  # a spawned rank's DDP modules, kept past its function's return


def _patch_spawn(instr: Hooks) -> None:
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
                _SPAWNED_DDP.append(None)  # this process is a spawned rank: keep its modules
                try:
                    result = fn(*fn_args)
                except Exception as exc:
                    instr.on_exception(type(exc), exc, exc.__traceback__)
                    raise
                if len(_SPAWNED_DDP) > 1 and not instr.stopping:
                    instr.stop("script_exit")
                return result
            return original(recorded, i, args, *rest, **kwargs)
        return _wrap

    if hasattr(spawn_module, "_wrap"):
        _patch(spawn_module, "_wrap", make_wrap)


def _install_excepthook(instr: Hooks) -> None:
    previous = sys.excepthook

    def excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
        try:
            if not issubclass(exc_type, KeyboardInterrupt):
                instr.on_exception(exc_type, exc, tb)
        finally:
            previous(exc_type, exc, tb)

    _originals.append((sys, "excepthook", previous))
    sys.excepthook = excepthook


def remove() -> None:
    """Undo every patch (used by tests; a probe's process simply exits)."""
    while _originals:
        owner, name, original = _originals.pop()
        setattr(owner, name, original)
    while _handles:
        _handles.pop().remove()
