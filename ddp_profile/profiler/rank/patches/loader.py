"""The patches of the DataLoader and the training loop: ``DataLoader.__init__`` and
``__iter__``, the iterators' ``__next__``, ``Tensor.backward`` and
``DistributedSampler.set_epoch``, each calling its ``Hooks``."""

from __future__ import annotations

import functools
import inspect
import time
from typing import Any

from ddp_profile.profiler.rank.patches.registry import Hooks, Maker, in_worker


def loader_init(instr: Hooks, signature: inspect.Signature) -> Maker:
    """``DataLoader.__init__``: the hooks see (and may override) its bound arguments."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if in_worker() or instr.stopping:
                return original(self, *args, **kwargs)
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            instr.on_loader_init(self, bound)
            original(*bound.args, **bound.kwargs)
        return __init__
    return make


def loader_iter(instr: Hooks) -> Maker:
    """``DataLoader.__iter__``: the iterator adopted, timed from before its workers start."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __iter__(self: Any) -> Any:
            if not (in_worker() or instr.stopping):
                instr.before_iter(self)
            started = time.perf_counter_ns()  # making the iterator starts its workers
            iterator = original(self)
            if not (in_worker() or instr.stopping):
                instr.on_iter(self, iterator, started)
            return iterator
        return __iter__
    return make


def iterator_next(instr: Hooks) -> Maker:
    """``__next__`` of an adopted iterator goes through the hooks (the step clock)."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def __next__(self: Any) -> Any:
            if instr.stopping or getattr(self, "_ddp_profile_state", None) is None:
                return original(self)
            return instr.on_next(self, original)
        return __next__
    return make


def tensor_backward(instr: Hooks) -> Maker:
    """``Tensor.backward``: the open step's first backward marked
    (``StepClock.backward_called``, inline: no call of ours a step)."""
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
            current = instr.current
            if current is not None and current._backward is None \
                    and current._returned is not None:
                current._backward = current._clock()
            return original(self, *args, **kwargs)
        return backward
    return make


def sampler_set_epoch(instr: Hooks) -> Maker:
    def make(original: Any) -> Any:
        @functools.wraps(original)
        def set_epoch(self: Any, epoch: int) -> None:
            instr.event("set_epoch", epoch=int(epoch))
            return original(self, epoch)
        return set_epoch
    return make
