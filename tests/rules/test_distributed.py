"""straggler, missing-distributed-sampler, no-ddp, missing-set-epoch, data-parallel,
backend-mismatch, find-unused-parameters."""

from __future__ import annotations

from ddp_profile.profiler.rank.stepclock import runq_sampled
from ddp_profile.rules import Thresholds
from ddp_profile.rules.findings.distributed import (
    backend_mismatch,
    data_parallel,
    find_unused_parameters,
    missing_distributed_sampler,
    missing_set_epoch,
    no_ddp,
    straggler,
)
from tests.rules.tables import RunBuilder, empty_run

T = Thresholds()


def ddp_steps(slow_rank: int, extra_forward: float, ranks: int = 4):
    """DDP: the slow rank's forward is longer; the others absorb the wait in compute."""
    def forward(rank: int, step: int) -> float:
        return 0.02 + (extra_forward if rank == slow_rank else 0.0)

    def compute(rank: int, step: int) -> float:  # sync inside backward: every rank ends together
        return 0.05 + extra_forward

    return (RunBuilder(world_size=ranks).probe("p", kind="baseline")
            .steps(n=20, warmup=2, compute=compute, forward=forward).build())


def test_straggler_named_by_presync_time():
    finding = straggler(ddp_steps(slow_rank=2, extra_forward=0.02), T)
    assert finding is not None and finding.rule == "straggler"
    assert finding.ranks == (2,)
    assert "Rank 2" in finding.evidence and "100 %" in finding.evidence
    assert "20.0 ms/step" in finding.evidence


def test_a_rank_lagging_on_cpus_its_own_job_oversubscribes_is_not_called_a_straggler():
    """Two ranks x 2 intra-op threads on 2 CPUs, the fewer threads measured 2x faster: a rank
    that lags may be waiting for a CPU. The finding says so, at low severity, and puts the
    threads first; the same lag on CPUs that fit stays a straggler."""
    def forward(rank: int, step: int) -> float:
        return 0.02 + (0.02 if rank == 1 else 0.0)

    def builder(threads: int):
        return (RunBuilder(world_size=2, cpus=2)
                .probe("p", kind="baseline", num_workers=0, throughput=500.0,
                       entry={"intra_op_threads": threads, "ranks_per_host": 2,
                              "cpus_available": 2, "worker_cores": 0.0})
                .steps(n=20, warmup=2, compute=0.07, forward=forward))

    crowded = builder(threads=2)
    crowded.probe("t", kind="threads", num_workers=0, throughput=1000.0).steps(n=5)
    finding = straggler(crowded.build(), T)
    assert finding is not None and finding.severity == "low"
    assert "oversubscribed" in finding.title and "waiting for a CPU" in finding.evidence
    assert finding.recommendation.startswith("Fit the threads to the CPUs first")
    fits = straggler(builder(threads=1).build(), T)  # 2 ranks x 1 thread on 2 CPUs
    assert fits is not None and fits.severity != "low" and fits.title == "Rank 1 is a straggler"


def test_straggler_not_named_when_ranks_are_even():
    assert straggler(ddp_steps(slow_rank=2, extra_forward=0.0), T) is None


def test_straggler_not_named_for_a_tiny_difference():
    assert straggler(ddp_steps(slow_rank=1, extra_forward=0.0005), T) is None


def test_straggler_from_compute_without_forward_times():
    def compute(rank: int, step: int) -> float:
        return 0.08 if rank == 3 else 0.05

    run = (RunBuilder(world_size=4).probe("p", kind="baseline").steps(n=10, compute=compute)
           .build())
    finding = straggler(run, T)
    assert finding is not None and finding.ranks == (3,)


def test_a_rank_that_waits_in_backward_is_not_a_straggler():
    """DDP: forwards alike, so the ranks reach the gradient synchronisation together; rank 0's
    compute is longer in 6 of 10 steps only because it waits there (an accelerate run on 2
    CPU ranks was told "Rank 0 has the longest compute ... is a straggler")."""
    def compute(rank: int, step: int) -> float:
        return 0.0050 if rank == 0 and step % 10 < 6 else 0.0039

    run = (RunBuilder(world_size=2).probe("p", kind="baseline")
           .steps(n=10, data_wait=0.0005, compute=compute, forward=0.001, other=0.0002)
           .build())
    assert straggler(run, T) is None


def test_straggler_needs_several_ranks():
    run = RunBuilder(world_size=1).probe("p", kind="baseline").steps(forward=0.02).build()
    assert straggler(run, T) is None


