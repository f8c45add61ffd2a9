"""Rules about the GPU side: pinned copies, unused memory, an idle GPU fed by a busy host.

Each rule is ``rule(run, thresholds, known) -> Finding | None`` (see ``rules.base``). A CPU-only run
has no GPU samples or ``cuda_memory`` events, so these rules return None there.
"""

from __future__ import annotations

import math
from typing import Optional

from ddp_profile.profiler.decide.choose import better, candidate_of, most_certain
from ddp_profile.profiler.store.probes import ProbeRecord, Status
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.alternations import Evidence
from ddp_profile.rules.base import Advice, Finding, Thresholds, describe_config, finite, pct
from ddp_profile.rules.tables import (
    baseline_probe,
    data_wait,
    events_named,
    fastest,
    is_data_bound,
    loader_info,
    measured_probes,
    metric,
    metric_median,
    probe_context,
)

TWIN_KEYS = ("num_workers", "prefetch_factor", "batch_size")


def is_cuda(run: Run, probe_id: str) -> bool:
    device = probe_context(run, probe_id).get("device") or run.summary.get("device")
    return device == "cuda"


def _pinned(run: Run, probe: ProbeRecord) -> Optional[bool]:
    if probe.config.pin_memory is not None:
        return bool(probe.config.pin_memory)
    value = loader_info(run, probe.id).get("pin_memory")
    return None if value is None else bool(value)


def _same_settings(a: ProbeRecord, b: ProbeRecord) -> bool:
    return all(getattr(a.config, k) == getattr(b.config, k) for k in TWIN_KEYS)


def _pin_gain(run: Run) -> Optional[tuple[float, ProbeRecord, bool]]:
    """Best throughput ratio pinned / unpinned among configurations differing only in
    pin_memory, the pinned probe, and whether it is faster beyond noise.

    Each configuration's measurements (a probe and its longer re-measurement, say) are pooled
    as the choice pools them (``decide.choose.most_certain``), and "beyond noise" is the
    choice's test (``better``): a short, unstable probe never speaks alone for its setting.
    """
    probes = {p.id: p for p in measured_probes(run)}
    pooled = most_certain([candidate_of(p) for p in probes.values()])
    best = None
    for pinned in (c for c in pooled if c.config.pin_memory is True):
        for plain in (c for c in pooled if c.config.pin_memory is False):
            if _same_settings(probes[pinned.id], probes[plain.id]):
                gain = pinned.throughput / plain.throughput
                if best is None or gain > best[0]:
                    best = (gain, probes[pinned.id], better(pinned, plain))
    return best


def pin_memory(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
               ) -> Optional[Finding]:
    """A CUDA run copies batches from pageable memory, and that measurably costs.

    Trigger: CUDA device, the baseline runs with pin_memory off, and either a pinned probe is
    >= ``pin_speedup`` x faster than its twin differing only in pin_memory, beyond the noise
    of the two measurements ("medium"), or no such twin was measured and the baseline is
    data-bound ("low").
    """
    base = baseline_probe(run)
    if base is None or not is_cuda(run, base.id) or _pinned(run, base) is not False:
        return None
    measured = _pin_gain(run)
    if measured is not None:
        gain, pinned, beyond_noise = measured
        if gain < thresholds.pin_speedup or not beyond_noise:
            return None
        evidence = (f"With {describe_config(pinned.config)} the run is {gain:.2f}x faster than the "
                    "same settings with pin_memory=False.")
        severity = "medium"
    elif is_data_bound(run, base, thresholds):
        evidence = (f"The CUDA baseline waits {pct(data_wait(run, base)[0])} of each step for "
                    "data with pin_memory=False (no pinned probe was measured to compare).")
        severity = "low"
    else:
        return None
    return Finding(
        rule="pin-memory", severity=severity, title="Batches are not pinned",
        evidence=evidence,
        advice=Advice(change="pin_memory=True", wants=lambda config: config.pin_memory is True,
                      basis="copies from pageable memory cannot overlap compute",
                      measure="--pin-memory true,false",
                      extra="Move batches with .to(device, non_blocking=True)."))


