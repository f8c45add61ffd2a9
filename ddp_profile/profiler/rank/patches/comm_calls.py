"""The patches of communication: DDP's constructor (the probe's options, its reducer timed)
and forward (the steps without gradient synchronisation), ``init_process_group``, the
script's collectives and its host-GPU synchronisations, all measured by ``rank.comm_meter``."""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, Callable

from ddp_profile.profiler.rank.comm_meter import SCRIPT_COLLECTIVES, SYNC_PATTERN
from ddp_profile.profiler.rank.patches.registry import (
    SPAWNED_DDP,
    Hooks,
    Maker,
    event_after,
    handles,
    in_worker,
    patch,
)
from ddp_profile.profiler.settings import constructor_options

LOCKSTEP_FORWARDS = 4
GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_reduce_coalesced")


def ddp_init(instr: Hooks, signature: inspect.Signature) -> Maker:
    """``DistributedDataParallel.__init__``: the probe's DDP options over the script's, the
    module recorded and its reducer timed (``rank.comm_meter``)."""
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
            if SPAWNED_DDP:
                SPAWNED_DDP.append(self)
            instr.comm.track(self)
        return __init__
    return make


def ddp_forward(instr: Hooks, lockstep: Callable[[Any], None]) -> Maker:
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


def make_lockstep(all_reduce: Any) -> Callable[[Any], None]:
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


def process_group_init(instr: Hooks, dist: Any) -> Maker:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            instr.event("process_group", backend=str(dist.get_backend()),
                        world_size=dist.get_world_size())
            return result
        return init_process_group
    return make


def process_group_destroy(instr: Hooks) -> Maker:
    """A script that destroys its default process group is done training: the rank's final
    records are written first (``Hooks.end_of_script``), whole on disk before a teardown that
    can hang. The DDP module keeps its gloo group alive past the call; freed later (the
    function holding it returns), it destroys the group, which can deadlock
    (``patches.spawn``: 1 launch in 30 of a short torchrun script, a 60 s timeout that lost
    the probe, its last records unwritten); the harness ends a launch whose ranks all recorded
    their end and did not exit (``launch.ranks.END_GRACE_S``)."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if (args[0] if args else kwargs.get("group")) is None and not in_worker():
                instr.end_of_script()
            return original(*args, **kwargs)
        return destroy_process_group
    return make


def patch_collectives(instr: Hooks, dist: Any) -> None:
    """Time and count the script's collectives per step, with their call sites
    (``rank.comm_meter.CommMeter``); record, once per process, that the script calls a collective
    that can sum gradients (event ``collective`` {op}), and that it builds an FSDP module
    (event ``fsdp``)."""
    reported: set[str] = set()
    instr.comm.active = lambda: not instr.stopping and not in_worker()

    def make(op: str) -> Callable[[Any], Any]:
        def wrap(original: Any) -> Any:
            timed = instr.comm.wrap_collective(op, original)

            @functools.wraps(original)
            def collective(*args: Any, **kwargs: Any) -> Any:
                if op in GRADIENT_COLLECTIVES and op not in reported and not instr.stopping \
                        and not in_worker():
                    reported.add(op)
                    instr.event("collective", op=op)
                return timed(*args, **kwargs)
            return collective
        return wrap

    for op in SCRIPT_COLLECTIVES:
        if hasattr(dist, op):
            patch(dist, op, make(op))
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return

    patch(FullyShardedDataParallel, "__init__", event_after(instr, "fsdp"))


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
    """Count the script's host-GPU synchronisations from now on (``rank.comm_meter``): called once
    the script uses CUDA. False, and nothing changed, where this torch has no sync debug mode
    or the script set one itself."""
    import warnings

    import torch

    get = getattr(torch._C, "_cuda_get_sync_debug_mode", None)
    if get is None or not hasattr(torch._C, "_cuda_set_sync_debug_mode") or get() != 0:
        return False
    warnings.filterwarnings("always", message=SYNC_PATTERN, category=UserWarning)
    handles.append(_SyncDebugMode(torch._C, warnings.filters[0]))
    patch(warnings, "showwarning", instr.comm.wrap_showwarning)
    patch(torch.cuda, "synchronize", instr.comm.wrap_synchronize)
    torch._C._cuda_set_sync_debug_mode(1)
    return True
