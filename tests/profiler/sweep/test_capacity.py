"""The capacity model on modelled workloads (latency-bound, CPU-bound, mixed, memory-capped), and
the screens' climb over it."""

from __future__ import annotations

import math
from typing import Optional

import pytest

from ddp_profile.profiler.decide.capacity import (
    Capacity,
    bound_of,
    capacity_model,
    loading_cost,
    loop_demand,
)
from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.profiler.sweep.climb import CLIMB_STOP_CPU_SHARE, ClimbPoint, next_workers
from ddp_profile.reports.console import loading_line


def batches(cpu_ms: float, wait_ms: float, count: int = 20, size: int = 16, pid: int = 1,
            t0: int = 0, runq_ms: Optional[float] = None) -> list[dict]:
    """``count`` batch records of a loader whose samples cost ``cpu_ms`` + ``wait_ms`` (+
    ``runq_ms`` runnable without a CPU, recorded as ``runq_s``; None: not recorded)."""
    runq = runq_ms or 0.0
    return [{"kind": "batch_cost", "pid": pid, "t_ns": t0 + i, "samples": size,
             "cpu_s": size * cpu_ms / 1e3, "wall_s": size * (cpu_ms + wait_ms + runq) / 1e3,
             "runq_s": None if runq_ms is None else size * runq_ms / 1e3,
             "collate_s": 1e-4} for i in range(count)]


def probe(cost, workers: int, demand: float, rss: int = 0) -> ProbeRecord:
    loading = {**cost.to_dict(), "worker_private_rss": rss or None}
    return ProbeRecord.from_json({"id": f"p{workers}", "status": "ok", "kind": "sweep",
                                  "loading": loading, "loop_demand": demand,
                                  "config": {"num_workers": workers}})


def test_loading_cost_separates_cpu_from_waiting():
    cost = loading_cost([(batches(0.5, 3.0), None)])
    assert cost.cpu_per_sample_s == pytest.approx(0.5e-3)
    assert cost.wait_per_sample_s == pytest.approx(3.0e-3)
    assert cost.batches == 19  # the producer's first batch (start-up) is left out
    assert cost.to_dict()["bound"] == "wait"


def test_loading_cost_uses_the_measured_window_when_it_has_batches():
    early, late = batches(5.0, 0.0, count=5, t0=0), batches(1.0, 0.0, count=10, t0=100)
    cost = loading_cost([(early + late, 100)])
    assert cost.cpu_per_sample_s == pytest.approx(1e-3) and cost.batches == 10


def test_the_share_read_from_storage_is_the_producers_storage_bytes_over_bytes_read():
    records = batches(0.5, 3.0)
    for i, record in enumerate(records):  # 16 samples of 128 KiB; half of them cold
        record.update(read_b=16 * 131072, storage_b=16 * 131072 if i % 2 else 0)
    cost = loading_cost([(records, None)])
    assert cost.read_per_sample_bytes == 131072
    assert cost.storage_share == pytest.approx(10 / 19)  # the first batch is left out
    assert cost.to_dict()["storage_share"] == pytest.approx(10 / 19)
    tiny = batches(0.5, 3.0)
    for record in tiny:  # 8 bytes a sample say nothing of storage
        record.update(read_b=16 * 8, storage_b=0)
    assert loading_cost([(tiny, None)]).storage_share is None
    assert loading_cost([(batches(0.5, 3.0), None)]).storage_share is None  # not recorded


def test_bytes_read_on_sampled_batches_are_averaged_over_those_batches_samples():
    """The meter reads the bytes on a producer's first batches and one in eight after
    (``rank.loading.sampling``; here, every eighth): the per-sample figures are those
    batches' own, however many samples the batches without them hold."""
    records = batches(0.5, 3.0, count=40, size=16) + batches(0.5, 3.0, count=40, size=32,
                                                                pid=2)
    for i, record in enumerate(records[:40]):
        if i < 8 or i % 8 == 0:
            record.update(read_b=16 * 4096, storage_b=16 * 1024)
    for i, record in enumerate(records[40:]):
        if i < 8 or i % 8 == 0:
            record.update(read_b=32 * 4096, storage_b=0)
    cost = loading_cost([(records, 30)])  # the measured window: t_ns >= 30 (i >= 30)
    assert cost.batches == 20
    assert cost.read_per_sample_bytes == 4096  # batch 32 of each producer: 48 samples
    assert cost.storage_per_sample_bytes == pytest.approx(16 * 1024 / 48)
    assert cost.storage_share == pytest.approx(16 * 1024 / (48 * 4096))


