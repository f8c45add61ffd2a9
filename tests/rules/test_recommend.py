"""recommend(): best probe, ties to the cheaper setting, compute-bound keeps its baseline."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_profile.rules import Thresholds
from ddp_profile.rules.recommend import recommend, recommendation_to_dict, snippet_for
from tests.rules.tables import RunBuilder

T = Thresholds()


def loader_sweep(*probes: tuple, jitter: float = 0.02, base_wait: float = 0.05, **kw):
    """Baseline with 0 workers waiting ``base_wait``; then (id, settings, data_wait) probes.

    Compute scales with the batch size (0.05 s per 32 samples).
    """
    builder = (RunBuilder(world_size=2, **kw).probe("base", kind="baseline", num_workers=0)
               .steps(data_wait=base_wait, compute=0.05, jitter=jitter))
    for seed, (probe_id, settings, wait) in enumerate(probes, start=1):
        compute = 0.05 * settings.get("batch_size", 32) / 32
        builder.probe(probe_id, **settings).steps(data_wait=wait, compute=compute,
                                                  jitter=jitter, seed=seed)
    return builder


def test_picks_the_fastest_probe():
    run = loader_sweep(("w2", {"num_workers": 2}, 0.02), ("w4", {"num_workers": 4}, 0.0)).build()
    rec = recommend(run, T)
    assert rec.probe_id == "w4" and rec.config["num_workers"] == 4
    assert rec.expected_speedup == pytest.approx(0.101 / 0.051, rel=0.05)
    # the sweep does not switch persistent_workers: the snippet says only what ran
    assert "num_workers=4" in rec.snippet and "persistent_workers" not in rec.snippet


def test_tie_goes_to_fewer_workers():
    run = loader_sweep(("w8", {"num_workers": 8}, 0.0), ("w4", {"num_workers": 4}, 0.0005)).build()
    assert recommend(run, T).probe_id == "w4"


def test_tie_goes_to_pinning_off_and_smaller_prefetch():
    run = loader_sweep(("pin", {"num_workers": 4, "pin_memory": True, "prefetch_factor": 4}, 0.0),
                       ("plain", {"num_workers": 4, "prefetch_factor": 2}, 0.0005)).build()
    assert recommend(run, T).probe_id == "plain"


def test_tie_goes_to_batch_size_nearest_the_baseline():
    run = loader_sweep(("bs128", {"num_workers": 4, "batch_size": 128}, 0.0),
                       ("bs32", {"num_workers": 4, "batch_size": 32}, 0.0002)).build()
    assert recommend(run, T).probe_id == "bs32"


def test_a_clear_gain_beats_a_cheaper_setting():
    run = loader_sweep(("w2", {"num_workers": 2}, 0.02), ("w8", {"num_workers": 8}, 0.0)).build()
    assert recommend(run, T).probe_id == "w8"


def test_noisy_steps_widen_the_tie():
    # the rates alone: the wait's tie-break (the next test) out of play
    rates_alone = dataclasses.replace(T, wait_tie_share=1.0)
    quiet = loader_sweep(("w2", {"num_workers": 2}, 0.004), ("w8", {"num_workers": 8}, 0.0),
                         jitter=0.0).build()
    noisy = loader_sweep(("w2", {"num_workers": 2}, 0.004), ("w8", {"num_workers": 8}, 0.0),
                         jitter=0.3).build()
    assert recommend(quiet, rates_alone).probe_id == "w8"
    assert recommend(noisy, rates_alone).probe_id == "w2"


def test_a_tie_that_waits_for_its_data_goes_to_the_settings_that_do_not():
    """No workers and 2 workers at batch 32, measured in different launches, tie by their
    rates (a launch's level is noise), but the loop without workers waits 15 % of each step
    making its batches and the other 3 %, and runs faster by more than half of that: the wait,
    read within each probe's own steps, breaks the tie, not the cost (timm's ``train.py``;
    plain launches ran 2 workers at batch 32 1.16x the script). Where the rate does not bear
    the wait out, the wait differs by less than ``wait_tie_share``, or both have workers, the
    cheaper one keeps it."""
    from ddp_profile.profiler.decide.choose import Candidate, ChoiceThresholds, choose
    from ddp_profile.profiler.settings import LoaderSettings

    thresholds = ChoiceThresholds(launch_sd=0.08)  # a noisy run's launches

    def pick(rate: float, wait: float) -> str:
        base = Candidate("p000", LoaderSettings(0, False, None, 16), 47.4, 0.01, 0.12,
                         launch="a")
        none = Candidate("p004", LoaderSettings(0, False, None, 32), 62.9, 0.014, 0.15,
                         launch="b")
        two = Candidate("p007", LoaderSettings(2, False, 2, 32), rate, 0.026, wait,
                        launch="c")
        return choose([base, none, two], base, thresholds).id

    assert pick(69.6, 0.034) == "p007"  # 1.11x, 11.7 % of each step's wait removed
    assert pick(64.0, 0.034) == "p004"  # 1.02x: the wait went, the rate did not follow
    assert pick(69.6, 0.11) == "p004"  # 4 % less wait: the cost decides
    # between worker counts the cost decides: their waits follow their pools' bursts
    few = Candidate("p002", LoaderSettings(7, False, 2, 16), 2950.0, 0.04, 0.55, launch="s")
    many = Candidate("p003", LoaderSettings(14, False, 2, 16), 3250.0, 0.05, 0.40, launch="s")
    base = Candidate("p000", LoaderSettings(0, False, None, 16), 580.0, 0.005, 0.94,
                     launch="a")
    assert choose([base, few, many], base, thresholds).id == "p002"



def test_compute_bound_keeps_its_baseline_and_never_says_no_faster_where_it_measured_faster():
    run = loader_sweep(("w4", {"num_workers": 4}, 0.0), base_wait=0.002).build()  # 4 % faster
    rec = recommend(run, T)
    assert rec.probe_id == "base" and rec.expected_speedup == 1.0
    assert [item["probe"] for item in rec.unsettled] == ["w4"]
    note = next(note for note in rec.notes if "compute-bound" in note)
    assert "1 setting(s) measured faster than it, up to 1.0" in note, note
    assert "not established" in note and "cannot speed it up" not in note
    assert not any("no faster" in n for n in rec.notes)
    same = loader_sweep(("w4", {"num_workers": 4}, 0.002), base_wait=0.002).build()
    rec = recommend(same, T)
    assert rec.probe_id == "base" and not rec.unsettled
    assert any("compute-bound" in note and "cannot speed it up much" in note
               for note in rec.notes)


def test_compute_bound_moves_only_when_clearly_faster():
    run = (RunBuilder().probe("base", kind="baseline", num_workers=2).steps(data_wait=0.003)
           .probe("bs64", num_workers=2, batch_size=64).steps(data_wait=0.003, compute=0.06)
           .build())
    rec = recommend(run, T)
    assert rec.probe_id == "bs64"
    assert any("learning rate" in note for note in rec.notes)
    # compute-bound, and a setting measured faster: no note says settings cannot help
    assert any("compute-bound, yet the recommendation measured faster" in note
               for note in rec.notes)
    assert not any("cannot speed it up" in note for note in rec.notes)


TRUE_SPEEDUP = 0.101 / 0.051  # step time without workers / with four (see ``known_ratio``)


def known_ratio(steps: int, seed: int, jitter: float = 0.3):
    """Baseline steps of 101 ms (50 ms waiting), w4 steps of 51 ms; compute jitters."""
    return (RunBuilder().probe("base", kind="baseline", num_workers=0)
            .steps(n=steps, data_wait=0.05, compute=0.05, jitter=jitter, seed=2 * seed)
            .probe("w4", num_workers=4)
            .steps(n=steps, data_wait=0.0, compute=0.05, jitter=jitter, seed=2 * seed + 1)
            .build())


def test_the_interval_covers_a_known_speedup_about_as_often_as_it_claims():
    intervals = [recommend(known_ratio(20, seed), T).expected_speedup_interval
                 for seed in range(40)]
    covered = sum(lo <= TRUE_SPEEDUP <= hi for lo, hi in intervals)
    assert covered >= 30  # a 90 % interval: about 36 of 40; a point "interval" covers none


def test_the_interval_narrows_with_more_steps():
    def mean_width(steps: int) -> float:
        widths = [hi - lo for lo, hi in (recommend(known_ratio(steps, seed), T)
                                         .expected_speedup_interval for seed in range(10))]
        return sum(widths) / len(widths)

    few, many = mean_width(20), mean_width(320)
    assert 0.1 < few < 0.8
    assert many < 0.4 * few  # 16 times the steps: about a quarter of the width


def test_interval_is_seeded_and_widens_with_confidence():
    run = loader_sweep(("w4", {"num_workers": 4}, 0.0), jitter=0.2).build()
    lo, hi = recommend(run, T).expected_speedup_interval
    assert recommend(run, T).expected_speedup_interval == (lo, hi)
    wider = recommend(run, Thresholds(interval_confidence=0.99)).expected_speedup_interval
    assert wider[0] < lo and wider[1] > hi


def test_ceiling_share_and_notes_when_far_from_the_ceiling():
    builder = loader_sweep(("w4", {"num_workers": 4}, 0.03), cpus=4)
    builder.samples("host", cpu_percent=98.0)
    builder.probe("ceiling", kind="ceiling").steps(data_wait=0.0, compute=0.05)
    rec = recommend(builder.build(), T)
    assert rec.probe_id == "w4"
    assert rec.ceiling_share == pytest.approx(0.051 / 0.081, rel=0.05)
    assert any("more CPU cores" in note and "4 CPUs" in note for note in rec.notes)


def test_no_ceiling_note_when_close_to_the_ceiling():
    builder = loader_sweep(("w4", {"num_workers": 4}, 0.0))
    builder.probe("ceiling", kind="ceiling").steps(data_wait=0.0, compute=0.05)
    rec = recommend(builder.build(), T)
    assert rec.ceiling_share > 0.95 and rec.notes == ()


def test_failed_probes_are_never_recommended():
    run = loader_sweep(("w4", {"num_workers": 4}, 0.0)).probe("w8", status="oom",
                                                              throughput=1e9).build()
    assert recommend(run, T).probe_id == "w4"


def test_nothing_measured():
    run = RunBuilder().probe("base", kind="baseline", status="crash").build()
    rec = recommend(run, T)
    assert rec.probe_id is None and rec.expected_speedup is None and rec.notes


def test_snippet_without_workers_omits_worker_only_arguments():
    snippet = snippet_for({"num_workers": 0, "pin_memory": True, "prefetch_factor": 2,
                           "batch_size": 32})
    assert snippet == "DataLoader(dataset, batch_size=32, num_workers=0, pin_memory=True)"


def test_the_snippet_keeps_persistent_workers_where_the_script_set_them():
    run = (RunBuilder().probe("base", kind="baseline", num_workers=2,
                              loader={"persistent_workers": True})
           .steps(data_wait=0.0).build())
    assert "num_workers=2, pin_memory=False, prefetch_factor=2, persistent_workers=True" in \
        recommend(run, T).snippet


def test_recommendation_to_dict_is_plain():
    data = recommendation_to_dict(recommend(loader_sweep(("w4", {"num_workers": 4}, 0.0))
                                            .build(), T))
    assert isinstance(data["expected_speedup_interval"], list)
    assert data["config"]["num_workers"] == 4


def test_a_short_probe_is_recommended_over_full_ones_only_beyond_its_wider_error():
    close = loader_sweep(("w2", {"num_workers": 2}, 0.02),
                         ("w4", {"num_workers": 4, "short": True}, 0.016)).build()
    rec = recommend(close, T)
    assert rec.probe_id == "w2"
    assert not any(" is short, " in note for note in rec.notes)
    clear = loader_sweep(("w2", {"num_workers": 2}, 0.02),
                         ("w4", {"num_workers": 4, "short": True}, 0.0)).build()
    rec = recommend(clear, T)
    assert rec.probe_id == "w4" and any(" is short, " in note for note in rec.notes)


def test_a_recommendation_that_rests_on_a_short_probe_says_so():
    builder = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0, short=True)
               .steps(n=2, data_wait=0.05, compute=0.05))
    rec = recommend(builder.build(), T)
    assert rec.probe_id == "base"
    assert any("probe base is short, its figures rest on 2 step(s)" in n for n in rec.notes)


def test_a_ceiling_share_above_100_percent_is_explained():
    run = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0)
           .steps(data_wait=0.001, compute=0.05)
           .probe("c", kind="ceiling", num_workers=0, throughput=300.0)
           .steps(data_wait=0.0, compute=0.05).build())
    rec = recommend(run, T)
    assert rec.ceiling_share is not None and rec.ceiling_share > 1.0
    assert any("above 100 % only by measurement noise" in n for n in rec.notes), rec.notes


def _ceiling_run(wait: float, cpu_ms: float, wait_ms: float, ceiling_compute: float):
    from tests.rules.tables import RunBuilder

    return (RunBuilder(world_size=2, cpus=2)
            .probe("base", kind="baseline", num_workers=0).steps(data_wait=wait, compute=0.02)
            .loading(cpu_ms, wait_ms)
            .probe("ceil", kind="ceiling", num_workers=0)
            .steps(data_wait=0.0, compute=ceiling_compute).build())


def test_ceiling_gap_is_not_blamed_on_loading_that_hardly_waits():
    from ddp_profile.rules.recommend import recommend

    # 3 % data wait, 28 % of a ceiling whose steps compute 4x faster
    rec = recommend(_ceiling_run(wait=0.0006, cpu_ms=0.1, wait_ms=3.0, ceiling_compute=0.005))
    (note,) = [n for n in rec.notes if "ceiling" in n]
    assert "does not explain the gap" in note
    assert "storage" not in note and "NVMe" not in note and "num_workers" not in note


def test_ceiling_gap_from_cpu_bound_loading_names_the_cpu_not_storage():
    from ddp_profile.rules.recommend import recommend

    # the same compute as the ceiling's: the 74 % data wait is the whole gap
    rec = recommend(_ceiling_run(wait=0.06, cpu_ms=3.4, wait_ms=0.1, ceiling_compute=0.02))
    (note,) = [n for n in rec.notes if "ceiling" in n]
    assert "The data wait explains the gap" in note and "3.4 ms of CPU" in note
    assert "NVMe" not in note and "storage" not in note


def test_cheap_loading_is_not_told_to_take_work_off_the_cpus():
    """A public script's case: MNIST-sized samples (0.02 ms of CPU each), loading in the loop
    (7 % data wait), one worker measured slower: the CPUs could make enough samples."""
    from ddp_profile.rules.recommend import recommend
    from tests.rules.tables import RunBuilder

    run = (RunBuilder(world_size=1, cpus=2)
           .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.0015, compute=0.02)
           .loading(0.02, 0.0)
           .probe("w1", num_workers=1).steps(data_wait=0.002, compute=0.022).loading(0.03, 0.03)
           .probe("ceil", kind="ceiling", num_workers=0).steps(data_wait=0.0, compute=0.016)
           .build())
    (note,) = [n for n in recommend(run).notes if "ceiling" in n]
    assert "compete for the same CPUs" in note, note
    assert "offline" not in note and "NVMe" not in note
    # the worker measured 3 % faster, short of the gain a compute-bound script moves for:
    # kept, and the note says it measured faster, never "no faster"
    faster = (RunBuilder(world_size=1, cpus=2)
              .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.0015, compute=0.02)
              .loading(0.02, 0.0)
              .probe("w1", num_workers=1).steps(data_wait=0.0009, compute=0.02)
              .loading(0.03, 0.03)
              .probe("ceil", kind="ceiling", num_workers=0).steps(data_wait=0.0, compute=0.016)
              .build())
    rec = recommend(faster)
    assert rec.probe_id == "base" and [item["probe"] for item in rec.unsettled] == ["w1"]
    (note,) = [n for n in rec.notes if "ceiling" in n]
    assert "faster than the recommendation but not established" in note, note
    assert "no faster" not in note and "compete" not in note


def test_ceiling_gap_under_oversubscribed_threads_does_not_blame_storage():
    """The same wait-bound loading as a storage note would cite, but the ranks' thread pools
    oversubscribe the CPUs (measured): the ceiling note names the threads, not storage."""
    from ddp_profile.rules.recommend import recommend
    from tests.rules.tables import RunBuilder

    builder = (RunBuilder(world_size=2, cpus=2)
               .probe("base", kind="baseline", num_workers=0,
                      entry={"intra_op_threads": 2, "ranks_per_host": 2, "cpus_available": 2})
               .steps(data_wait=0.06, compute=0.02).loading(0.1, 3.0)
               .probe("threads", kind="threads", num_workers=0)
               .steps(data_wait=0.01, compute=0.01)
               .probe("ceil", kind="ceiling", num_workers=0)
               .steps(data_wait=0.0, compute=0.02))
    builder.summary["launcher"] = "torchrun"
    rec = recommend(builder.build())
    (note,) = [n for n in rec.notes if "ceiling" in n]
    assert "thread-oversubscription" in note, note
    assert "NVMe" not in note and "shards" not in note
    plain = recommend(_ceiling_run(wait=0.06, cpu_ms=0.1, wait_ms=3.0, ceiling_compute=0.02))
    assert any("NVMe" in n for n in plain.notes)  # threads that fit: storage may be blamed


def test_ceiling_note_never_predicts_a_worker_count_already_measured():
    """Wait-bound loading; the model wants 5 workers a rank; 8 were measured and tied the
    chosen 4: the note must not offer 5 as 'predicted, not measured'."""
    from ddp_profile.rules.recommend import recommend
    from tests.rules.tables import RunBuilder

    run = (RunBuilder(world_size=2, cpus=2)
           .probe("base", kind="baseline", num_workers=0).steps(data_wait=0.06, compute=0.02)
           .loading(0.1, 3.0)
           .probe("w4", num_workers=4).steps(data_wait=0.02, compute=0.02).loading(0.1, 3.0)
           .probe("w8", num_workers=8).steps(data_wait=0.02, compute=0.02).loading(0.1, 3.0)
           .probe("ceil", kind="ceiling", num_workers=0).steps(data_wait=0.0, compute=0.02)
           .build())
    assert 4 < run.summary["capacity"]["workers_for_demand"] <= 8
    rec = recommend(run)
    assert rec.probe_id == "w4"
    (note,) = [n for n in rec.notes if "ceiling" in n]
    assert "predicted, not measured" not in note, note
    assert "8 worker(s) per rank" in note, note


def with_storage(builder, share: float, read: float = 131072.0):
    """The current probe's producers read ``read`` bytes a sample, ``share`` from storage."""
    builder.loading(cpu_ms=0.1, wait_ms=1.0)
    builder.probes[-1]["loading"].update(read_per_sample_bytes=read, storage_share=share)
    return builder


