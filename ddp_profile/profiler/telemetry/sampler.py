"""Per-rank telemetry: host (psutil) and GPU (NVML) samplers in background threads.

Each sampler is a daemon thread named ``ddp-profile-sampler-<source>`` that calls
``emit(record)`` every ``interval_s`` with one record::

    {"kind": "sample", "source": "host" | "gpu", "t_ns": <time.time_ns()>, <metric>: float, ...}

Host metrics (CPU use of the CPUs this process may run on, iowait, the rank's RSS, its
DataLoader workers' count and CPU, disk reads) and GPU metrics (utilisation averaged over the
driver's own samples, memory, power, clock, temperature, throttle reasons, PCIe, and GPM
metrics on Hopper and newer) are listed with their units in docs/internals.md, "Per-rank
records"; unknown values are NaN. The GPU sampler also emits ``gpu_status`` once at start and
``gpu_lost`` if the device falls off the bus, after which only host samples continue. No GPU
is a normal case: no exception ever leaves a sampler thread.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterable, Optional

import psutil

from ddp_profile.profiler.telemetry.gpu_sampler import GpuSampler
from ddp_profile.profiler.telemetry.nvml import gpu_status
from ddp_profile.profiler.telemetry.periodic import NAN, Clock, Emit, _PeriodicSampler

__all__ = ["GpuSampler", "HostSampler", "SamplerGroup", "gpu_status", "start_samplers"]




class _ChildFinder:
    """Direct children of a process, from /proc/<pid>/task/<tid>/children.

    Reading every thread's file costs ~25 us a thread (ranks have dozens), so a call reads
    only the threads that had children (always the main thread) and every
    ``full_scan_every``-th call reads them all. A child found under a thread the previous call
    did not read is *late*: it may be older than the previous call. Without /proc: psutil.
    """

    def __init__(self, pid: int, full_scan_every: int = 20):
        self.pid = pid
        self.full_scan_every = full_scan_every
        self._calls = 0
        self._forking_tids: set[str] = {str(pid)}
        self._read_last: Optional[set[str]] = None  # None: everything (or nothing yet)

    def __call__(self) -> tuple[list[int], set[int]]:
        """(children, late children)."""
        task_dir = f"/proc/{self.pid}/task"
        full = self._calls % self.full_scan_every == 0
        self._calls += 1
        try:
            tids = set(os.listdir(task_dir)) if full else set(self._forking_tids)
        except OSError:
            return [p.pid for p in psutil.Process(self.pid).children()], set()
        pids: set[int] = set()
        late: set[int] = set()
        for tid in tids:
            try:
                with open(f"{task_dir}/{tid}/children") as fh:
                    found = [int(x) for x in fh.read().split()]
            except (OSError, ValueError):
                continue
            if found:
                self._forking_tids.add(tid)
                pids.update(found)
                if self._read_last is not None and tid not in self._read_last:
                    late.update(found)
        if full:
            self._forking_tids &= tids | {str(self.pid)}
        self._read_last = None if full else tids
        return sorted(pids), late


def _available_cpus(pid: int) -> list[int]:
    try:
        return sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return list(range(psutil.cpu_count() or 1))


class HostSampler(_PeriodicSampler):
    """CPU (per core, over the CPUs available to ``pid``), iowait, RSS, workers' CPU, disk reads."""

    source = "host"

    def __init__(self, emit: Emit, *, pid: Optional[int] = None, interval_s: float = 0.5,
                 clock: Clock = time.time_ns,
                 worker_pids: Optional[Callable[[], Iterable[int]]] = None):
        super().__init__(emit, interval_s, clock)
        self._worker_pids = worker_pids
        self.pid = os.getpid() if pid is None else int(pid)
        self._proc: Optional[psutil.Process] = None
        self._cpus: list[int] = []
        self._cpu_times: list = []
        self._disk_read: Optional[int] = None
        self._workers: dict[int, tuple[psutil.Process, float]] = {}
        self._children = _ChildFinder(self.pid)
        self._mono = 0.0
        self._primed = False

    def prime(self) -> bool:
        self._proc = psutil.Process(self.pid)
        self._cpus = _available_cpus(self.pid)
        self._cpu_times = psutil.cpu_times(percpu=True)
        self._disk_read = self._read_disk()
        self._mono = time.monotonic()
        self._worker_cpu()
        return True

    def sample_once(self) -> Optional[dict]:
        if self._proc is None:
            self.prime()
        now = time.monotonic()
        elapsed, self._mono = max(now - self._mono, 1e-9), now
        record = self._record()
        record.update(self._cpu())
        try:
            record["rss_bytes"] = float(self._proc.memory_info().rss)
        except psutil.Error:
            record["rss_bytes"] = NAN
        count, cpu_s = self._worker_cpu()
        record["worker_count"] = float(count)
        record["worker_cpu_percent"] = 100.0 * cpu_s / elapsed
        disk = self._read_disk()
        record["disk_read_bps"] = (NAN if disk is None or self._disk_read is None
                                   else max(disk - self._disk_read, 0) / elapsed)
        self._disk_read = disk
        return record

    def _cpu(self) -> dict[str, Any]:
        """Per-core busy % and iowait % from /proc/stat deltas (not psutil.cpu_percent's shared
        state)."""
        times = psutil.cpu_times(percpu=True)
        per_core: list[float] = []
        iowait = total_all = 0.0
        for cpu in self._cpus:
            if cpu >= len(times) or cpu >= len(self._cpu_times):
                continue
            new, old = times[cpu], self._cpu_times[cpu]
            total = sum(new) - sum(old) - (_guest(new) - _guest(old))
            waited = getattr(new, "iowait", 0.0) - getattr(old, "iowait", 0.0)
            idle = (new.idle - old.idle) + waited
            # Clamped: float round-off, and per-CPU iowait/idle counters may step backwards.
            busy = min(max(100.0 * (total - idle) / total, 0.0), 100.0) if total > 0 else 0.0
            per_core.append(busy)
            iowait += max(waited, 0.0)
            total_all += total
        self._cpu_times = times
        if not per_core:
            return {"cpu_percent": NAN, "cpu_max_core_percent": NAN, "cpu_per_core": [],
                    "iowait_percent": NAN}
        return {
            "cpu_percent": sum(per_core) / len(per_core),
            "cpu_max_core_percent": max(per_core),
            "cpu_per_core": per_core,
            "iowait_percent": 100.0 * iowait / total_all if total_all > 0 else 0.0,
        }

    def _worker_cpu(self) -> tuple[int, float]:
        """(live children, CPU seconds they used since the last call)."""
        used = 0.0
        seen: dict[int, tuple[psutil.Process, float]] = {}
        pids, late = self._children()
        if self._worker_pids is not None:  # only the DataLoader's own workers
            allowed = set(self._worker_pids())
            pids = [p for p in pids if p in allowed]
        for child_pid in pids:
            known = self._workers.get(child_pid)
            try:
                proc = known[0] if known else psutil.Process(child_pid)
                times = proc.cpu_times()
            except psutil.Error:
                continue
            cpu = times.user + times.system
            if known is not None:
                used += cpu - known[1]
            elif child_pid not in late and self._primed:  # born since the last call
                used += cpu
            seen[child_pid] = (proc, cpu)
        self._workers = seen
        self._primed = True
        return len(seen), max(used, 0.0)

    @staticmethod
    def _read_disk() -> Optional[int]:
        try:
            counters = psutil.disk_io_counters(perdisk=False)
        except (OSError, RuntimeError):
            return None
        return None if counters is None else int(counters.read_bytes)


