"""Communication as a rank sees it: DDP's own reducer timers and the script's collectives.

Read by ``profiler.rank.instrument``; patched in by ``profiler.rank.patches``. Every DDP the
script builds gets a runtime logging sample rate (``sample_rate``: every iteration on the CPU,
``CUDA_SAMPLE_RATE`` on a GPU, whose timed iterations wait for their CUDA events), and its
reducer timers are read at the steps divisible by ``every``, sized to ``READ_BUDGET`` of the
step time; each synchronised forward is counted (``ddp_n``), so the store matches a step with
the figures of its own backward (``profiler.store.probe_comm``). The script's collectives are
counted and timed per step and per call site; its host-GPU synchronisations (CUDA) through
torch's sync debug mode set to "warn", never shown to the user. What happens while no step is
open belongs to no step (``between_steps``). Step record fields added here: ``ddp_n``,
``syncs``, ``unsynced``, ``opt_steps``, ``ddp_t``, ``coll_n``, ``coll_s``, ``hsync_n``,
``hsync_s``. In full: docs/internals.md, "Communication in the rank (rank/comm_meter)".
"""

from __future__ import annotations

import linecache
import math
import os
import re
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Optional

from ddp_profile.profiler.store.record import TORCH_DIR

READ_BUDGET = 0.005  # share of the step time the reads of DDP's timers may take
CUDA_SAMPLE_RATE = 16  # a GPU's DDP timed every 16th iteration (a host-GPU wait at each)
MAX_EVERY = 64
TIMER_KEYS = ("forward_compute_time", "backward_compute_time", "backward_comm_time",
              "backward_compute_comm_overlap_time")
# what a DDP module's logging data says of its configuration (recorded once, at the end)
CONFIG_KEYS = ("backend_name", "bucket_cap_bytes", "bucket_sizes", "rebuilt_bucket_sizes",
               "total_parameter_size_bytes", "num_parameter_tensors", "find_unused_parameters",
               "gradient_as_bucket_view", "static_graph", "can_set_static_graph",
               "has_sync_bn", "comm_hook", "broadcast_buffers", "dtypes", "world_size",
               "unused_parameter_size", "is_multi_device_module")
ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG")
SCRIPT_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
                      "reduce_scatter", "reduce_scatter_tensor", "broadcast",
                      "broadcast_object_list", "barrier", "reduce", "gather", "scatter",
                      "all_to_all", "all_to_all_single", "all_reduce_coalesced")


SYNC_WARNING = "synchronizing CUDA operation"  # the text of torch's sync debug warning
SYNC_PATTERN = ".*" + re.escape(SYNC_WARNING)  # a warnings filter's message regex

_PROFILER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_WARNINGS_FILES = {os.path.abspath(warnings.__file__)}


def _caller(frame: Any = None) -> Any:
    """The first frame outside ddp_profile's profiler from ``frame`` (default: the caller's)
    outwards: where the script issued the call."""
    frame = frame or sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PROFILER_DIR):
        frame = frame.f_back
    return frame


def _sync_site(frame: Any) -> tuple[Any, Any]:
    """Where a host sync was issued: the innermost frame outside ddp-profile's profiler, the
    warnings machinery and torch, and the innermost torch frame passed on the way (None when
    the script called the synchronising operation itself)."""
    via = None
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if TORCH_DIR in name:
            via = via or frame
        elif not (name.startswith(_PROFILER_DIR) or os.path.abspath(name) in _WARNINGS_FILES):
            break
        frame = frame.f_back
    return frame, via