def sampler_run(digests: dict, world_size: int = 2, sampler: str = "RandomSampler",
                distributed: bool = False):
    """A 2-rank baseline whose ranks fingerprinted their first batches as ``digests``
    (rank -> list of digests; the training loader is loader 0)."""
    builder = (RunBuilder(world_size=world_size)
               .probe("p", kind="baseline", loader={"distributed_sampler": distributed,
                                                    "sampler": sampler})
               .steps(n=3))
    for rank, prints in digests.items():
        for index, digest in enumerate(prints):
            builder.event("batch_fingerprint", rank=rank, loader_id=0, index=index,
                          digest=digest)
    return builder.build()


def test_identical_batches_on_two_ranks_are_found_whatever_the_sampler():
    for sampler, distributed in (("RandomSampler", False), ("DistributedSampler", True)):
        finding = missing_distributed_sampler(
            sampler_run({0: ["a", "b", "c"], 1: ["a", "b", "c"]}, sampler=sampler,
                        distributed=distributed), T)
        assert finding is not None and finding.severity == "high"
        assert finding.ranks == (0, 1) and "first 3 batches" in finding.evidence
        assert sampler in finding.evidence  # the class explains, it does not decide
    assert "same rank on every process" in finding.recommendation


def test_disjoint_batches_are_not_flagged_whatever_the_sampler():
    """accelerate's BatchSamplerShard, a plain sampler on a self-sharding data set: no class
    test, only the data."""
    for sampler in ("BatchSamplerShard", "RandomSampler", "SequentialSampler"):
        run = sampler_run({0: ["a", "b", "c"], 1: ["d", "e", "f"]}, sampler=sampler)
        assert missing_distributed_sampler(run, T) is None


def test_partly_equal_or_constant_batches_are_no_evidence():
    assert missing_distributed_sampler(sampler_run({0: ["a", "b"], 1: ["a", "x"]}), T) is None
    constant = sampler_run({0: ["k", "k", "k"], 1: ["k", "k", "k"]})  # a constant data set
    assert missing_distributed_sampler(constant, T) is None
    assert missing_distributed_sampler(sampler_run({0: ["a"], 1: ["a"]}), T) is None


def test_no_fingerprints_or_one_rank_no_finding():
    assert missing_distributed_sampler(sampler_run({}), T) is None
    assert missing_distributed_sampler(
        sampler_run({0: ["a", "b"]}, world_size=1), T) is None


def coverage_run(per_rank: dict, **loader):
    """A 2-rank baseline with differing batches whose ranks' training loaders recorded
    ``loader`` (every rank) updated with ``per_rank[rank]``."""
    facts = {"dataset": "TensorDataset", "dataset_len": 1000, "epoch_samples": 1000,
             "dataset_fingerprint": "data", "batch_size": 32, **loader}
    run = sampler_run({0: ["a", "b", "c"], 1: ["d", "e", "f"]})
    for (_, rank), context in run.contexts.items():
        context["loader"] = {**context["loader"], **facts, **per_rank.get(rank, {})}
    return run


def test_ranks_that_each_cover_the_whole_dataset_are_found_whatever_their_order():
    """An unseeded (or rank-seeded) shuffle without a sampler: batches differ, yet every rank
    reads all of the same dataset."""
    finding = missing_distributed_sampler(coverage_run({}), T)
    assert finding is not None and finding.title == "Every rank reads the whole dataset"
    assert "1000 samples" in finding.evidence and "2x the work" in finding.evidence
    assert "DistributedSampler(dataset" in finding.recommendation
    # a partial last batch dropped still covers the dataset
    assert missing_distributed_sampler(coverage_run({}, epoch_samples=992), T) is not None


def test_sharded_samplers_and_self_sharded_datasets_are_not_flagged():
    assert missing_distributed_sampler(coverage_run({}, epoch_samples=500), T) is None  # shard
    assert missing_distributed_sampler(
        coverage_run({}, distributed_sampler=True), T) is None
    # each rank built its own shard of the files: the datasets differ
    assert missing_distributed_sampler(
        coverage_run({1: {"dataset_fingerprint": "other"}}), T) is None
    # nothing in the dataset says which data it is: no evidence
    assert missing_distributed_sampler(coverage_run({}, dataset_fingerprint=None), T) is None
    assert missing_distributed_sampler(coverage_run({1: {"dataset_len": 999}}), T) is None


def test_fingerprints_of_another_loader_are_ignored():
    run = (RunBuilder(world_size=2).probe("p", kind="baseline").steps(n=3, loader_id=1)
           .event("batch_fingerprint", rank=0, loader_id=0, index=0, digest="a")
           .event("batch_fingerprint", rank=0, loader_id=0, index=1, digest="b")
           .event("batch_fingerprint", rank=1, loader_id=0, index=0, digest="a")
           .event("batch_fingerprint", rank=1, loader_id=0, index=1, digest="b").build())
    assert missing_distributed_sampler(run, T) is None  # loader 0 is not the training loader