def _guest(times: Any) -> float:
    """guest time is already counted in user time on Linux."""
    return getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)


class SamplerGroup:
    """The samplers of one rank; :meth:`stop` joins their threads and may be called repeatedly."""

    def __init__(self, samplers: list[_PeriodicSampler]):
        self.samplers = samplers
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def gpu_status(self) -> dict[str, Any]:
        for sampler in self.samplers:
            if isinstance(sampler, GpuSampler):
                return dict(sampler.status)
        return {"gpu_available": False, "gpu_unavailable_reason": "rank uses no CUDA device"}

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        for sampler in self.samplers:
            sampler.stop(timeout)

    def __enter__(self) -> "SamplerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_samplers(emit: Emit, *, pid: Optional[int] = None,
                   cuda_device_index: Optional[int] = None, pci_bus_id: Optional[str] = None,
                   interval_s: float = 0.5, nvml_lib: Any = None,
                   clock: Clock = time.time_ns,
                   worker_pids: Optional[Callable[[], Iterable[int]]] = None) -> SamplerGroup:
    """Start the host sampler and, for a rank on a CUDA device, the GPU sampler.

    The GPU is named by ``pci_bus_id`` or by ``cuda_device_index`` (mapped to NVML through the
    PCI bus id, in the sampler thread so that NVML start-up does not delay training).
    ``worker_pids`` names the DataLoader workers among the process's children.
    """
    samplers: list[_PeriodicSampler] = [HostSampler(emit, pid=pid, interval_s=interval_s,
                                                    clock=clock, worker_pids=worker_pids)]
    if pci_bus_id is not None or cuda_device_index is not None:
        samplers.append(GpuSampler(emit, pci_bus_id=pci_bus_id, cuda_device_index=cuda_device_index,
                                   interval_s=interval_s, nvml_lib=nvml_lib, clock=clock))
    for sampler in samplers:
        sampler.start()
    return SamplerGroup(samplers)
