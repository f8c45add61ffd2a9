"""worker-oversubscription, frequent-io."""

from __future__ import annotations

from ddp_profile.rules import Thresholds, evaluate
from ddp_profile.rules.findings.host import frequent_io, worker_oversubscription
from ddp_profile.rules.threads import thread_oversubscription
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
    assert finding.advice.change.startswith("num_workers=3") and finding.severity == "medium"
    assert finding.recommendation == ""  # the setting is worded from the recommendation
    findings, _ = evaluate(workers_run(8))
    voiced = next(f for f in findings if f.rule == "worker-oversubscription")
    assert "num_workers=3" in voiced.recommendation


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


def threads_run(threads_tp=None, intra_op=2, ranks=2, cpus=2, worker_cores=0.0,
                launcher="none"):
    """A baseline whose ranks each run ``intra_op`` torch threads, and optionally the threads
    counterfactual (kind "threads") at ``threads_tp`` samples/s."""
    builder = (RunBuilder(world_size=ranks, cpus=cpus)
               .probe("p0", kind="baseline", num_workers=0, throughput=500.0,
                      entry={"intra_op_threads": intra_op, "ranks_per_host": ranks,
                             "cpus_available": cpus, "worker_cores": worker_cores})
               .steps(n=5))
    if threads_tp is not None:
        builder.probe("p1", kind="threads", num_workers=0, throughput=threads_tp).steps(n=5)
    builder.summary["launcher"] = launcher
    return builder.build()


def alternated_threads_run(rates, single_tp=4000.0):
    """``threads_run`` with its single counterfactual at ``single_tp`` (read minutes after
    the baseline's 500), then the baseline's settings with the script's threads (A) and one
    thread (B) alternated in launches, ``A B A B A`` at ``rates``."""
    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("p0", kind="baseline", num_workers=0, throughput=500.0,
                      entry={"intra_op_threads": 2, "ranks_per_host": 2, "cpus_available": 2})
               .steps(n=5)
               .probe("p1", kind="threads", num_workers=0, throughput=single_tp,
                      entry={"threads": 1}).steps(n=5))
    for index, rate in enumerate(rates):
        role = "candidate" if index % 2 else "reference"
        builder.probe(f"p{2 + index}", kind="threads", num_workers=0, throughput=rate,
                      entry={"intra_op_threads": 1 if index % 2 else 2, "ranks_per_host": 2,
                             "cpus_available": 2, "launch": f"p{2 + index}",
                             "threads": 1 if index % 2 else None,
                             "pair": {"role": role, "index": index, "group": "threads-002"}}
                      ).steps(n=5)
    builder.summary["launcher"] = "none"
    return builder.build()


def test_an_alternated_threads_counterfactual_is_the_finding_with_its_interval():
    """The single counterfactual read 8x against a baseline measured minutes before; the
    alternation, its level and drift cancelled, reads 6x: the finding is the alternation's."""
    finding = thread_oversubscription(
        alternated_threads_run([600.0, 3700.0, 620.0, 3800.0, 640.0]), T)
    assert finding is not None and finding.severity == "high"
    assert "with 1 thread(s) per rank the script ran 6." in finding.evidence, finding.evidence
    assert "alternated A B A B A in launches (probes p2-p6)" in finding.evidence
    assert "8.00x" not in finding.evidence and "4,000" not in finding.evidence
    low, high = (float(x) for x in finding.evidence.split("[")[1].split("]")[0].split("-"))
    assert low < 6.0 < high
    assert finding.recommendation.startswith(
        "Measured in this run, alternated in launches: 1 thread(s) per rank")
    assert "torch.set_num_threads(1)" in finding.recommendation


def test_an_alternation_that_does_not_establish_the_threads_gain_is_no_finding():
    """The single read 8x; alternated, one thread ran as fast as the script's own: the
    alternation decides, and nothing is claimed."""
    assert thread_oversubscription(
        alternated_threads_run([600.0, 640.0, 700.0, 580.0, 610.0]), T) is None


