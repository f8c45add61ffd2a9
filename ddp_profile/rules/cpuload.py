"""How busy the CPUs were during one probe, from the host samples (``CpuLoad``, ``cpu_load``):
read by the loading rules (``rules.findings.data``) and the recommendation's ceiling notes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ddp_profile.profiler.cpus import cpus_per_rank
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.base import Thresholds, pct
from ddp_profile.rules.tables import cpus_available, local_ranks, metric_median, probe_context


@dataclass(frozen=True)
class CpuLoad:
    """How busy the CPUs were during one probe (None where not measured)."""

    host_percent: Optional[float]  # median CPU % over the CPUs available
    worker_share: Optional[float]  # median worker CPU / cores available to one rank
    iowait_percent: Optional[float]
    compute_on_cpu: bool = False  # device "cpu": the training itself keeps the host busy

    def _host_counts(self) -> bool:
        """Whole-host CPU says little about loading when the model also runs on the CPUs."""
        return self.host_percent is not None and not (
            self.compute_on_cpu and self.worker_share is not None)

    def saturated(self, thresholds: Thresholds) -> bool:
        return ((self._host_counts() and self.host_percent >= thresholds.cpu_saturated_percent)
                or (self.worker_share is not None
                    and self.worker_share >= thresholds.worker_cpu_saturated_share))

    def idle(self, thresholds: Thresholds) -> bool:
        if self.saturated(thresholds) or (self.host_percent is None
                                          and self.worker_share is None):
            return False
        if self.worker_share is not None and (
                self.worker_share >= thresholds.worker_cpu_idle_share):
            return False
        return not self._host_counts() or self.host_percent < thresholds.cpu_idle_percent

    def describe(self) -> str:
        parts = []
        if self.host_percent is not None:
            parts.append(f"host CPU {self.host_percent:.0f} %")
        if self.worker_share is not None:
            parts.append(f"workers using {pct(self.worker_share)} of the rank's cores")
        if self.iowait_percent is not None:
            parts.append(f"iowait {self.iowait_percent:.0f} %")
        return ", ".join(parts)


def cpu_load(run: Run, probe: ProbeRecord) -> CpuLoad:
    probe_id = probe.id
    worker = metric_median(run, probe_id, "host", "worker_cpu_percent")
    cpus = cpus_available(run, probe_id)
    share = None
    if worker is not None and cpus:
        share = worker / (100.0 * cpus_per_rank(cpus, local_ranks(run, probe_id)))
    device = probe_context(run, probe_id).get("device") or run.summary.get("device")
    return CpuLoad(metric_median(run, probe_id, "host", "cpu_percent"), share,
                   metric_median(run, probe_id, "host", "iowait_percent"),
                   compute_on_cpu=device == "cpu")
