"""data-loader-bound, cpu-bound-preprocessing, io-bound-loading."""

from __future__ import annotations

from typing import Optional

from ddp_profile.rules import Thresholds, evaluate
from ddp_profile.rules.findings.data import (
    cpu_bound_preprocessing,
    data_loader_bound,
    io_bound_loading,
)
from tests.rules.tables import RunBuilder, empty_run

T = Thresholds()


def sweep(host_cpu: float, wait_at_4: float, iowait: float = 2.0):
    """Baseline with 0 workers (data-bound), a probe with 4 workers."""
    return (RunBuilder(world_size=2)
            .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.05)
            .samples("host", cpu_percent=host_cpu, iowait_percent=iowait)
            .probe("w4", num_workers=4).steps(data_wait=wait_at_4, compute=0.05)
            .samples("host", cpu_percent=host_cpu, iowait_percent=iowait)
            .build())


def test_data_loader_bound_cites_fraction_and_seconds():
    run = (RunBuilder().probe("p", kind="baseline").steps(data_wait=0.03, compute=0.07).build())
    finding = data_loader_bound(run, T)
    assert finding is not None and finding.rule == "data-loader-bound"
    assert "30 %" in finding.evidence and "30.0 ms" in finding.evidence
    assert finding.severity == "medium"


def test_data_loader_bound_severe_when_mostly_waiting():
    run = RunBuilder().probe("p", kind="baseline").steps(data_wait=0.09, compute=0.01).build()
    assert data_loader_bound(run, T).severity == "high"


def test_data_loader_bound_not_when_compute_bound():
    run = RunBuilder().probe("p", kind="baseline").steps(data_wait=0.005, compute=0.1).build()
    assert data_loader_bound(run, T) is None


def test_data_loader_bound_silent_when_the_gpu_worked_through_the_wait():
    """On CUDA the host may wait for a batch while the GPU still runs queued steps (measured
    on an H100: the host waited 63 % of each step, the GPU was idle 0 %): the loader does not
    bound the job, and the finding must not say it does."""
    run = (RunBuilder(device="cuda").probe("p", kind="baseline")
           .steps(data_wait=0.03, compute=0.05, gpu_gap=0.0).build())
    assert data_loader_bound(run, T) is None
    host_only = (RunBuilder(device="cuda").probe("p", kind="baseline")
                 .steps(data_wait=0.03, compute=0.05).build())
    assert data_loader_bound(host_only, T) is not None  # no GPU gaps timed: the host's wait


def test_data_loader_bound_on_cuda_cites_the_gpu_idle_time_the_wait_cost():
    run = (RunBuilder(device="cuda").probe("p", kind="baseline")
           .steps(data_wait=0.04, compute=0.05, other=0.01, gpu_gap=0.03).build())
    finding = data_loader_bound(run, T)
    assert finding is not None
    assert "GPU sits idle 30 %" in finding.evidence and "30.0 ms per step" in finding.evidence
    assert "wait 40 % of each step in all" in finding.evidence


def test_data_loader_bound_uses_first_ok_probe_without_baseline_kind():
    run = (RunBuilder().probe("crashed", status="crash")
           .probe("p", kind="sweep").steps(data_wait=0.05, compute=0.05).build())
    assert data_loader_bound(run, T) is not None


def voiced(run, rule: str) -> str:
    """A finding's recommendation as the user reads it (worded by ``rules.voice``)."""
    return next(f for f in evaluate(run)[0] if f.rule == rule).recommendation


def test_data_loader_bound_advice_cites_the_measured_better_setting():
    run = (RunBuilder().probe("p0", kind="baseline", num_workers=0, throughput=500.0)
           .steps(data_wait=0.05, compute=0.05)
           .probe("p1", kind="sweep", num_workers=4, prefetch_factor=2, throughput=1400.0)
           .steps(data_wait=0.005, compute=0.05).build())
    assert data_loader_bound(run, T).recommendation == ""  # worded by the one voice
    advice = voiced(run, "data-loader-bound")
    assert "num_workers=4" in advice and "2.80x" in advice, advice
    alone = RunBuilder().probe("p0", kind="baseline", num_workers=0, throughput=500.0) \
        .steps(data_wait=0.05, compute=0.05).build()
    assert "--num-workers 0,2" in voiced(alone, "data-loader-bound")