def test_a_threads_gain_its_launches_cannot_tell_from_none_is_said_low_as_not_established():
    """Alternated, one thread read 1.38x, its interval 0.70-2.72x: what was seen is said,
    as not established, with how to check it; never as measured."""
    finding = thread_oversubscription(
        alternated_threads_run([600.0, 900.0, 500.0, 700.0, 640.0]), T)
    assert finding is not None and finding.severity == "low"
    assert "not established" in finding.title
    assert "ran 1.38x [0.70-2.72] as fast as with its own threads" in finding.evidence
    assert finding.evidence.endswith("not beyond the noise of those launches.")
    assert finding.recommendation.startswith("Not established: 1 thread(s) per rank measured "
                                             "1.38x [0.70-2.72] in alternated launches")
    assert "torch.set_num_threads(1)" in finding.recommendation
    assert "Measured in" not in finding.recommendation


def alternate_threads(builder: RunBuilder, first: int, rates, launch=None, workers=0
                      ) -> RunBuilder:
    """The settings with ``workers`` with the script's threads (A) and one thread (B)
    alternated at ``rates`` from probe ``first`` on: in windows of ``launch``, else a launch
    each."""
    for index, rate in enumerate(rates):
        role = "candidate" if index % 2 else "reference"
        probe_id = f"p{first + index}"
        builder.probe(probe_id, kind="threads", num_workers=workers, throughput=rate,
                      entry={"intra_op_threads": 1 if index % 2 else 2, "ranks_per_host": 2,
                             "cpus_available": 2, "launch": launch or probe_id,
                             "screened": launch is not None,
                             "threads": 1 if index % 2 else None,
                             "pair": {"role": role, "index": index,
                                      "group": f"threads-{first:03d}"}}).steps(n=5)
    return builder


def windows_threads_run(rates, then=()):
    """A baseline of 2 ranks x 2 threads on 2 CPUs, then its settings with its threads (A) and
    one thread (B) alternated in windows of one launch at ``rates`` (no launch of one thread
    alone), and where ``then`` holds rates, again a launch each."""
    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("p0", kind="baseline", num_workers=0, throughput=500.0,
                      entry={"intra_op_threads": 2, "ranks_per_host": 2, "cpus_available": 2})
               .steps(n=5))
    alternate_threads(builder, 1, rates, launch="p001-screen")
    if then:
        alternate_threads(builder, 1 + len(rates), then)
    builder.summary["launcher"] = "none"
    return builder.build()


def test_threads_alternated_in_windows_of_one_launch_are_said_so():
    """The finding says where its alternation ran: windows of one launch, not launches."""
    finding = thread_oversubscription(windows_threads_run(
        [600.0, 3700.0, 620.0, 3800.0, 640.0, 3750.0, 630.0]), T)
    assert finding is not None and finding.severity == "high"
    assert "alternated A B A B A B A in windows of one launch (probes p1-p7)" in \
        finding.evidence, finding.evidence
    assert finding.recommendation.startswith(
        "Measured in this run, alternated in windows of one launch: 1 thread(s) per rank")
    ratio = float(finding.evidence.split(" per rank the script ran ")[1].split("x")[0])
    assert 3700.0 / 640.0 <= ratio <= 3800.0 / 600.0


def test_the_recommendation_carries_the_threads_change_its_finding_measured():
    """The finding and the recommendation state one reading: an established gain is the
    recommendation's threads change with its figure and how it was checked; a gain not
    established, or none, is no change."""
    run = windows_threads_run([600.0, 3700.0, 620.0, 3800.0, 640.0, 3750.0, 630.0])
    findings, rec = evaluate(run)
    change = rec.threads
    assert change is not None and change["threads"] == 1 and change["script_threads"] == 2
    assert change["setting"] == "OMP_NUM_THREADS=1"
    finding = next(f for f in findings if f.rule == "thread-oversubscription")
    assert f"{change['speedup']:.2f}x [{change['interval'][0]:.2f}-" \
        f"{change['interval'][1]:.2f}]" in finding.evidence
    assert change["check"] == {"alternated": True, "launches": 1, "rounds": 3,
                               "whole_runs": False, "windows": True}
    assert change["probes"] == [f"p{i}" for i in range(1, 8)]
    assert change["config"]["num_workers"] == 0
    open_gain = alternated_threads_run([600.0, 900.0, 500.0, 700.0, 640.0])
    assert thread_oversubscription(open_gain, T).severity == "low"
    assert evaluate(open_gain).recommendation.threads is None
    assert evaluate(alternated_threads_run([600.0, 640.0, 700.0, 580.0, 610.0])
                    ).recommendation.threads is None
    single = evaluate(threads_run(threads_tp=1500.0)).recommendation.threads  # --pairs 0
    assert single is not None and single["interval"] is None
    assert single["check"]["alternated"] is False and single["probes"] == ["p0", "p1"]
    assert evaluate(threads_run()).recommendation.threads is None  # a prediction only


