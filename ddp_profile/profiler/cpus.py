"""How many CPUs this process may use: THE one place that decides it.

``cpus_available()`` is the smaller of the CPUs in the process's affinity mask and its cgroup's
CPU quota rounded up (cgroup v2 ``cpu.max`` "QUOTA PERIOD", or v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``), which is what a Kubernetes pod's CPU limit sets. The rank context
records it; the sweep and the rules read that record (or call this function in the harness).
"""

from __future__ import annotations

import math
import os
from typing import Optional


def _affinity(pid: int) -> int:
    try:
        return len(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _cgroup_dirs(proc_cgroup: str, root: str) -> list[tuple[str, bool]]:
    """(directory, is_v2) of this process's cgroups that can hold a CPU quota, innermost first."""
    text = _read(proc_cgroup) or ""
    found: list[tuple[str, bool]] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2].lstrip("/")
        v2 = controllers == ""
        if not v2 and "cpu" not in controllers.split(","):
            continue
        base = root if v2 else next((os.path.join(root, d) for d in ("cpu,cpuacct", "cpu")
                                     if os.path.isdir(os.path.join(root, d))), root)
        while True:  # the quota may be set on any ancestor: walk up to the mount
            found.append((os.path.join(base, path), v2))
            if not path:
                break
            path = os.path.dirname(path)
    return found


def cgroup_cpu_quota(proc_cgroup: str = "/proc/self/cgroup",
                     root: str = "/sys/fs/cgroup") -> Optional[float]:
    """The tightest CPU quota (in CPUs) of this process's cgroups, or None when unlimited."""
    quotas = []
    for directory, v2 in _cgroup_dirs(proc_cgroup, root):
        if v2:
            fields = (_read(os.path.join(directory, "cpu.max")) or "").split()
            quota, period = (fields + ["", ""])[:2]
        else:
            quota = _read(os.path.join(directory, "cpu.cfs_quota_us")) or ""
            period = _read(os.path.join(directory, "cpu.cfs_period_us")) or ""
        try:
            q, p = float(quota), float(period)
        except ValueError:  # "max", missing or unreadable: no limit here
            continue
        if q > 0 and p > 0:
            quotas.append(q / p)
    return min(quotas) if quotas else None


def cpus_available(pid: int = 0, proc_cgroup: str = "/proc/self/cgroup",
                   root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup quota (rounded up)."""
    count = _affinity(pid)
    quota = cgroup_cpu_quota(proc_cgroup, root)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota - 1e-9)))
    return max(1, count)


def cpus_per_rank(cpus: float, local_ranks: Optional[int]) -> float:
    """The CPUs one rank may count on: the CPUs available shared by the ranks of one host (as
    observed). The one author of that share: the worker ladder, the capacity model and the
    rules' CPU load read it here."""
    return float(cpus) / max(1, int(local_ranks or 1))


def threads_to_fit(intra_op: Optional[int], local_ranks: Optional[int], worker_cores: float,
                   cpus: Optional[int]) -> Optional[int]:
    """Intra-op threads per rank that fit the CPUs, or None when the ranks do not oversubscribe
    them (THE test: the sweep decides with it whether to measure the counterfactual, the
    ``thread-oversubscription`` rule whether there is a finding).

    Oversubscribed: ``intra_op`` threads x ``local_ranks`` + the cores the DataLoader workers
    were measured busy on (``worker_cores``) > ``cpus``. The fit is what is left for each rank:
    ``max(1, (cpus - worker_cores) // local_ranks)``, and only when it is fewer threads.
    """
    if not intra_op or not local_ranks or not cpus:
        return None
    busy = max(0.0, float(worker_cores or 0.0))
    if intra_op * local_ranks + busy <= cpus:
        return None
    fit = max(1, int((cpus - busy) // local_ranks))
    return fit if fit < intra_op else None