def no_ddp_run(*events, world_size: int = 2, forward=0.01):
    builder = (RunBuilder(world_size=world_size).probe("p", kind="baseline")
               .steps(n=5, forward=forward).event("process_group", backend="gloo"))
    for name, data in events:
        builder.event(name, **data)
    return builder.build()


def test_process_group_without_ddp_is_found():
    finding = no_ddp(no_ddp_run(), T)
    assert finding is not None and finding.severity == "high"
    assert "2 ranks" in finding.evidence and "DistributedDataParallel" in finding.recommendation


def test_ddp_fsdp_or_own_all_reduce_is_no_finding():
    for event in (("ddp", {"device_type": "cpu"}), ("fsdp", {}),
                  ("collective", {"op": "all_reduce"})):
        assert no_ddp(no_ddp_run(event), T) is None, event


def test_an_all_reduce_outside_most_training_steps_averages_no_gradients():
    """pytorch/examples' imagenet main.py on CPU: no DDP, its validation metrics all-reduced
    in 7 % of the steps."""
    def run_with(share):
        builder = (RunBuilder(world_size=2)
                   .probe("p", kind="baseline", entry={"comm": {"collectives": {
                       "per_step": 0.13, "steps_with_calls": share}}})
                   .steps(n=5, forward=0.01).event("process_group", backend="gloo")
                   .event("collective", op="all_reduce"))
        return builder.build()
    finding = no_ddp(run_with(0.07), T)
    assert finding is not None and "ran in 7% of the training steps" in finding.evidence
    assert no_ddp(run_with(1.0), T) is None  # every step: it may average the gradients


def test_no_ddp_needs_gradients_ranks_and_a_group():
    assert no_ddp(no_ddp_run(forward=None), T) is None  # no backward pass: inference
    assert no_ddp(no_ddp_run(world_size=1), T) is None
    run = RunBuilder(world_size=2).probe("p", kind="baseline").steps(n=5, forward=0.01).build()
    assert no_ddp(run, T) is None  # no process group


def epoch_run(set_epoch: bool, shuffle: bool = True, epochs: int = 3):
    builder = (RunBuilder(world_size=2)
               .probe("p", kind="baseline", loader={"sampler_shuffle": shuffle}).steps(n=10))
    for epoch in range(epochs):
        builder.loader_iter(epoch, 0.01)
        if set_epoch:
            builder.event("set_epoch", epoch=epoch, loader_id=0)
    return builder.build()


def test_missing_set_epoch():
    finding = missing_set_epoch(epoch_run(set_epoch=False), T)
    assert finding is not None and "2 more epoch(s)" in finding.evidence


def test_set_epoch_called():
    assert missing_set_epoch(epoch_run(set_epoch=True), T) is None


def test_set_epoch_irrelevant_without_shuffle_or_second_epoch():
    assert missing_set_epoch(epoch_run(set_epoch=False, shuffle=False), T) is None
    assert missing_set_epoch(epoch_run(set_epoch=False, epochs=1), T) is None


def test_set_epoch_on_another_loader_does_not_count():
    builder = (RunBuilder().probe("p", kind="baseline").steps(n=5)
               .loader_iter(0, 0.01).loader_iter(1, 0.01)
               .event("set_epoch", epoch=1, loader_id=7))
    assert missing_set_epoch(builder.build(), T) is not None


def events_run(*events: tuple, backend: str = "nccl"):
    builder = RunBuilder(world_size=2, backend=backend).probe("p", kind="baseline").steps(n=3)
    for name, data in events:
        builder.event(name, **data)
    return builder.build()


def test_data_parallel():
    assert data_parallel(events_run(("data_parallel", {})), T).rule == "data-parallel"
    assert data_parallel(events_run(), T) is None


def test_backend_mismatch():
    ddp = ("ddp", {"device_type": "cuda", "find_unused_parameters": False})
    group = ("process_group", {"backend": "gloo"})
    assert backend_mismatch(events_run(ddp, group), T).rule == "backend-mismatch"
    assert backend_mismatch(events_run(ddp, backend="gloo"), T) is not None  # from context
    assert backend_mismatch(events_run(ddp, ("process_group", {"backend": "nccl"})), T) is None
    cpu_ddp = ("ddp", {"device_type": "cpu"})
    assert backend_mismatch(events_run(cpu_ddp, group), T) is None


def test_find_unused_parameters():
    ddp = ("ddp", {"device_type": "cuda", "find_unused_parameters": True})
    none_unused = ("ddp_unused_parameters", {"params_without_grad": 0, "params_total": 10})
    some_unused = ("ddp_unused_parameters", {"params_without_grad": 2, "params_total": 10})
    finding = find_unused_parameters(events_run(ddp, none_unused), T)
    assert finding is not None and "10 parameters" in finding.evidence
    assert find_unused_parameters(events_run(ddp, some_unused), T) is None
    assert find_unused_parameters(events_run(ddp), T) is None  # never checked
    off = ("ddp", {"device_type": "cuda", "find_unused_parameters": False})
    assert find_unused_parameters(events_run(off, none_unused), T) is None


