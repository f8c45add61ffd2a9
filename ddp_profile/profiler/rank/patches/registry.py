"""What every patch shares: the registry of what was patched (``patch``, undone by
``patches.remove``), ``Hooks`` (what the patches call: ``instrument.Instrumentation``) and
``in_worker`` (every patched function passes straight through in a DataLoader worker)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, Protocol

from ddp_profile.profiler.settings import ProbePlan

originals: list[tuple[Any, str, Any]] = []
handles: list[Any] = []
SPAWNED_DDP: list[Any] = []  # a spawned rank's DDP modules, kept past its function's return


def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__[name] if name in owner.__dict__ else getattr(owner, name)
    originals.append((owner, name, original))
    setattr(owner, name, make(original))


def in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


class Hooks(Protocol):
    """What the patches call: ``instrument.Instrumentation``'s hooks."""

    stopping: bool
    plan: ProbePlan
    comm: Any  # rank.comm_meter.CommMeter
    pin_meter: Any  # rank.loading.loadcost's pin-time meter
    ddp_modules: list[Any]
    screen: Any  # rank.windows.Screen
    current: Any  # the step clock of the step open last (rank.stepclock.StepClock), or None

    def event(self, name: str, **data: Any) -> None: ...
    def on_loader_init(self, loader: Any, bound: inspect.BoundArguments) -> None: ...
    def before_iter(self, loader: Any) -> None: ...
    def on_iter(self, loader: Any, iterator: Any, started_ns: Optional[int] = None) -> None: ...
    def on_next(self, iterator: Any, original_next: Callable[[Any], Any]) -> Any: ...
    def on_optimizer_step(self, *_: Any) -> None: ...
    def gradient_sync(self) -> bool: ...
    def on_exception(self, exc_type: type, exc: BaseException, tb: Any) -> None: ...
    def stop(self, reason: str) -> None: ...
    def end_of_script(self) -> None: ...


Maker = Callable[[Any], Any]  # the original function -> its patched replacement


def event_after(instr: Hooks, name: str) -> Maker:
    """A constructor that records event ``name`` once it ran."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            instr.event(name)
        return __init__
    return make