def comm_environment() -> dict[str, str]:
    """The NCCL_* / GLOO_* variables of this process (what explains a slow all-reduce)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


class CommMeter:
    """Per-step communication counters of one rank (no lock: the training thread only)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns):
        self._clock = clock
        self.modules: list[weakref.ref] = []
        self.synced: list[int] = []  # synchronised forwards per module, cumulative
        self._last_iteration: list[int] = []
        self.step_syncs = self.step_unsynced = self.step_opt = 0
        self.coll_n, self.coll_ns = 0, 0
        self.sites: dict[tuple[str, int], list[Any]] = {}  # (file, line) -> [op, fn, n, ns]
        self.every, self._closed = 1, 0  # read the timers at steps divisible by ``every``
        self._read_cost_s = math.inf  # the cheapest read seen: what a read costs
        self._inside = False  # a collective implemented with another is counted once
        self.hsync_n, self.hsync_ns = 0, 0
        self.sync_sites: dict[tuple[str, int], list[Any]] = {}  # -> [fn, via, n, ns, outside]

    # ---- DDP -------------------------------------------------------------------------------
    def track(self, ddp: Any) -> None:
        """A DDP module was built: time every synchronised iteration from now on."""
        object.__setattr__(ddp, "_ddp_profile_index", len(self.modules))
        self.modules.append(weakref.ref(ddp))
        self.synced.append(0)
        self._last_iteration.append(0)
        try:
            ddp._set_ddp_runtime_logging_sample_rate(sample_rate(ddp))
        except Exception:  # noqa: BLE001 - an older or a python reducer: no timers
            pass

    def forward(self, ddp: Any) -> None:
        """``DDP.forward`` is about to run: count it as torch's reducer will."""
        import torch

        if not torch.is_grad_enabled():
            return
        index = getattr(ddp, "_ddp_profile_index", None)
        if getattr(ddp, "require_backward_grad_sync", True):
            self.step_syncs += 1
            if index is not None:
                self.synced[index] += 1
        else:
            self.step_unsynced += 1

    def optimizer_stepped(self) -> None:
        self.step_opt += 1

    # ---- the script's collectives -----------------------------------------------------------
    def wrap_collective(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` timed and counted, with its call site (``stopping`` checked by the
        caller's ``active``)."""
        return self._timed(original, lambda ns, frame: self.collective_done(
            op, ns, _caller(frame)))

    def _timed(self, original: Callable[..., Any],
               done: Callable[[int, Any], None]) -> Callable[..., Any]:
        """``original``, timed while active: ``done(elapsed_ns, frame)`` after each call, the
        frame the wrapper's own (a call made inside another timed one is not timed again)."""
        meter = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if meter._inside or not meter.active():
                return original(*args, **kwargs)
            meter._inside = True
            start = meter._clock()
            try:
                return original(*args, **kwargs)
            finally:
                meter._inside = False
                done(meter._clock() - start, sys._getframe(0))
        return timed

    def active(self) -> bool:  # replaced by the instrumentation (stopping, worker process)
        return True

    def in_step(self) -> bool:  # replaced by the instrumentation: a step of a loader is open
        return True

    def between_steps(self) -> None:
        """A step's data wait begins while no step was open: what was counted since the last
        step closed happened outside every step (module docstring)."""
        self.step_syncs = self.step_unsynced = self.step_opt = 0
        self.coll_n = self.coll_ns = self.hsync_n = self.hsync_ns = 0

    def collective_done(self, op: str, elapsed_ns: int, frame: Any) -> None:
        self.coll_n += 1
        self.coll_ns += elapsed_ns
        key = (frame.f_code.co_filename, frame.f_lineno)
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = [op, frame.f_code.co_name, 0, 0, 0]
        site[2] += 1
        site[3] += elapsed_ns
        site[4] += not self.in_step()

    # ---- the script's host-GPU synchronisations ---------------------------------------------
    def wrap_showwarning(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``warnings.showwarning`` that takes torch's sync warnings (counted while active,
        never shown) and passes every other warning to ``original``."""
        meter = self

        def showwarning(message: Any, category: Any, filename: str, lineno: int,
                        file: Any = None, line: Optional[str] = None) -> Any:
            if isinstance(category, type) and issubclass(category, UserWarning) \
                    and SYNC_WARNING in str(message):
                if not meter._inside and meter.active():
                    meter.host_synced(0, sys._getframe(1))
                return None
            return original(message, category, filename, lineno, file, line)
        return showwarning

    def wrap_synchronize(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.cuda.synchronize`` counted and timed (a sync warning it raises is not
        counted again)."""
        return self._timed(original, self.host_synced)

    def host_synced(self, elapsed_ns: int, frame: Any) -> None:
        self.hsync_n += 1
        self.hsync_ns += elapsed_ns
        frame, via = _sync_site(frame)
        key = (frame.f_code.co_filename, frame.f_lineno)
        site = self.sync_sites.get(key)
        if site is None:
            through = None if via is None else (f"{os.path.basename(via.f_code.co_filename)}:"
                                                f"{via.f_lineno} {via.f_code.co_name}")
            site = self.sync_sites[key] = [frame.f_code.co_name, through, 0, 0, 0]
        site[2] += 1
        site[3] += elapsed_ns
        site[4] += not self.in_step()

    # ---- per step ----------------------------------------------------------------------------
    def close_step(self, record: dict[str, Any], step_s: float) -> None:
        """Add this step's counters (and, every ``every`` steps, DDP's timers) to ``record``."""
        fields = self.take_step(step_s)
        if fields:
            record.update(fields)

    def take_step(self, step_s: float) -> Optional[dict[str, Any]]:
        """This step's counters (and, every ``every`` steps, DDP's timers) as step record
        fields, None where there are none; the counters start again. (Its first case, nothing
        to take, is made inline by the rank's step close: ``rank.loaders``.)"""
        if not (self.modules or self.coll_n or self.hsync_n):
            self.step_syncs = self.step_unsynced = self.step_opt = 0
            return None
        fields: dict[str, Any] = {}
        if self.modules:
            fields["ddp_n"] = list(self.synced)
            fields["syncs"], fields["unsynced"] = self.step_syncs, self.step_unsynced
            fields["opt_steps"] = self.step_opt
            self._closed += 1
            if self._closed % self.every == 0:
                timed = self._read_timers(step_s)
                if timed:
                    fields["ddp_t"] = timed
        if self.coll_n:
            fields["coll_n"], fields["coll_s"] = self.coll_n, self.coll_ns / 1e9
        if self.hsync_n:
            fields["hsync_n"], fields["hsync_s"] = self.hsync_n, self.hsync_ns / 1e9
        self.step_syncs = self.step_unsynced = self.step_opt = 0
        self.coll_n = self.coll_ns = self.hsync_n = self.hsync_ns = 0
        return fields

    def _read_timers(self, step_s: float) -> list[list[int]]:
        start = self._clock()
        timed = []
        self._inside = True  # a GPU wait while reading them is ddp-profile's own
        try:
            found = self._logging_data()
        finally:
            self._inside = False
        for index, _module, data in found:
            iteration = int(data.get("iteration") or 0)
            values = [data.get(key) for key in TIMER_KEYS]
            if iteration > self._last_iteration[index] and all(
                    isinstance(v, int) for v in values):
                self._last_iteration[index] = iteration
                timed.append([index, iteration, *values])
        # a read that waited for a CPU (a busy machine) costs no more than the cheapest one
        # did, and ``every`` at most doubles per read: sized by one spike, it would leave a
        # probe with one timed step
        self._read_cost_s = min(self._read_cost_s, (self._clock() - start) / 1e9)
        if step_s > 0:
            wanted = max(1, math.ceil(self._read_cost_s / (READ_BUDGET * step_s)))
            wanted = 1 << (wanted - 1).bit_length()  # a power of two
            self.every = min(MAX_EVERY, wanted, 2 * self.every)
        return timed

    def _logging_data(self) -> list[tuple[int, Any, dict[str, Any]]]:
        """(index, module, its logging data) of each live DDP module that gives it."""
        found = []
        for index, ref in enumerate(self.modules):
            module = ref()
            if module is None:
                continue
            try:
                found.append((index, module, module._get_ddp_logging_data()))
            except Exception:  # noqa: BLE001 - the timers are evidence, never a failure
                continue
        return found

    # ---- at the end ---------------------------------------------------------------------------
    def module_facts(self) -> list[dict[str, Any]]:
        """Each live DDP module's configuration as its logging data states it, plus the
        environment that sizes its communication."""
        facts = []
        for index, module, data in self._logging_data():
            fact = {key: data[key] for key in CONFIG_KEYS if key in data}
            hook = data.get("comm_hook") or getattr(module, "_comm_hooks", None)
            fact["comm_hook"] = _hook_name(hook)
            fact["static_graph"] = bool(getattr(module, "static_graph", False))
            fact.update(module=index, env=comm_environment())
            facts.append(fact)
        return facts

    def site_events(self) -> list[tuple[str, dict[str, Any]]]:
        """Every call site of a collective the script issued (``collective_site``: op, file,
        line, calls, time) and of a host sync (``host_sync_site``: file, line, the source
        line, the torch function it went through, calls, time); ``outside``: the calls made
        while no step was open."""
        collectives = [("collective_site", {"op": op, "file": path, "line": line,
                                            "function": function, "calls": calls,
                                            "seconds": ns / 1e9, "outside": outside})
                       for (path, line), (op, function, calls, ns, outside) in sorted(
                           self.sites.items(), key=lambda item: -item[1][3])][:20]
        syncs = [("host_sync_site", {"file": path, "line": line, "function": function,
                                     "text": linecache.getline(path, line).strip()[:120],
                                     "via": via, "calls": calls, "seconds": ns / 1e9,
                                     "outside": outside})
                 for (path, line), (function, via, calls, ns, outside) in sorted(
                     self.sync_sites.items(), key=lambda item: -item[1][2])][:20]
        return collectives + syncs


def sample_rate(ddp: Any) -> int:
    """The runtime logging sample rate ddp-profile gives a DDP module (module docstring)."""
    return CUDA_SAMPLE_RATE if getattr(ddp, "device_type", "cpu") == "cuda" else 1


def _hook_name(hook: Any) -> Optional[str]:
    """A registered comm hook's name (``_comm_hooks`` holds (hook, state) pairs), or None."""
    if not hook:
        return None
    if isinstance(hook, str):
        return hook
    try:
        first = hook[0][0] if isinstance(hook, (list, tuple)) else hook
        return getattr(first, "__qualname__", None) or getattr(first, "__name__", None) \
            or type(first).__name__
    except (IndexError, TypeError):
        return str(hook)[:80]