def test_threshold_is_overridable():
    run = RunBuilder().probe("p", kind="baseline").steps(data_wait=0.03, compute=0.07).build()
    assert data_loader_bound(run, Thresholds(data_wait_fraction=0.5)) is None


def test_cpu_bound_when_saturated_and_flat():
    finding = cpu_bound_preprocessing(sweep(host_cpu=97.0, wait_at_4=0.045), T)
    assert finding is not None and finding.rule == "cpu-bound-preprocessing"
    assert "97 %" in finding.evidence and "0 to 4 workers" in finding.evidence
    assert "offline" in finding.recommendation


def test_cpu_bound_from_worker_cpu_share():
    run = (RunBuilder(world_size=2, cpus=8)
           .probe("base", kind="baseline", num_workers=4).steps(data_wait=0.05, compute=0.05)
           .samples("host", worker_cpu_percent=390.0).build())  # 3.9 of 4 cores per rank
    assert cpu_bound_preprocessing(run, T) is not None


def test_cpu_bound_not_when_cpus_idle():
    assert cpu_bound_preprocessing(sweep(host_cpu=30.0, wait_at_4=0.045), T) is None


def test_cpu_bound_not_when_more_workers_fixed_it():
    assert cpu_bound_preprocessing(sweep(host_cpu=97.0, wait_at_4=0.001), T) is None


def test_cpu_bound_not_without_host_samples():
    run = (RunBuilder().probe("p", kind="baseline").steps(data_wait=0.05, compute=0.05).build())
    assert cpu_bound_preprocessing(run, T) is None


def test_io_bound_when_cpus_idle_and_still_waiting():
    finding = io_bound_loading(sweep(host_cpu=20.0, wait_at_4=0.04), T)
    assert finding is not None and finding.rule == "io-bound-loading"
    assert "4 workers" in finding.evidence and "host CPU 20 %" in finding.evidence


def test_io_bound_from_iowait_even_without_workers():
    run = (RunBuilder().probe("p", kind="baseline", num_workers=0)
           .steps(data_wait=0.05, compute=0.05).samples("host", cpu_percent=60.0,
                                                         iowait_percent=40.0).build())
    assert io_bound_loading(run, T) is not None


def test_io_bound_not_when_cpus_saturated():
    assert io_bound_loading(sweep(host_cpu=97.0, wait_at_4=0.04), T) is None


def test_io_bound_not_when_more_workers_fixed_it():
    assert io_bound_loading(sweep(host_cpu=20.0, wait_at_4=0.001), T) is None


def test_data_rules_cope_with_empty_run():
    for rule in (data_loader_bound, cpu_bound_preprocessing, io_bound_loading):
        assert rule(empty_run(), T) is None


def cpu_device_run(worker_cpu: float):
    """CPU training: the ranks' own compute keeps the host at 100 %; 1 core per rank."""
    return (RunBuilder(world_size=2, cpus=2, device="cpu")
            .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05)
            .samples("host", cpu_percent=100.0, worker_cpu_percent=0.0)
            .probe("w4", num_workers=4).steps(data_wait=0.03)
            .samples("host", cpu_percent=100.0, worker_cpu_percent=worker_cpu).build())


def test_cpu_training_with_idle_workers_is_io_bound():
    run = cpu_device_run(worker_cpu=20.0)
    assert io_bound_loading(run, T) is not None
    assert cpu_bound_preprocessing(run, T) is None


def test_cpu_training_with_busy_workers_is_cpu_bound():
    run = cpu_device_run(worker_cpu=95.0)
    assert cpu_bound_preprocessing(run, T) is not None
    assert io_bound_loading(run, T) is None