def test_no_batches_no_cost():
    assert loading_cost([([], None)]) is None


def test_loop_demand_is_the_slowest_ranks_pace_without_data_wait():
    step = {"measured": True, "samples": 16, "compute_s": 0.01, "other_s": 0.0,
            "data_wait_s": 0.5}
    slow = {**step, "compute_s": 0.02}
    assert loop_demand([[step] * 10, [slow] * 10]) == pytest.approx(320 / 0.2)
    assert loop_demand([[{**step, "measured": False}]]) is None


def test_bound_by_cpu_share():
    assert bound_of(0.9) == "cpu" and bound_of(0.05) == "wait" and bound_of(0.5) == "mixed"


def test_latency_bound_loading_needs_more_workers_than_cpus():
    # 3 ms asleep, 0.1 ms CPU per sample; 2 ranks with 1 CPU each; the loop eats 6000/s
    model = Capacity(cpu_per_sample_s=1e-4, wait_per_sample_s=3e-3, cpus_per_rank=1.0,
                     ranks=2, demand=6000.0, memory_workers=None)
    assert model.bound == "wait"
    assert model.supply(1) == pytest.approx(2 / 3.1e-3)
    assert model.supply(8) == pytest.approx(8 * 2 / 3.1e-3)
    assert model.workers_for_demand() == math.ceil(3000 * 3.1e-3)  # 10 > 1 CPU
    assert model.throughput(10) == pytest.approx(6000.0)
    # in the loop: one sample costs the compute and the load, one after the other
    assert model.throughput(0) == pytest.approx(2 / (2 / 6000 + 3.1e-3))


def test_cpu_bound_loading_stops_where_the_cpus_saturate():
    # 3.4 ms CPU per sample, 2 CPUs per rank: at most 2 / 3.4 ms = 588 samples/s per rank
    model = Capacity(cpu_per_sample_s=3.4e-3, wait_per_sample_s=0.1e-3, cpus_per_rank=2.0,
                     ranks=1, demand=29400.0, memory_workers=None)
    assert model.bound == "cpu"
    assert model.cpu_limit == pytest.approx(2 / 3.4e-3)
    assert model.supply(64) == pytest.approx(model.cpu_limit)
    assert model.workers_for_demand() == 3  # ceil(588 * 3.5 ms): the CPUs are full
    assert model.throughput(3) == pytest.approx(model.cpu_limit)


def test_mixed_loading_climbs_until_the_cpus_saturate():
    model = Capacity(cpu_per_sample_s=1e-3, wait_per_sample_s=1e-3, cpus_per_rank=2.0,
                     ranks=1, demand=10000.0, memory_workers=None)
    assert model.bound == "mixed"
    assert model.workers_for_demand() == 4  # 2000/s: 4 workers of 500/s each
    assert model.supply(8) == model.supply(4) == pytest.approx(2000.0)


def test_memory_caps_the_workers():
    cost = loading_cost([(batches(0.1, 5.0), None)])
    model = capacity_model([probe(cost, 2, 8000.0, rss=1 << 30)], cpus_per_rank=2.0, ranks=2,
                           memory_available=12 << 30)
    assert model.memory_workers == 6  # 12 GiB / 2 ranks / 1 GiB
    assert model.max_workers == 6
    assert model.workers_for_demand() == 6  # 4000/s per rank would need 21
    curve = model.to_dict()["curve"]
    assert max(p["num_workers"] for p in curve) == 6


def test_model_from_probes_takes_the_ceiling_as_demand_when_measured():
    cost = loading_cost([(batches(0.2, 2.0), None)])
    probes = [probe(cost, 0, 900.0), probe(cost, 2, 1200.0)]
    from_loop = capacity_model(probes, cpus_per_rank=1.0, ranks=2, memory_available=None)
    assert from_loop.demand == 1200.0
    from_ceiling = capacity_model(probes, 1.0, 2, None, ceiling=5000.0)
    assert from_ceiling.demand == 5000.0
    assert capacity_model([probes[0].amended({"loading": None})], 1.0, 2, None) is None