def test_a_probe_read_warm_against_a_cold_baseline_is_labelled_not_like_for_like():
    """The baseline read its files from storage, the later probe from the page cache: the
    speedup is partly the cache, and the recommendation says so."""
    builder = RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0)
    with_storage(builder.steps(data_wait=0.05, compute=0.05, jitter=0.02), 0.95)
    with_storage(builder.probe("w2", num_workers=2).steps(data_wait=0.0, compute=0.05,
                                                          jitter=0.02, seed=1), 0.02)
    rec = recommend(builder.build(), T)
    assert rec.probe_id == "w2" and rec.like_for_like is False
    note = next(n for n in rec.notes if n.startswith("Not like for like"))
    assert "base read 95 %" in note and "w2 2 %" in note
    builder = RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0)
    with_storage(builder.steps(data_wait=0.05, compute=0.05, jitter=0.02), 0.9)
    with_storage(builder.probe("w2", num_workers=2).steps(data_wait=0.0, compute=0.05,
                                                          jitter=0.02, seed=1), 0.85)
    rec = recommend(builder.build(), T)
    assert rec.like_for_like is True and not any("like for like" in n for n in rec.notes)
    assert recommend(loader_sweep(("w2", {"num_workers": 2}, 0.0)).build(),
                     T).like_for_like is None  # nothing read: unknown