# ---- decided from the measured loading (batch costs where batches are made) ---------------

def loaded(cpu_ms: float, wait_ms: float, host_cpu: float = 30.0, cpus: int = 2):
    """2 ranks on ``cpus`` CPUs; a data-bound baseline and 2 workers, both with loading."""
    return (RunBuilder(world_size=2, cpus=cpus)
            .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.01)
            .samples("host", cpu_percent=host_cpu).loading(cpu_ms, wait_ms)
            .probe("w2", num_workers=2).steps(data_wait=0.03, compute=0.01)
            .samples("host", cpu_percent=host_cpu).loading(cpu_ms, wait_ms)
            .build())


def test_a_cold_baseline_against_warm_probes_is_never_called_not_storage():
    """The baseline read its files from storage, the later probe from the page cache (a
    real run: 100 % against 0 %): the loading may look CPU-bound on the warm probe's figures,
    but "not storage" is not established, and the evidence says why."""
    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.01)
               .samples("host", cpu_percent=97.0).loading(3.0, 0.1))
    builder.probes[-1]["loading"].update(read_per_sample_bytes=131072.0, storage_share=1.0)
    builder.probe("w2", num_workers=2).steps(data_wait=0.03, compute=0.01) \
        .samples("host", cpu_percent=97.0).loading(3.0, 0.1)
    builder.probes[-1]["loading"].update(read_per_sample_bytes=131072.0, storage_share=0.0)
    finding = cpu_bound_preprocessing(builder.build(), T)
    assert finding is not None and "not storage" not in finding.title
    assert "Not like for like: the baseline read 100 % of its bytes from storage" \
        in finding.evidence
    warm = loaded(cpu_ms=3.0, wait_ms=0.1, host_cpu=97.0)  # no reads recorded: as before
    assert "not storage" in cpu_bound_preprocessing(warm, T).title


def test_wait_bound_loading_cites_waiting_and_predicts_workers_past_the_cpus():
    run = loaded(cpu_ms=0.1, wait_ms=3.0, host_cpu=97.0)  # a busy host does not matter
    assert cpu_bound_preprocessing(run, T) is None
    finding = io_bound_loading(run, T)
    assert finding is not None and finding.rule == "io-bound-loading"
    assert "0.10 ms of CPU and 3.0 ms of waiting" in finding.evidence, finding.evidence
    capacity = run.summary["capacity"]
    # 32 samples per 11 ms step: 2,909/s per rank need ceil(2909 * 3.1 ms) = 10 workers
    assert capacity["workers_for_demand"] == 10 > capacity["cpus_per_rank"]
    assert "num_workers=10 per rank (predicted, not measured" in finding.recommendation


def spawned_workers(restart_s: float, steady: float):
    """A wait-bound baseline (844 samples/s, a loop demand of 10,000) and 1 worker restarted
    every 62-step epoch, 400 samples/s as run and ``steady`` between restarts."""
    return (RunBuilder(world_size=2, cpus=2)
            .probe("base", kind="baseline", num_workers=0, throughput=844.0,
                   entry={"loop_demand": 10000.0}).steps(data_wait=0.05, compute=0.01)
            .loading(0.1, 2.1)
            .probe("w1", num_workers=1, throughput=400.0,
                   entry={"throughput": 400.0, "steady_throughput": steady, "epoch_steps": 62,
                          "epoch_restart_s": restart_s}).steps(data_wait=0.04, compute=0.01)
            .loading(0.1, 2.1).build())