def test_windows_that_left_the_threads_gain_open_yield_to_the_launches_after_them():
    """The windows read one thread 1.05x, open; the launches after them read it 6x: the
    finding is the later alternation of the same settings, in launches."""
    finding = thread_oversubscription(windows_threads_run(
        [600.0, 640.0, 610.0, 630.0, 600.0, 650.0, 620.0],
        then=[600.0, 3700.0, 620.0, 3800.0, 640.0]), T)
    assert finding is not None and finding.severity == "high"
    assert "alternated A B A B A in launches (probes p8-p12)" in finding.evidence


def test_of_two_configurations_alternated_the_gain_beyond_noise_is_the_finding():
    """The script's settings read one thread 1.3x in windows that cannot tell it from none;
    the best configuration (2 workers) read it 1.2x beyond noise in the same launch: the
    established gain is the finding, not the larger open one."""
    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("p0", kind="baseline", num_workers=0, throughput=500.0,
                      entry={"intra_op_threads": 2, "ranks_per_host": 2, "cpus_available": 2})
               .steps(n=5))
    alternate_threads(builder, 1, [600.0, 1000.0, 500.0, 600.0, 650.0, 900.0, 560.0],
                      launch="p001-screen")
    alternate_threads(builder, 8, [600.0, 720.0, 602.0, 724.0, 598.0, 718.0, 601.0],
                      launch="p001-screen", workers=2)
    builder.summary["launcher"] = "none"
    finding = thread_oversubscription(builder.build(), T)
    assert finding is not None and finding.severity == "medium"
    assert "(probes p8-p14)" in finding.evidence and "num_workers=2" in finding.evidence


def test_threads_to_fit_is_the_one_test():
    from ddp_profile.profiler.cpus import threads_to_fit

    assert threads_to_fit(2, 2, 0.0, 2) == 1
    assert threads_to_fit(16, 2, 0.0, 16) == 8
    assert threads_to_fit(8, 2, 4.0, 16) == 6  # busy workers count: (16 - 4) // 2
    assert threads_to_fit(1, 2, 0.0, 2) is None  # 1 thread a rank fits
    assert threads_to_fit(4, 2, 0.0, 8) is None
    assert threads_to_fit(None, 2, 0.0, 2) is None


def test_thread_oversubscription_cites_both_throughputs():
    finding = thread_oversubscription(threads_run(threads_tp=1000.0), T)
    assert finding is not None and finding.severity == "high"  # 2.00x
    assert "2 rank(s) per machine x 2 intra-op threads compete for 2 available CPUs" \
        in finding.evidence
    assert "1,000.0 samples/s (probe p1)" in finding.evidence and "500.0" in finding.evidence
    assert "Measured in this run: 1 thread(s) per rank" in finding.recommendation
    assert "p1" not in finding.recommendation  # ids stay in the evidence
    assert "torch.set_num_threads(1)" in finding.recommendation
    medium = thread_oversubscription(threads_run(threads_tp=600.0), T)
    assert medium is not None and medium.severity == "medium"


def test_thread_advice_follows_the_launcher():
    torchrun = thread_oversubscription(threads_run(1000.0, launcher="torchrun"), T)
    assert "OMP_NUM_THREADS=1 torchrun" in torchrun.recommendation
    inplace = thread_oversubscription(threads_run(1000.0, launcher="inplace"), T)
    assert "pod spec" in inplace.recommendation and "srun --export" in inplace.recommendation


def test_no_measured_gain_no_finding_and_unmeasured_is_a_prediction():
    assert thread_oversubscription(threads_run(threads_tp=505.0), T) is None
    predicted = thread_oversubscription(threads_run(), T)
    assert predicted is not None and predicted.severity == "low"
    assert predicted.recommendation.startswith("Prediction (not measured)")


def test_threads_that_fit_are_no_finding():
    assert thread_oversubscription(threads_run(1000.0, intra_op=1), T) is None
    assert thread_oversubscription(threads_run(1000.0, intra_op=4, cpus=8), T) is None