def test_summary_capacity_per_rank_cpus_and_measured_points():
    from ddp_profile.profiler.decide.capacity import run_capacity

    cost = loading_cost([(batches(0.1, 3.0), None)])
    probes = [probe(cost, 0, 6000.0).amended({"kind": "baseline", "throughput": 560.0}),
              probe(cost, 2, 1800.0).amended({"throughput": 1150.0}),
              probe(cost, 4, 0.0).amended({"status": "crash", "loading": None})]
    context = {"world_size": 2, "cpus_available": 2, "memory_available": None}
    capacity = run_capacity(probes, context, local_ranks=2, ceiling=None)
    assert capacity["cpus_per_rank"] == 1.0 and capacity["ranks"] == 2
    assert capacity["demand"] == 6000.0 and capacity["demand_source"] == "loop"
    assert [m["num_workers"] for m in capacity["measured"]] == [0, 2]
    assert capacity["bound"] == "wait" and capacity["workers_for_demand"] == 10
    assert run_capacity([probes[2]], context, 2, None) is None


# ---- the climb ----------------------------------------------------------------------------

def modelled(model: Capacity, workers: int) -> ClimbPoint:
    """What a probe of ``workers`` would measure if the model were the truth."""
    tp = model.throughput(workers)
    return ClimbPoint(workers, tp, rse=0.01, waits=tp < 0.95 * model.demand,
                      cpu_share=model.cpu_share)


def climb(model: Capacity, first: list[int]) -> list[int]:
    points = [modelled(model, w) for w in first]
    while (following := next_workers(points, model.max_workers)) is not None:
        points.append(modelled(model, following))
    return [p.workers for p in points]


def test_latency_bound_climbs_past_the_cpus_until_the_loop_stops_waiting():
    model = Capacity(cpu_per_sample_s=1e-4, wait_per_sample_s=3e-3, cpus_per_rank=1.0,
                     ranks=2, demand=6000.0, memory_workers=None)
    assert climb(model, [0, 1, model.workers_for_demand()]) == [0, 1, 10]  # 10 meets it
    # a prediction that fell short (the loop eats more than thought): keep doubling
    hungry = Capacity(1e-4, 3e-3, 1.0, 2, demand=30000.0, memory_workers=None)
    assert climb(hungry, [0, 1, 10]) == [0, 1, 10, 20, 40, 64]


def test_memory_bounds_the_climb():
    model = Capacity(1e-4, 3e-3, 1.0, 2, demand=30000.0, memory_workers=24)
    assert climb(model, [0, 1, 10]) == [0, 1, 10, 20, 24]


def test_cpu_bound_loading_does_not_climb_past_saturation():
    model = Capacity(cpu_per_sample_s=3.4e-3, wait_per_sample_s=1e-4, cpus_per_rank=1.0,
                     ranks=2, demand=6000.0, memory_workers=None)
    assert climb(model, [0, 1, model.workers_for_demand()]) == [0, 1, 2]


def test_a_flat_top_stops_the_climb():
    points = [ClimbPoint(1, 1000.0, 0.01), ClimbPoint(2, 1010.0, 0.01)]
    assert next_workers(points, 64) is None
    rising = [ClimbPoint(1, 1000.0, 0.01), ClimbPoint(2, 1900.0, 0.01, cpu_share=0.1)]
    assert next_workers(rising, 64) == 4
    assert next_workers(rising, 3) == 3 and next_workers(rising, 2) is None


def test_the_climb_asks_the_choice_whether_a_count_is_faster_beyond_noise():
    """5 % faster in the same launch (a screen's windows) is beyond noise; between two
    launches, which each run at a level of their own (``launch_sd``), it is not: the climb
    and the choice decide alike."""
    same = [ClimbPoint(1, 1000.0, 0.005, launch="p001"),
            ClimbPoint(2, 1050.0, 0.005, cpu_share=0.1, launch="p001")]
    assert next_workers(same, 64) == 4
    apart = [same[0], ClimbPoint(2, 1050.0, 0.005, cpu_share=0.1, launch="p002")]
    assert next_workers(apart, 64) is None


