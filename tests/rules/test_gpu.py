"""pin-memory, batch-size-headroom, low-gpu-utilization."""

from __future__ import annotations

from ddp_profile.rules import Thresholds
from ddp_profile.rules.findings.gpu import batch_size_headroom, low_gpu_utilization, pin_memory
from tests.rules.tables import RunBuilder, empty_run

T = Thresholds()
GIB = 2**30


def pin_run(pinned_wait: float, device: str = "cuda", base_wait: float = 0.03):
    return (RunBuilder(device=device)
            .probe("base", kind="baseline", pin_memory=False).steps(data_wait=base_wait)
            .probe("pin", pin_memory=True).steps(data_wait=pinned_wait).build())


def test_pin_memory_when_pinned_twin_faster():
    finding = pin_memory(pin_run(pinned_wait=0.005), T)
    assert finding is not None and finding.rule == "pin-memory"
    assert finding.severity == "medium" and "faster" in finding.evidence


def test_pin_memory_not_when_pinning_does_not_help():
    assert pin_memory(pin_run(pinned_wait=0.03), T) is None


def test_pin_memory_pools_a_probe_with_its_re_measurement():
    """A short probe of the pinned settings read fast, its longer re-measurement as slow as the
    unpinned baseline (an H100 run: 1.35x alone, 0.95x re-measured): pooled as the choice pools
    them, pinning is not faster beyond noise, and the finding stays silent."""
    run = (RunBuilder(device="cuda")
           .probe("base", kind="baseline", pin_memory=False).steps(data_wait=0.03, jitter=0.02)
           .probe("pin", pin_memory=True).steps(data_wait=0.005, jitter=0.02, seed=1)
           .probe("pin-again", pin_memory=True).steps(n=40, data_wait=0.03, jitter=0.02, seed=2)
           .build())
    assert pin_memory(run, T) is None
    alone = (RunBuilder(device="cuda")
             .probe("base", kind="baseline", pin_memory=False).steps(data_wait=0.03, jitter=0.02)
             .probe("pin", pin_memory=True).steps(data_wait=0.005, jitter=0.02, seed=1)
             .build())
    assert pin_memory(alone, T) is not None


def test_low_gpu_utilization_names_pageable_copies_when_pinning_measured_faster():
    run = (RunBuilder(device="cuda")
           .probe("base", kind="baseline", pin_memory=False).steps(data_wait=0.001, compute=0.05)
           .samples("gpu", gpu_util_percent=20.0)
           .probe("pin", pin_memory=True).steps(data_wait=0.001, compute=0.03)
           .build())
    finding = low_gpu_utilization(run, T)
    assert finding is not None and "pageable memory" in finding.recommendation


def test_pin_memory_not_on_cpu():
    assert pin_memory(pin_run(pinned_wait=0.005, device="cpu"), T) is None


def test_pin_memory_low_when_data_bound_and_unmeasured():
    run = (RunBuilder(device="cuda").probe("base", kind="baseline", pin_memory=False)
           .steps(data_wait=0.05).build())
    assert pin_memory(run, T).severity == "low"


def test_pin_memory_not_when_already_pinned():
    run = (RunBuilder(device="cuda").probe("base", kind="baseline", pin_memory=True)
           .steps(data_wait=0.05).build())
    assert pin_memory(run, T) is None


def headroom_run(reserved_gib: float, big_batch_compute: float | None = None,
                 big_status: str = "ok"):
    builder = (RunBuilder(device="cuda").probe("base", kind="baseline", batch_size=32)
               .steps(compute=0.05)
               .event("cuda_memory", max_allocated=reserved_gib * GIB,
                      max_reserved=reserved_gib * GIB, total=80 * GIB))
    if big_batch_compute is not None:
        builder.probe("big", batch_size=64, status=big_status)
        if big_status == "ok":
            builder.steps(compute=big_batch_compute)
    return builder.build()


def test_headroom_when_memory_unused_and_larger_batch_faster():
    finding = batch_size_headroom(headroom_run(10, big_batch_compute=0.06), T)
    assert finding is not None and finding.rule == "batch-size-headroom"
    assert finding.severity == "medium"
    assert "12 %" in finding.evidence and "batch_size=64" in finding.evidence


def test_headroom_low_when_larger_batch_unmeasured():
    assert batch_size_headroom(headroom_run(10), T).severity == "low"


def test_no_headroom_when_memory_mostly_used():
    assert batch_size_headroom(headroom_run(60, big_batch_compute=0.06), T) is None


def test_no_headroom_when_larger_batch_not_faster():
    assert batch_size_headroom(headroom_run(10, big_batch_compute=0.12), T) is None


def test_no_headroom_when_larger_batch_ran_out_of_memory():
    assert batch_size_headroom(headroom_run(10, 0.06, big_status="oom"), T) is None


def test_headroom_from_gpu_samples():
    run = (RunBuilder(device="cuda").probe("base", kind="baseline").steps()
           .samples("gpu", gpu_mem_used_bytes=8 * GIB, gpu_mem_total_bytes=80 * GIB).build())
    assert batch_size_headroom(run, T) is not None


def util_run(util: float, data_wait: float):
    return (RunBuilder(device="cuda").probe("base", kind="baseline")
            .steps(data_wait=data_wait, compute=0.05).samples("gpu", gpu_util_percent=util)
            .build())


def test_low_gpu_utilization_when_host_bound():
    finding = low_gpu_utilization(util_run(util=25.0, data_wait=0.001), T)
    assert finding is not None and "25 %" in finding.evidence


def test_low_gpu_utilization_not_when_busy():
    assert low_gpu_utilization(util_run(util=90.0, data_wait=0.001), T) is None


def test_low_gpu_utilization_not_when_data_bound():
    assert low_gpu_utilization(util_run(util=25.0, data_wait=0.05), T) is None


def test_gpu_rules_need_gpu_measurements():
    cpu_only = RunBuilder().probe("base", kind="baseline").steps(data_wait=0.001).build()
    for rule in (pin_memory, batch_size_headroom, low_gpu_utilization):
        assert rule(cpu_only, T) is None
        assert rule(empty_run(), T) is None
