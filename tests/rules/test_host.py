"""worker-oversubscription, frequent-io."""

from __future__ import annotations

from ddp_profile.rules import Thresholds
from ddp_profile.rules.host import frequent_io, worker_oversubscription
from tests.rules.tables import RunBuilder, empty_run

T = Thresholds()


def workers_run(workers: int, ranks: int = 4, cpus: int = 16):
    return (RunBuilder(world_size=ranks, cpus=cpus).probe("p", kind="baseline",
                                                          num_workers=workers)
            .steps(n=5).build())


def test_oversubscription_when_workers_exceed_cpus():
    finding = worker_oversubscription(workers_run(8), T)  # 32 workers on 16 CPUs
    assert finding is not None and finding.rule == "worker-oversubscription"
    assert "32 worker processes" in finding.evidence and "16 available CPUs" in finding.evidence
    assert "num_workers=3" in finding.recommendation
    assert finding.severity == "medium"


def test_oversubscription_severe_beyond_twice():
    assert worker_oversubscription(workers_run(16), T).severity == "high"


def test_no_oversubscription_when_workers_fit():
    assert worker_oversubscription(workers_run(4), T) is None


def test_oversubscription_counts_only_local_ranks():
    run = (RunBuilder(world_size=8, cpus=16, nproc_per_node=2)
           .probe("p", kind="baseline", num_workers=8).steps(n=3).build())
    for (_, rank), context in run.contexts.items():
        context["hostname"] = f"node{rank // 2}"  # 2 ranks on each of 4 machines
    assert worker_oversubscription(run, T) is None


def test_local_ranks_are_the_ranks_observed_not_the_launch_default():
    """``--launcher none`` with a script that starts one rank: the default nproc_per_node (2)
    is not what ran."""
    run = (RunBuilder(world_size=1, cpus=4, nproc_per_node=2)
           .probe("p", kind="baseline", num_workers=3).steps(n=3).build())
    assert worker_oversubscription(run, T) is None  # 1 rank x 3 workers fit 4 CPUs
    run = (RunBuilder(world_size=1, cpus=4, nproc_per_node=2)
           .probe("p", kind="baseline", num_workers=6).steps(n=3).build())
    finding = worker_oversubscription(run, T)
    assert finding is not None and "1 rank(s) per machine x num_workers=6" in finding.evidence


def spiky(every: int, spike_s: float, n: int = 40):
    def other(rank: int, step: int) -> float:
        return spike_s if step % every == every - 1 else 0.002

    return RunBuilder(world_size=2).probe("p", kind="baseline").steps(n=n, other=other).build()


def test_frequent_io_cites_period():
    finding = frequent_io(spiky(every=10, spike_s=0.5), T)
    assert finding is not None and finding.rule == "frequent-io"
    assert "every 10 steps" in finding.evidence and "500.0 ms" in finding.evidence
    assert finding.ranks == (0, 1)
    assert finding.severity == "high"  # 4 x 0.5 s of 4.4 s


def test_no_frequent_io_when_spikes_are_small():
    assert frequent_io(spiky(every=10, spike_s=0.008), T) is None


def test_no_frequent_io_when_spikes_are_rare_and_cheap():
    assert frequent_io(spiky(every=20, spike_s=0.05, n=40), T) is None  # 2 x 50 ms of 2.5 s


def test_no_frequent_io_on_flat_steps():
    run = RunBuilder().probe("p", kind="baseline").steps(n=30, other=0.01).build()
    assert frequent_io(run, T) is None


def test_host_rules_cope_with_empty_run():
    assert worker_oversubscription(empty_run(), T) is None
    assert frequent_io(empty_run(), T) is None