def test_the_recommendation_says_how_to_set_the_measured_threads():
    from ddp_profile.rules.recommend import recommend

    notes = recommend(threads_run(threads_tp=1000.0), T).notes
    assert any("Measured in this run: 1 thread(s) per rank" in n for n in notes), notes
    assert not any("thread" in n for n in recommend(threads_run(), T).notes)


def test_rules_read_the_ranks_per_host_and_cpus_the_probe_decided():
    """One author: sweep.probe decides ranks_per_host and cpus_available (the fewest of the
    ranks'); every host rule reads that, the contexts only when the entry lacks it."""
    from ddp_profile.rules.tables import cpus_available, local_ranks

    run = (RunBuilder(world_size=2, cpus=16)
           .probe("p0", kind="baseline", num_workers=5,
                  entry={"ranks_per_host": 1, "cpus_available": 4}).steps(n=5).build())
    assert local_ranks(run, "p0") == 1 and cpus_available(run, "p0") == 4
    finding = worker_oversubscription(run, T)
    assert finding is not None and "1 rank(s) per machine" in finding.evidence
    plain = RunBuilder(world_size=2, cpus=16).probe("p0", kind="baseline").steps(n=5).build()
    assert local_ranks(plain, "p0") == 2 and cpus_available(plain, "p0") == 16


def test_idle_workers_beyond_the_cpus_compete_for_nothing():
    """A public script's case (imagenet --dummy): 2 ranks x 2 workers on 2 CPUs, busy on 0.03
    cores (``sweep.probe`` decides that from the batches' CPU cost; the rule reads it)."""
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("p", kind="baseline", num_workers=2, entry={"worker_cores": 0.03})
           .steps(n=5, data_wait=0.0, compute=2.0).build())
    assert worker_oversubscription(run, T) is None


def test_busy_workers_beyond_the_cpus_are_flagged_with_the_cores_they_use():
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("p", kind="baseline", num_workers=2, entry={"worker_cores": 1.6})
           .steps(n=5, data_wait=0.01, compute=0.01).build())
    finding = worker_oversubscription(run, T)
    assert finding is not None
    assert "measured busy on 1.6 cores" in finding.evidence and "compete for 2 available CPUs" in \
        finding.evidence


def test_threads_are_judged_at_the_best_configuration_where_its_workers_tip_the_cpus_over():
    # one rank of 2 threads fits 2 CPUs alone; with 16 workers busy on 0.4 cores it does not
    def run_with(threads_tp):
        builder = (RunBuilder(world_size=1, cpus=2)
                   .probe("p0", kind="baseline", num_workers=0, throughput=400.0,
                          entry={"intra_op_threads": 2, "ranks_per_host": 1,
                                 "cpus_available": 2, "worker_cores": 0.0}).steps(n=5)
                   .probe("p1", kind="sweep", num_workers=16, throughput=5000.0,
                          entry={"intra_op_threads": 2, "ranks_per_host": 1,
                                 "cpus_available": 2, "worker_cores": 0.4}).steps(n=5)
                   .probe("p2", kind="threads", num_workers=16, throughput=threads_tp)
                   .steps(n=5))
        builder.summary["launcher"] = "torchrun"
        return builder.build()

    finding = thread_oversubscription(run_with(6300.0), T)
    assert finding is not None and finding.severity == "medium"  # 1.26x
    assert "1 rank(s) per machine x 2 intra-op threads + DataLoader workers busy on 0.4 " \
           "cores compete for 2 available CPUs with num_workers=16," in finding.evidence
    assert "6,300.0 samples/s (probe p2) against 5,000.0 (sweep p1), 1.26x" in finding.evidence
    assert finding.recommendation.startswith("Measured in this run: 1 thread(s) per rank "
                                             "with num_workers=16,")
    assert "OMP_NUM_THREADS=1 torchrun" in finding.recommendation
    # measured without a gain: no finding, and the baseline alone predicts nothing
    assert thread_oversubscription(run_with(5050.0), T) is None
    # the baseline's threads fit its CPUs: what it measured as waiting is not CPU waiting, so
    # the loading rules still speak (io-bound-loading keeps its finding)
    from ddp_profile.rules.threads import baseline_oversubscribed

    assert not baseline_oversubscribed(run_with(6300.0), T)
    assert baseline_oversubscribed(threads_run(threads_tp=1000.0), T)