def test_measured_cpu_saturation_decides_where_the_climb_stops():
    # half CPU, half waiting, and 2 CPUs still 60 % idle: more workers hide more waiting
    mixed = [ClimbPoint(1, 500.0, 0.01, cpu_share=0.5, cpu_busy=0.4),
             ClimbPoint(3, 1200.0, 0.01, cpu_share=0.5, cpu_busy=0.6)]
    assert next_workers(mixed, 64) == 6
    saturated = [*mixed[:1], ClimbPoint(3, 600.0, 0.01, cpu_share=0.5, cpu_busy=0.95)]
    assert next_workers(saturated, 64) is None  # the CPUs are the limit now
    # ... unless the last step still paid strongly: then the next one is measured
    strong = [*mixed[:1], ClimbPoint(3, 1200.0, 0.01, cpu_share=0.5, cpu_busy=0.95)]
    assert next_workers(strong, 64) == 6
    # mostly waiting, yet the CPUs are full (other work on the host): no more workers
    waiting = [ClimbPoint(1, 500.0, 0.01, cpu_share=0.1),
               ClimbPoint(3, 610.0, 0.01, cpu_share=0.1, cpu_busy=0.97)]
    assert next_workers(waiting, 64) is None
    # CPU-bound loading stops even where the samples caught idle CPUs
    assert next_workers([*mixed[:1], ClimbPoint(3, 1200.0, 0.01, cpu_share=0.9,
                                                cpu_busy=0.6)], 64) is None
    # CPU use not sampled: the loading's CPU share stands in
    assert next_workers([*mixed[:1], ClimbPoint(3, 1200.0, 0.01, cpu_share=0.5)], 64) is None


# ---- runnable time (CPU contention) apart from waiting ------------------------------------

def test_cpu_bound_loading_on_busy_cpus_is_cpu_bound_not_waiting():
    # 8 workers of a 2 ms CPU transform on 2 CPUs: each sample sits 6 ms runnable, blocked 0.05
    contended = batches(2.0, 0.05, runq_ms=6.0)
    cost = loading_cost([(contended, None)])
    assert cost.runq_per_sample_s == pytest.approx(6e-3)
    assert cost.wait_per_sample_s == pytest.approx(0.05e-3)
    assert cost.to_dict()["bound"] == "cpu" and cost.cpu_share >= CLIMB_STOP_CPU_SHARE
    assert cost.runq_share == pytest.approx(6.0 / 8.05)
    # the same batches without the run queue: wall - CPU alone called it waiting
    blind = loading_cost([([{**b, "runq_s": None} for b in contended], None)])
    assert blind.runq_per_sample_s is None
    assert blind.wait_per_sample_s == pytest.approx(6.05e-3)
    assert blind.to_dict()["bound"] == "wait"


def test_sleep_bound_loading_without_runq_stays_wait_bound():
    cost = loading_cost([(batches(0.1, 3.0, runq_ms=0.0), None)])
    assert cost.runq_per_sample_s == 0.0 and cost.runq_share == 0.0
    assert cost.wait_per_sample_s == pytest.approx(3e-3)
    assert cost.to_dict()["bound"] == "wait"


def test_runq_never_exceeds_the_time_off_cpu():
    # clocks read a few ns apart: a runq a hair above wall - CPU leaves no negative waiting
    record = {"pid": 1, "t_ns": 1, "samples": 1, "cpu_s": 1e-3, "wall_s": 2e-3,
              "runq_s": 1.0001e-3}
    cost = loading_cost([([dict(record), {**record, "t_ns": 2}], None)])
    assert cost.wait_per_sample_s == 0.0 and cost.runq_per_sample_s == pytest.approx(1e-3)