def test_workers_held_below_the_script_by_their_restarts_are_not_predicted_to_help():
    """The mp.spawn workload: each spawned worker takes 2.7 s to start, every epoch. With
    data free and that restart, no worker count restarting so can beat the script's settings
    (1 / (1/10,000 + 1/400 - 1/900): 672 samples/s against 844): the finding says so
    instead of predicting 10 workers; a cheap restart leaves the prediction."""
    finding = io_bound_loading(spawned_workers(2.7, 900.0), T)
    assert finding is not None
    assert finding.recommendation.startswith("More workers only pay here kept alive"), \
        finding.recommendation
    assert "probe w1 (num_workers=1" in finding.recommendation
    assert "2.70 s a restart" in finding.recommendation
    assert "at most 672 samples/s against 844" in finding.recommendation
    assert "predicted, not measured" not in finding.recommendation
    cheap = io_bound_loading(spawned_workers(0.05, 410.0), T)
    assert cheap is not None and "kept alive" not in cheap.recommendation


def test_cpu_heavy_loading_on_saturated_cpus_is_cpu_bound_and_says_so():
    # 8 workers of a 2 ms transform on 2 CPUs: 6 ms of each sample runnable, waiting for a CPU
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.01)
           .loading(2.0, 0.1, runq_ms=0.1)
           .probe("w8", num_workers=8).steps(data_wait=0.03, compute=0.01)
           .loading(2.0, 0.1, runq_ms=6.0).build())
    assert io_bound_loading(run, T) is None
    finding = cpu_bound_preprocessing(run, T)
    assert finding is not None and "2.0 ms of CPU and 0.10 ms of waiting" in finding.evidence
    assert ("with 8 worker(s) per rank, the producers also sat 6.0 ms per sample runnable, "
            "waiting for a CPU (74 % of their time): the CPUs were saturated"
            in finding.evidence), finding.evidence


def test_runnable_time_is_cited_only_where_notable():
    run = loaded(cpu_ms=0.1, wait_ms=3.0)  # no runq recorded
    assert "runnable" not in io_bound_loading(run, T).evidence
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.01)
           .loading(0.1, 3.0, runq_ms=0.05).build())
    finding = io_bound_loading(run, T)
    assert finding is not None and "runnable" not in finding.evidence


def test_cpu_heavy_loading_is_cpu_bound_and_never_told_to_buy_storage():
    run = loaded(cpu_ms=3.4, wait_ms=0.1, host_cpu=30.0)  # an idle host does not matter
    assert io_bound_loading(run, T) is None
    finding = cpu_bound_preprocessing(run, T)
    assert finding is not None and "3.4 ms of CPU" in finding.evidence
    assert "at most 588 samples/s over 2 rank(s)" in finding.evidence  # 1 CPU / 3.4 ms x 2
    assert "consumes 5,818 samples/s" in finding.evidence  # 2 x 32 samples per 11 ms
    text = (finding.evidence + finding.recommendation).lower()
    assert "nvme" not in text and "storage" not in finding.recommendation.lower()
    assert finding.severity == "high"
    advice = voiced(run, "data-loader-bound")
    assert "predicted, not measured" in advice.lower() or "Measured in this run:" in advice, advice


def test_mixed_loading_gets_neither_bound_finding():
    run = loaded(cpu_ms=1.0, wait_ms=1.0)
    assert run.summary["capacity"]["bound"] == "mixed"
    assert io_bound_loading(run, T) is None and cpu_bound_preprocessing(run, T) is None


def test_waiting_under_oversubscribed_threads_is_not_blamed_on_storage():
    """Wall - CPU of a worker on oversubscribed CPUs includes waiting for a CPU: beside a
    thread-oversubscription finding the loading's waiting is no evidence of slow storage."""
    from ddp_profile.rules.threads import thread_oversubscription

    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("base", kind="baseline", num_workers=0,
                      entry={"intra_op_threads": 2, "ranks_per_host": 2, "cpus_available": 2})
               .steps(data_wait=0.05, compute=0.01).loading(0.1, 3.0)
               .probe("threads", kind="threads", num_workers=0)
               .steps(data_wait=0.01, compute=0.005))
    builder.summary["launcher"] = "torchrun"
    run = builder.build()
    assert run.summary["capacity"]["bound"] == "wait"
    assert thread_oversubscription(run, T) is not None
    assert io_bound_loading(run, T) is None
    without = loaded(cpu_ms=0.1, wait_ms=3.0)  # the same loading, threads that fit: a finding
    assert io_bound_loading(without, T) is not None