def gpu_memory_share(run: Run, probe_id: str) -> Optional[float]:
    """Peak GPU memory used / total in one probe: cuda_memory events, else GPU samples."""
    shares = []
    for data in events_named(run, "cuda_memory", probe_id)["data"]:
        peak = data.get("max_reserved") or data.get("max_allocated")
        if finite(peak) and finite(data.get("total")) and data["total"] > 0:
            shares.append(peak / data["total"])
    if shares:
        return max(shares)
    used = metric(run, probe_id, "gpu", "gpu_mem_used_bytes")
    total = metric_median(run, probe_id, "gpu", "gpu_mem_total_bytes")
    if used is None or not total:
        return None
    return float(used.max()) / total


def batch_size_headroom(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                        ) -> Optional[Finding]:
    """Most GPU memory is unused, and larger batches are faster where measured.

    Trigger: the baseline's peak GPU memory < ``gpu_mem_unused_share`` of the total, no probe
    with a larger batch ran out of memory, and either a larger-batch probe reached
    >= ``batch_gain`` x the baseline throughput ("medium") or none was measured ("low").
    """
    base = baseline_probe(run)
    if base is None:
        return None
    share = gpu_memory_share(run, base.id)
    batch = base.config.batch_size
    if share is None or batch is None or share >= thresholds.gpu_mem_unused_share:
        return None
    larger = [p for p in run.records
              if p.config.batch_size is not None and p.config.batch_size > batch]
    if any(p.status == Status.OOM for p in larger):
        return None
    best = fastest(p for p in larger if p.ok and p.counts_for_choice)
    memory = f"Peak GPU memory is {pct(share)} of the device with batch_size={batch}"
    if best is not None:
        gain = best.throughput / base.throughput if finite(base.throughput) else math.nan
        if not gain >= thresholds.batch_gain:
            return None
        evidence, severity = (f"{memory}; batch_size={best.config.batch_size} gave "
                              f"{gain:.2f}x the samples/s."), "medium"
    else:
        evidence, severity = f"{memory}; no larger batch size was measured.", "low"
    return Finding(
        rule="batch-size-headroom", severity=severity, title="GPU memory left unused",
        evidence=evidence,
        advice=Advice(change=f"batch_size={2 * batch}",
                      wants=lambda config: (config.batch_size or 0) > batch,
                      basis=f"only {pct(share)} of the GPU memory is used",
                      measure=f"--batch-size {batch},{2 * batch},{4 * batch}",
                      extra=("Scale the learning rate with the global batch size and check "
                             "convergence.")))


def low_gpu_utilization(run: Run, thresholds: Thresholds, known: Optional[Evidence] = None
                        ) -> Optional[Finding]:
    """The GPU is mostly idle although the loop is not waiting on data: host-bound.

    Trigger: the baseline's median ``gpu_util_percent`` < ``gpu_util_low_percent`` while its
    data-wait fraction < ``data_wait_fraction``.
    """
    base = baseline_probe(run)
    if base is None:
        return None
    util = metric_median(run, base.id, "gpu", "gpu_util_percent")
    waited = data_wait(run, base)
    if util is None or waited is None or util >= thresholds.gpu_util_low_percent:
        return None
    if waited[0] >= thresholds.data_wait_fraction:
        return None
    recommendation = ("Cut per-step host overhead: torch.compile or CUDA graphs for many "
                      "small kernels, a larger batch, and no .item()/.cpu() syncs inside the "
                      "step.")
    pinned = _pin_gain(run) if _pinned(run, base) is False else None
    if pinned is not None and pinned[2] and pinned[0] >= thresholds.pin_speedup:
        recommendation = (f"Copies from pageable memory are part of it: pinned, the same "
                          f"settings ran {pinned[0]:.2f}x as fast (see pin-memory). "
                          + recommendation)
    return Finding(
        rule="low-gpu-utilization", severity="medium",
        title="GPU idle while the host runs the loop",
        evidence=(f"Median GPU utilisation is {util:.0f} % while waiting for data costs only "
                  f"{pct(waited[0])} of each step."),
        recommendation=recommendation)


RULES = [pin_memory, batch_size_headroom, low_gpu_utilization]
