"""The GPU-side view of each step, from CUDA events, without synchronising the training loop.

On CUDA the host runs ahead of the GPU: a host-side data wait only starves the GPU if the GPU
has run out of queued work meanwhile. Two timing events per step tell which: one recorded on
the current stream when the batch reaches the host loop, one when the optimizer step has been
issued. On the GPU's own clock:
``gpu_busy_s``  start(k) -> end(k): the GPU working through step k (what was queued for it)
``gpu_gap_s``   end(k-1) -> start(k): the GPU idle between steps, waiting for the host (data)

A gap that spans time outside every step (``between_steps``: an epoch's end, validation and a
checkpoint before the next iterator's first batch) is recorded as None: the GPU's idle there
belongs to no step, and the steps' time holds none of it.

Events are resolved a few steps later with the non-blocking ``query()``; nothing waits for the
GPU until the probe ends, when the last pending steps are synchronised once.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional

Emit = Callable[[dict[str, Any]], None]
GPU_LOOKUP_BATCHES = 16  # look this many batches for the script's first use of CUDA


class GpuStepTimer:
    def __init__(self, event_factory: Callable[[], Any], emit: Emit, max_pending: int = 256):
        self._new_event = event_factory
        self._emit = emit
        self._max_pending = max_pending
        self._pending: deque = deque()  # (loader_id, step, start, end, after a break)
        self._open: Optional[list] = None
        self._previous_end: Any = None  # end event of the last resolved step
        self._broken = False  # time outside every step since the last step kept

    def between_steps(self) -> None:
        """Time outside every step begins (no step is open): the next kept step's gap is
        not measured. The step still open, whose end event is its last, is kept first."""
        self._close_open()
        self._broken = True

    def step_started(self, loader_id: int, step: int) -> None:
        self._close_open()
        start = self._new_event()
        start.record()
        self._open = [loader_id, step, start, None]

    def compute_issued(self) -> None:
        """The optimizer step was issued: (re-)record the step's end (the last one wins)."""
        if self._open is None:
            return
        end = self._open[3] or self._new_event()
        end.record()
        self._open[3] = end

    def poll(self) -> None:
        """Resolve the finished steps at the head of the queue; waits only when more than
        ``max_pending`` steps are unresolved (the GPU lags far behind: bounded memory)."""
        while self._pending and (len(self._pending) > self._max_pending
                                 or self._done(self._pending[0])):
            head = self._pending.popleft()
            if not self._done(head):
                head[3].synchronize()
            self._resolve(head)

    def finish(self) -> None:
        """At the end of the probe: wait once for what is still pending, and resolve it."""
        self._close_open()
        while self._pending:
            item = self._pending.popleft()
            item[3].synchronize()
            self._resolve(item)

    def _close_open(self) -> None:
        if self._open is not None and self._open[3] is not None:
            self._pending.append((*self._open, self._broken))
            self._broken = False
        self._open = None

    @staticmethod
    def _done(item: tuple) -> bool:
        return bool(item[3].query())

    def _resolve(self, item: tuple) -> None:
        loader_id, step, start, end, broken = item
        gap = (self._previous_end.elapsed_time(start) / 1e3
               if self._previous_end is not None and not broken else None)
        self._emit({"kind": "gpu_step", "loader_id": loader_id, "step": step,
                    "gpu_busy_s": start.elapsed_time(end) / 1e3,
                    "gpu_gap_s": max(0.0, gap) if gap is not None else None})
        self._previous_end = end


def cuda_event_factory() -> Optional[Callable[[], Any]]:
    """Timing events on the current CUDA stream, or None when CUDA is not in use here."""
    try:
        import torch

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
    except Exception:  # noqa: BLE001
        return None
    return lambda: torch.cuda.Event(enable_timing=True)


class GpuSide:
    """The rank's GPU side: looks for the script's use of CUDA at its first ``lookups``
    batches; once found, times every step on the GPU (``GpuStepTimer``) and calls
    ``on_cuda`` once (the host syncs' watch). Inert where the script never uses CUDA: ``live``
    turns False once its lookups found none, and the step's path then makes no call here."""

    def __init__(self, emit: Emit, on_cuda: Callable[[], None],
                 lookups: int = GPU_LOOKUP_BATCHES,
                 factory: Callable[[], Optional[Callable[[], Any]]] = cuda_event_factory):
        self._emit, self._on_cuda, self._factory = emit, on_cuda, factory
        self._lookups_left = lookups
        self.timer: Optional[GpuStepTimer] = None
        self.live = lookups > 0  # looking for CUDA, or timing the steps on it

    def step_started(self, loader_id: int, step: int) -> None:
        if self.timer is None and self._lookups_left > 0:
            self._lookups_left -= 1
            events = self._factory()
            if events is not None:
                self.timer = GpuStepTimer(events, self._emit)
                self._on_cuda()
            self.live = self.timer is not None or self._lookups_left > 0
        if self.timer is not None:
            self.timer.step_started(loader_id, step)

    def compute_issued(self) -> None:
        if self.timer is not None:
            self.timer.compute_issued()

    def between_steps(self) -> None:
        if self.timer is not None:
            self.timer.between_steps()

    def poll(self) -> None:
        if self.timer is not None:
            self.timer.poll()

    def finish(self) -> None:
        if self.timer is not None:
            self.timer.finish()
