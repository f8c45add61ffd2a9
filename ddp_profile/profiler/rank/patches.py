"""The monkeypatches that connect torch to ``Instrumentation``; ``apply`` and ``remove``.

Every patched function passes straight through inside DataLoader worker processes
(``get_worker_info()`` is set there) and once the instrumentation is stopping.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
from typing import Any, Callable

from ddp_profile.profiler.rank.comm import SCRIPT_COLLECTIVES, SYNC_PATTERN
from ddp_profile.profiler.rank.windows import noting_dispatch
from ddp_profile.profiler.settings import constructor_options

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


def apply(instr: Any) -> None:
    """Install every patch for ``instr`` (an ``instrument.Instrumentation``)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data._utils import pin_memory as pin_module
    from torch.utils.data.dataloader import _BaseDataLoaderIter
    from torch.utils.data.distributed import DistributedSampler

    signature = inspect.signature(DataLoader.__init__)

    def make_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if _in_worker() or instr.stopping:
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            instr.on_loader_init(self, bound)
            original(*bound.args, **bound.kwargs)
        return __init__

    def make_iter(original: Any) -> Any:
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

    def make_next(original: Any) -> Any:
        @functools.wraps(original)
        def __next__(self: Any) -> Any:
            if instr.stopping or getattr(self, "_ddp_profile_state", None) is None:
                return original(self)
            return instr.on_next(self, original)
        return __next__

    def make_backward(original: Any) -> Any:
        @functools.wraps(original)
        def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
            instr.on_backward()
            return original(self, *args, **kwargs)
        return backward

    ddp_signature = inspect.signature(DistributedDataParallel.__init__)

    def make_ddp_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            if constructor_options(instr.plan.ddp) and not instr.stopping:
                args, kwargs = (), _ddp_options(ddp_signature, self, module, args, kwargs,
                                                instr)
            original(self, module, *args, **kwargs)
            if instr.stopping:
                return
            first = next(iter(module.parameters()), None)
            instr.event("ddp", find_unused_parameters=bool(self.find_unused_parameters),
                        broadcast_buffers=bool(getattr(self, "broadcast_buffers", True)),
                        device_type=first.device.type if first is not None else None,
                        module=len(instr.comm.modules))
            import weakref
            instr.ddp_modules.append(weakref.ref(self))
            instr.comm.track(self)
        return __init__

    lockstep = _lockstep(dist.all_reduce)

    def make_ddp_forward(original: Any) -> Any:
        @functools.wraps(original)
        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            if instr.stopping:
                return original(self, *args, **kwargs)
            if instr.gradient_sync():
                instr.comm.forward(self)
                return original(self, *args, **kwargs)
            # the communication counterfactual: this forward as under no_sync() (DDP reads
            # the flag in forward alone), the script's own flag back after it
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

    def make_dp_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            instr.event("data_parallel")
        return __init__

    def make_set_epoch(original: Any) -> Any:
        @functools.wraps(original)
        def set_epoch(self: Any, epoch: int) -> None:
            instr.event("set_epoch", epoch=int(epoch))
            return original(self, epoch)
        return set_epoch

    def make_init_pg(original: Any) -> Any:
        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            instr.event("process_group", backend=str(dist.get_backend()),
                        world_size=dist.get_world_size())
            return result
        return init_process_group

    _patch(DataLoader, "__init__", make_init)
    _patch(DataLoader, "__iter__", make_iter)
    _patch(_BaseDataLoaderIter, "__next__", make_next)
    if instr.plan.windows or instr.plan.mode == "ceiling":  # a pass may be continued
        _patch(_BaseDataLoaderIter, "_next_index", noting_dispatch)
    _patch(torch.Tensor, "backward", make_backward)
    _patch(DistributedDataParallel, "__init__", make_ddp_init)
    _patch(DistributedDataParallel, "forward", make_ddp_forward)
    _patch(DataParallel, "__init__", make_dp_init)
    _patch(DistributedSampler, "set_epoch", make_set_epoch)
    _patch(pin_module, "pin_memory", instr.pin_meter.wrap)  # pin thread and loop alike
    if dist.is_available():
        _patch(dist, "init_process_group", make_init_pg)
        _patch_collectives(instr, dist)
    _patch_spawn(instr)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _handles.append(register_optimizer_step_post_hook(lambda *_: instr.on_optimizer_step()))
    _install_excepthook(instr)


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
                 kwargs: dict[str, Any], instr: Any) -> dict[str, Any]:
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


def _patch_collectives(instr: Any, dist: Any) -> None:
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

    def make_fsdp_init(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            instr.event("fsdp")
        return __init__

    _patch(FullyShardedDataParallel, "__init__", make_fsdp_init)


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


def watch_host_syncs(instr: Any) -> bool:
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


def _patch_spawn(instr: Any) -> None:
    """Ranks started by ``torch.multiprocessing.spawn`` report their exceptions too."""
    import torch.multiprocessing.spawn as spawn_module

    def make_wrap(original: Any) -> Any:
        @functools.wraps(original)
        def _wrap(fn: Any, i: int, args: Any, *rest: Any, **kwargs: Any) -> Any:
            def recorded(*fn_args: Any) -> Any:
                try:
                    return fn(*fn_args)
                except Exception as exc:
                    instr.on_exception(type(exc), exc, exc.__traceback__)
                    raise
            return original(recorded, i, args, *rest, **kwargs)
        return _wrap

    if hasattr(spawn_module, "_wrap"):
        _patch(spawn_module, "_wrap", make_wrap)


def _install_excepthook(instr: Any) -> None:
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