def test_wait_bound_loading_says_past_the_cpu_count_only_when_it_is():
    many = io_bound_loading(loaded(cpu_ms=0.1, wait_ms=3.0, cpus=2), T)  # 10 workers, 1 CPU
    assert "past the CPU count" in many.recommendation
    few = io_bound_loading(loaded(cpu_ms=0.1, wait_ms=3.0, cpus=64), T)  # 10 workers, 32 CPUs
    assert few is not None and "past the CPU count" not in few.recommendation, few


def test_data_loader_bound_never_advises_fewer_workers_as_more():
    """CPU-bound loading whose CPUs saturate at 2 workers per rank, the script runs 4: the
    finding must not say "load in parallel: num_workers=2" (fewer than it has)."""
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("base", kind="baseline", num_workers=4).steps(data_wait=0.05, compute=0.01)
           .loading(3.4, 0.1).build())
    assert run.summary["capacity"]["workers_for_demand"] <= 4
    finding = data_loader_bound(run, T)
    assert finding is not None and finding.advice is None
    assert "not predicted to help" in finding.recommendation, finding.recommendation
    assert "Load in parallel" not in finding.recommendation


def cpu_bound_run(cpu_ms: float, collate_ms: float = 0.0, read_b: Optional[float] = None):
    """A data-bound baseline without workers whose samples cost ``cpu_ms`` of CPU each (of it
    ``collate_ms`` in collate_fn), on saturated CPUs; ``read_b``: bytes its producers read per
    sample (None: not recorded)."""
    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.001)
               .loading(cpu_ms, 0.0))
    builder.probes[-1]["loading"]["collate_per_sample_s"] = collate_ms / 1e3
    builder.probes[-1]["loading"]["read_per_sample_bytes"] = read_b
    return builder.build()


def said(finding) -> str:
    """What a rule says to change in its own words: its recommendation, or, where it advises
    a setting (worded by ``rules.voice``), the advice beside the setting."""
    return finding.recommendation or finding.advice.extra


def test_advice_follows_the_part_of_loading_that_costs():
    """An in-memory TensorDataset costs only the DataLoader's per-sample indexing: no decode
    advice (there is nothing to decode); a costly collate_fn gets collate advice; a costly
    fetch (decoding, transforms) the offline / GPU-decode advice."""
    tiny = cpu_bound_preprocessing(cpu_bound_run(0.02, collate_ms=0.005), T)
    assert tiny is not None and "DataLoader's per-sample work" in tiny.title
    assert "__getitems__" in said(tiny) and "decode_jpeg" not in said(tiny)
    assert "15 us" in said(tiny)  # never "0.0 ms"
    collate = cpu_bound_preprocessing(cpu_bound_run(2.0, collate_ms=1.5), T)
    assert "collating" in collate.title and "cheaper collate_fn" in said(collate)
    heavy = cpu_bound_preprocessing(cpu_bound_run(2.0, collate_ms=0.1), T)
    assert "preprocessing" in heavy.title and "decode_jpeg" in said(heavy)
    assert "where the samples are encoded images read from files" in said(heavy)
    files = cpu_bound_preprocessing(cpu_bound_run(2.0, collate_ms=0.1, read_b=110_000.0), T)
    assert "decode_jpeg" in said(files)
    # transforms on samples made in memory (a dataset of tensors, just above the fast fetch):
    # nothing read from files, so nothing to decode
    memory = cpu_bound_preprocessing(cpu_bound_run(0.15, collate_ms=0.01, read_b=0.0), T)
    assert "preprocessing" in memory.title, memory.title
    assert "made in memory (0 bytes read per sample)" in said(memory)
    assert "decode_jpeg" not in said(memory) and "DALI" not in said(memory)
    # a collate that took long on busy CPUs, but little CPU of its own: not the collate
    descheduled = cpu_bound_run(2.0, collate_ms=1.5)
    for entry in descheduled.summary["probes"]:
        entry["loading"]["collate_cpu_per_sample_s"] = 0.1e-3
    assert "preprocessing" in cpu_bound_preprocessing(descheduled, T).title