def test_distributed_rules_cope_with_empty_run():
    for rule in (straggler, missing_distributed_sampler, missing_set_epoch, data_parallel,
                 backend_mismatch, find_unused_parameters, no_ddp):
        assert rule(empty_run(), T) is None


def test_a_rank_that_read_from_storage_while_the_others_hit_the_page_cache_is_not_a_straggler():
    """Rank 1 waits 20 ms longer for data each step, and its producers read 100 % of their
    bytes from storage against rank 0's 0 %: the cache state explains the lag (low, and it
    says so). The same lag with both ranks reading alike stays a straggler; so does a lag in
    forward, whatever the cache did."""
    def wait(rank: int, step: int) -> float:
        return 0.005 + (0.02 if rank == 1 else 0.0)

    def run(shares: dict, slow_forward: bool = False):
        builder = (RunBuilder(world_size=2)
                   .probe("p", kind="baseline", num_workers=0)
                   .steps(n=20, warmup=2, compute=0.07,
                          data_wait=0.005 if slow_forward else wait,
                          forward=(lambda r, s: 0.02 + (0.02 if r == 1 else 0.0))
                          if slow_forward else 0.02)
                   .loading(0.1, 3.0))
        builder.probes[-1]["loading"]["storage_share_by_rank"] = shares
        return builder.build()

    cold = straggler(run({"0": 0.0, "1": 1.0}), T)
    assert cold is not None and cold.severity == "low" and cold.ranks == (1,)
    assert "not for a reason of its own" in cold.title
    assert ("read 100 % of its bytes from storage, the other ranks' 0 % (the rest from the "
            "page cache), and it waited 20.0 ms/step longer for data") in cold.evidence
    assert cold.recommendation.startswith("Measure every rank in one cache state")
    alike = straggler(run({"0": 1.0, "1": 1.0}), T)
    assert alike is not None and alike.title == "Rank 1 is a straggler"
    forward = straggler(run({"0": 0.0, "1": 1.0}, slow_forward=True), T)
    assert forward is not None and forward.title == "Rank 1 is a straggler"


def test_a_rank_whose_loop_waited_for_a_cpu_is_not_a_straggler():
    """A symmetric script on 2 CPUs (a real run: rank 0 behind by 1.5 ms a step): rank 0's
    loop sat runnable without a CPU for most of its lag, another process held its CPU. The
    finding is low and names the contention; the same lag without run-queue time stays a
    straggler; so does one whose run-queue time is too small to explain it."""
    def forward(rank: int, step: int) -> float:
        return 0.02 + (0.02 if rank == 0 else 0.0)

    def run(runq_0: float):
        return (RunBuilder(world_size=2).probe("p", kind="baseline", num_workers=0)
                .steps(n=20, warmup=2, compute=0.07, forward=forward,
                       runq=lambda r, s: runq_0 if r == 0 else 0.001).build())

    busy = straggler(run(0.016), T)
    assert busy is not None and busy.severity == "low" and busy.ranks == (0,)
    assert busy.title == "Rank 0 lags waiting for a CPU, not for a reason of its own"
    assert "sat runnable, waiting for a CPU, 15.0 ms/step longer than the other ranks'" \
        in busy.evidence and "CPU contention explains the lag" in busy.evidence
    own = straggler(run(0.001), T)
    assert own is not None and own.title == "Rank 0 is a straggler"
    little = straggler(run(0.006), T)  # 5 ms of a 20 ms lag
    assert little is not None and little.title == "Rank 0 is a straggler"


def test_a_cpu_contention_lag_is_found_from_the_sampled_steps_alone():
    """The run queue is read on a sample of the steps, the same on every rank: the other steps
    carry NaN. The contention is read from the sampled steps (an unread step is no 0: over
    all steps the median lag would be 0 and the rank a straggler)."""
    def forward(rank: int, step: int) -> float:
        return 0.02 + (0.02 if rank == 0 else 0.0)

    def runq(rank: int, step: int) -> float:
        if not runq_sampled(step):
            return float("nan")
        return 0.016 if rank == 0 else 0.001

    run = (RunBuilder(world_size=2).probe("p", kind="baseline", num_workers=0)
           .steps(n=24, warmup=2, compute=0.07, forward=forward, runq=runq).build())
    steps = run.steps
    assert steps["runq_s"].isna().sum() > steps["runq_s"].notna().sum()  # most unread
    busy = straggler(run, T)
    assert busy is not None and busy.severity == "low" and busy.ranks == (0,)
    assert busy.title == "Rank 0 lags waiting for a CPU, not for a reason of its own"
    assert "15.0 ms/step longer than the other ranks'" in busy.evidence