def test_model_keeps_the_blocked_waiting_and_the_most_contended_probe():
    calm = loading_cost([(batches(2.0, 0.05, runq_ms=0.1), None)])
    busy = loading_cost([(batches(2.0, 0.05, runq_ms=6.0), None)])
    probes = [probe(calm, 0, 2000.0), probe(busy, 8, 2000.0)]
    model = capacity_model(probes, cpus_per_rank=1.0, ranks=2, memory_available=None)
    assert model.bound == "cpu" and model.wait_per_sample_s == pytest.approx(0.05e-3)
    assert model.contention.workers == 8 and model.contention.notable
    out = model.to_dict()
    assert out["runq"]["per_sample_s"] == pytest.approx(6e-3) and out["runq"]["notable"]
    assert loading_line(out) == ("2.00 ms CPU + 0.05 ms waiting + 6.00 ms runnable (CPUs "
                                 "busy, 8 workers) per sample")
    quiet = capacity_model(probes[:1], 1.0, 2, None).to_dict()
    assert not quiet["runq"]["notable"]
    assert loading_line(quiet) == "2.00 ms CPU + 0.05 ms waiting per sample"
    unknown = loading_cost([(batches(2.0, 0.05), None)])
    assert capacity_model([probe(unknown, 0, 2000.0)], 1.0, 2, None).to_dict()["runq"] is None


def test_the_climb_stops_for_cpu_bound_loading_however_long_it_sat_runnable():
    busy = loading_cost([(batches(2.0, 0.05, runq_ms=6.0), None)]).to_dict()
    blind = loading_cost([(batches(2.0, 6.05), None)]).to_dict()  # wall - CPU only
    points = [ClimbPoint(4, 1000.0, 0.01, cpu_share=0.9),
              ClimbPoint(8, 1500.0, 0.01, cpu_share=busy["cpu_share"])]
    assert next_workers(points, 64) is None
    points[-1] = ClimbPoint(8, 1500.0, 0.01, cpu_share=blind["cpu_share"])
    assert next_workers(points, 64) == 16  # what the blind figure would have done


def test_one_pinning_thread_per_rank_bounds_the_loaders():
    # 0.5 ms to pin a sample: 2,000 samples/s per rank whatever the workers make
    model = Capacity(cpu_per_sample_s=1e-4, wait_per_sample_s=3e-3, cpus_per_rank=8.0,
                     ranks=2, demand=10000.0, memory_workers=None, pin_per_sample_s=5e-4)
    assert model.pin_limit == pytest.approx(4000.0)
    assert model.supply(32) == pytest.approx(4000.0)
    assert model.workers_for_demand() == 7  # 4,000/s x 3.1 ms / 2 ranks: more cannot help
    assert model.to_dict()["pin_limit"] == pytest.approx(4000.0)
    # without workers the loop pins its own batches too
    unpinned = Capacity(1e-4, 3e-3, 8.0, 2, demand=10000.0, memory_workers=None)
    assert model.throughput(0) < unpinned.throughput(0)
    probes = [ProbeRecord.from_json(
        {"id": f"p{w}", "status": "ok", "loop_demand": 10000.0, "config": {"num_workers": w},
         "loading": {"cpu_per_sample_s": 1e-4, "wait_per_sample_s": 3e-3,
                     "pin_per_sample_s": pin}})
        for w, pin in ((0, 4e-4), (4, 5e-4), (8, 6e-4))]
    assert capacity_model(probes, 8.0, 2, None).pin_per_sample_s == pytest.approx(5e-4)


def test_the_cpus_a_rank_counts_on_are_shared_alike_by_the_ladder_the_model_and_the_rules():
    """One author (``profiler.cpus.cpus_per_rank``): 16 CPUs for 4 ranks of one host."""
    from ddp_profile.profiler.cpus import cpus_per_rank
    from ddp_profile.profiler.settings import LoaderSettings
    from ddp_profile.profiler.sweep.space import SearchSpace, resolve_axes

    assert cpus_per_rank(16, 4) == 4.0 and cpus_per_rank(3, None) == 3.0
    assert cpus_per_rank(3, 2) == 1.5
    axes = resolve_axes(SearchSpace(), LoaderSettings(0, False, None, 32), "cpu", 16, 4)
    assert axes.num_workers == (0, 1, 2, 4)  # up to the rank's 4 CPUs
    assert resolve_axes(SearchSpace(), LoaderSettings(0, False, None, 32), "cpu", 3,
                        2).num_workers == (0, 1)  # 1.5 CPUs a rank: one worker