def test_loading_findings_cite_what_was_read_from_storage_and_at_what_rate():
    """Producers that read 128 KiB per sample from storage: the io-bound finding cites the
    bytes, the share from storage and the MB/s it took at the baseline's rate; read warm, the
    cpu-bound finding says the page cache served them; in memory, neither cites storage."""
    def reading(cpu_ms: float, wait_ms: float, share: float):
        builder = (RunBuilder(world_size=2, cpus=2)
                   .probe("base", kind="baseline", num_workers=0)
                   .steps(data_wait=0.05, compute=0.01).loading(cpu_ms, wait_ms))
        builder.probes[-1]["loading"].update(read_per_sample_bytes=131072.0,
                                             storage_per_sample_bytes=131072.0 * share,
                                             storage_share=share)
        return builder.build()

    cold = reading(0.1, 3.0, 1.0)
    rate = float(cold.probes.set_index("id").loc["base", "throughput"])
    finding = io_bound_loading(cold, T)
    assert finding is not None
    assert ("The baseline's producers read 128 KiB per sample, 100 % of it from storage: "
            f"{131072 * rate / 1e6:,.1f} MB/s from storage at its {rate:,.0f} samples/s, "
            "3.0 ms of blocked waiting per sample.") in finding.evidence, finding.evidence
    warm = cpu_bound_preprocessing(reading(3.0, 0.1, 0.0), T)
    assert warm is not None
    assert "128 KiB per sample, 0 % of it from storage (the rest from the page cache)." \
        in warm.evidence, warm.evidence
    assert "KiB per sample" not in io_bound_loading(loaded(cpu_ms=0.1, wait_ms=3.0), T).evidence


def test_mixed_loading_that_reads_from_storage_is_said_in_the_data_wait_finding():
    """Cold 128 KiB files on a VM: the kernel's reads cost CPU as well as waiting (0.12 ms of
    each), so neither the cpu- nor the io-bound finding fires; the data-wait finding says what
    the producers read from storage."""
    builder = (RunBuilder(world_size=1)
               .probe("base", kind="baseline", num_workers=0)
               .steps(data_wait=0.05, compute=0.002).loading(0.12, 0.12))
    builder.probes[-1]["loading"].update(read_per_sample_bytes=131072.0,
                                         storage_per_sample_bytes=131072.0, storage_share=1.0)
    run = builder.build()
    assert run.summary["capacity"]["bound"] == "mixed"
    assert cpu_bound_preprocessing(run, T) is None and io_bound_loading(run, T) is None
    finding = data_loader_bound(run, T)
    assert "read 128 KiB per sample, 100 % of it from storage" in finding.evidence, \
        finding.evidence
    warm_cpu = loaded(cpu_ms=3.4, wait_ms=0.1)  # cpu-bound: its own finding says it
    assert "KiB" not in data_loader_bound(warm_cpu, T).evidence


def test_the_loading_bound_is_decided_by_the_rules_thresholds():
    run = loaded(cpu_ms=3.4, wait_ms=0.1, host_cpu=30.0)  # CPU share 0.97
    assert run.summary["capacity"]["bound"] == "cpu"
    assert cpu_bound_preprocessing(run, T) is not None
    strict = Thresholds(cpu_bound_share=0.98)  # 0.97 is mixed under these thresholds
    assert cpu_bound_preprocessing(run, strict) is None and io_bound_loading(run, strict) is None
    assert "cpu-bound-preprocessing" not in {f.rule for f in evaluate(run, strict)[0]}
