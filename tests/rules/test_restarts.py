"""persistent-workers: what the epoch restarts cost, measured, and what keeping the workers
alive is predicted to give."""

from __future__ import annotations

from ddp_profile.rules import Thresholds
from ddp_profile.rules.findings.restarts import persistent_workers
from tests.rules.tables import RunBuilder, empty_run

T = Thresholds()


def restarting(steady_at_4: float = 2600.0, as_run_at_4: float = 350.0,
               as_run_at_0: float = 600.0):
    """The script's own 2 workers restart every 62-step epoch; 4 workers run fast between
    restarts and slowly as run; no workers at all is the best configuration as run."""
    def epochs(as_run: float, steady: float) -> dict:
        return {"throughput": as_run, "steady_throughput": steady, "epoch_steps": 62,
                "epoch_restart_s": 62 * 32 * (1 / as_run - 1 / steady)}
    return (RunBuilder(world_size=2)
            .probe("base", kind="baseline", num_workers=2, throughput=470.0,
                   entry=epochs(470.0, 1680.0)).steps(n=20, data_wait=0.05)
            .probe("w0", num_workers=0, throughput=as_run_at_0).steps(n=20, data_wait=0.03)
            .probe("w4", num_workers=4, throughput=as_run_at_4,
                   entry=epochs(as_run_at_4, steady_at_4)).steps(n=20, data_wait=0.05)
            .build())


def test_the_restart_is_cited_with_the_fastest_steady_rate_as_a_prediction():
    finding = persistent_workers(restarting(), T)
    assert finding is not None and finding.rule == "persistent-workers"
    assert "With num_workers=4," in finding.evidence and "per epoch of 62 steps" in finding.evidence
    assert "2,600 samples/s between restarts" in finding.evidence
    assert "num_workers=4, persistent_workers=True" in finding.recommendation
    # against the recommendation as run (no workers: 600 samples/s), labelled a prediction
    assert "4.33x the recommended" in finding.recommendation
    assert "not a measurement of persistent workers" in finding.recommendation
    assert finding.severity == "high"


def test_no_finding_where_the_restart_costs_little_of_the_epoch():
    assert persistent_workers(restarting(steady_at_4=360.0, as_run_at_4=350.0), T) is not None
    cheap = (RunBuilder(world_size=2)
             .probe("base", kind="baseline", num_workers=2, throughput=1000.0,
                    entry={"throughput": 1000.0, "steady_throughput": 1020.0,
                           "epoch_steps": 62, "epoch_restart_s": 0.04})
             .steps(n=20).build())
    assert persistent_workers(cheap, T) is None


def epochs_run(first_batch_s: float, persistent: bool = False, workers: int = 4):
    builder = (RunBuilder(world_size=2)
               .probe("p", kind="baseline", num_workers=workers,
                      loader={"persistent_workers": persistent})
               .steps(n=20, compute=0.05))  # about 1.2 s per rank
    for epoch in range(3):
        builder.loader_iter(epoch, first_batch_s)
    return builder.build()


def test_a_run_recorded_before_the_epochs_were_measured_reads_the_first_batches():
    finding = persistent_workers(epochs_run(first_batch_s=0.2), T)
    assert finding is not None and finding.rule == "persistent-workers"
    assert "2 later epoch(s)" in finding.evidence and "0.40 s" in finding.evidence


def test_persistent_workers_not_when_already_persistent():
    assert persistent_workers(epochs_run(0.2, persistent=True), T) is None


def test_persistent_workers_not_when_restart_is_cheap():
    assert persistent_workers(epochs_run(0.001), T) is None


def test_persistent_workers_not_without_workers():
    assert persistent_workers(epochs_run(0.2, workers=0), T) is None


def test_the_rule_copes_with_an_empty_run():
    assert persistent_workers(empty_run(), T) is None


def test_no_finding_where_keeping_another_configurations_workers_would_still_be_slower():
    """A real run (128 KiB files from the page cache, 2 ranks): the script has no workers and
    is recommended as it is; 1 worker restarts each epoch, 19,409 samples/s between restarts
    against the recommendation's 23,508: advising persistent workers there would advise a
    slower loader. The script's own restarting loader is cited whatever the recommendation."""
    def run(base_workers: int, steady: float):
        entry = {"throughput": 16466.0, "steady_throughput": steady, "epoch_steps": 32,
                 "epoch_restart_s": 0.04}
        builder = RunBuilder(world_size=2)
        if base_workers:
            builder.probe("base", kind="baseline", num_workers=1, throughput=16466.0,
                          entry=entry).steps(n=20, data_wait=0.01)
            builder.probe("w0", num_workers=0, throughput=23508.0).steps(n=20, data_wait=0.01)
        else:
            builder.probe("base", kind="baseline", num_workers=0, throughput=23508.0) \
                .steps(n=20, data_wait=0.01)
            builder.probe("w1", num_workers=1, throughput=16466.0, entry=entry) \
                .steps(n=20, data_wait=0.01)
        return builder.build()

    assert persistent_workers(run(0, 19409.0), T) is None
    faster = persistent_workers(run(0, 30000.0), T)  # predicted above the recommendation
    assert faster is not None and "num_workers=1, persistent_workers=True" in \
        faster.recommendation
    own = persistent_workers(run(1, 19409.0), T)  # the script's own loader restarts
    assert own is not None and "With num_workers=1," in own.evidence


def test_no_finding_where_a_launch_saw_the_loader_keep_its_iterator_past_an_epoch():
    """A loader that keeps one iterator over a sampler repeated forever: a screen that ran
    past an epoch saw it, and every probe of the run reads it so (the baseline's own launch
    was too short to see it)."""
    run = restarting()
    assert persistent_workers(run, T) is not None
    run.contexts[("w4", 0)]["keeps_iterator"] = True
    assert persistent_workers(run, T) is None


def measured_persistence(gain: float, drift: float = 0.02, noise: tuple = ()):
    """The script's own 2 workers restart every 62-step epoch (the baseline, also the only
    configuration); then the sweep's alternation of them as they are (A) and with
    ``persistent_workers=True`` (B), A B A B A in launches, on a machine drifting ``drift`` a
    launch; B runs ``gain`` times A."""
    builder = (RunBuilder(world_size=2)
               .probe("base", kind="baseline", num_workers=2, prefetch_factor=2,
                      throughput=470.0,
                      entry={"throughput": 470.0, "steady_throughput": 1680.0,
                             "epoch_steps": 62, "epoch_restart_s": 3.0})
               .steps(n=20, data_wait=0.05))
    for index, role in enumerate(("reference", "candidate") * 2 + ("reference",)):
        rate = 470.0 * (gain if role == "candidate" else 1.0) * (1 + drift) ** index
        rate *= noise[index] if index < len(noise) else 1.0
        builder.probe(f"k{index}", kind="persistent", num_workers=2, prefetch_factor=2,
                      throughput=rate,
                      entry={"launch": f"k{index}",
                             "pair": {"role": role, "index": index, "group": "persistent-002"},
                             **({"persistent_workers": True} if role == "candidate" else {})})
    return builder.build()


def test_persistent_workers_measured_faster_is_told_as_measured_and_set_in_the_snippet():
    from ddp_profile.rules import evaluate

    run = measured_persistence(1.6, noise=(1.0, 1.01, 0.99, 1.0, 1.005))
    finding = persistent_workers(run, T)
    assert finding is not None and finding.rule == "persistent-workers"
    assert "persistent_workers=True ran 1.61x [1.4" in finding.evidence, finding.evidence
    assert "alternated A B A B A in launches" in finding.evidence
    assert "probes k0-k4" in finding.evidence and "3.00 s per epoch of 62 steps" in \
        finding.evidence
    assert finding.recommendation.startswith(
        "Keep the workers alive: DataLoader(..., num_workers=2, persistent_workers=True). "
        "Measured: 1.61x [1.4")
    assert "prediction" not in finding.evidence + finding.recommendation
    assert finding.severity == "high"
    analysis = evaluate(run)
    assert "persistent_workers=True" in analysis.recommendation.snippet
    assert any("persistent_workers=True on top of it ran 1.61x" in note
               for note in analysis.recommendation.notes), analysis.recommendation.notes


def test_persistent_workers_measured_within_noise_is_no_finding_and_not_in_the_snippet():
    """A 3 % gain on launches 4 % apart: measured, and no gain this check can tell."""
    from ddp_profile.rules import evaluate

    run = measured_persistence(1.03, noise=(1.0, 0.96, 1.04, 1.03, 0.97))
    assert persistent_workers(run, T) is None
    analysis = evaluate(run)
    assert "persistent_workers" not in analysis.recommendation.snippet
    assert "persistent-workers" not in [f.rule for f in analysis.findings]


def kept_instead(gain: float, noise: tuple = (), first: tuple = (), whole: bool = False):
    """The script runs without workers (the baseline, kept: 3 workers restarting every
    32-step epoch spend half of it starting, and run no faster as the script runs them);
    then the sweep's alternation of the script's settings (A) and 3 workers with
    ``persistent_workers=True`` (B), A B A B A in launches; B runs ``gain`` times A.
    ``first``: each side's first batch (A, B) in seconds, where given. ``whole``: each
    launch ran the script to its end (119 of 125 steps after a warm-up of 5)."""
    builder = (RunBuilder(world_size=2)
               .probe("base", kind="baseline", num_workers=0, prefetch_factor=None,
                      throughput=1000.0).steps(n=20, data_wait=0.3)
               .probe("w3", num_workers=3, throughput=990.0,
                      entry={"throughput": 990.0, "steady_throughput": 2100.0,
                             "epoch_steps": 32, "epoch_restart_s": 0.55})
               .steps(n=20, data_wait=0.05))
    for index, role in enumerate(("reference", "candidate") * 2 + ("reference",)):
        rate = 1000.0 * (gain if role == "candidate" else 1.0) * (1.01 ** index)
        rate *= noise[index] if index < len(noise) else 1.0
        workers = 3 if role == "candidate" else 0
        builder.probe(f"k{index}", kind="persistent", num_workers=workers,
                      prefetch_factor=2 if workers else None, throughput=rate,
                      loader={"persistent_workers": role == "candidate"},
                      entry={"launch": f"k{index}",
                             "pair": {"role": role, "index": index, "group": "persistent-003"},
                             **({"persistent_workers": True} if role == "candidate" else {}),
                             **({"time_to_first_batch_s": first[role == "candidate"]}
                                if first else {}),
                             **({"short": True, "steps_measured": 119, "warmup": 5,
                                 "steps": 125, "per_rank": [{"rank": 0}, {"rank": 1}]}
                                if whole else {})})
        builder.steps(n=20, data_wait=0.02)
    return builder.build()


def test_workers_kept_alive_against_the_kept_script_settings_become_the_recommendation():
    """Measured against the script's own settings, launch by launch: the recommendation is
    3 workers with persistent_workers=True, its expected speedup that alternation's, and the
    finding says what ran against what; nothing of it is a prediction."""
    from ddp_profile.rules import evaluate

    run = kept_instead(1.9, noise=(1.0, 1.01, 0.99, 1.0, 1.005))
    analysis = evaluate(run)
    rec = analysis.recommendation
    assert rec.config["num_workers"] == 3 and rec.persistent_workers
    assert rec.persistent_in_speedup  # the console prints it in the figure's label
    assert rec.probe_id == "k1" and rec.baseline_probe_id == "base"
    assert "persistent_workers=True" in rec.snippet and "num_workers=3" in rec.snippet
    assert rec.expected_speedup is not None and 1.85 < rec.expected_speedup < 1.95
    low, high = rec.expected_speedup_interval
    assert 1.0 < low < rec.expected_speedup < high
    assert rec.speedup_basis.startswith("the script's settings and the recommendation with "
                                        "persistent_workers=True alternated, 2 of each"), \
        rec.speedup_basis
    assert not any("on top of it" in note for note in rec.notes), rec.notes
    loading = next(f for f in analysis.findings if f.rule == "data-loader-bound")
    assert loading.recommendation.startswith("Measured in this run: num_workers=3"), \
        loading.recommendation  # the one recommendation, not a prediction beside it
    finding = persistent_workers(run, T)
    assert finding is not None
    assert "num_workers=3, pin_memory=False, prefetch_factor=2, batch_size=32 with " \
        "persistent_workers=True ran 1.9" in finding.evidence, finding.evidence
    assert "the script's own num_workers=0" in finding.evidence
    assert "alternated A B A B A in launches" in finding.evidence
    assert "0.55 s per epoch of 32 steps" in finding.evidence
    assert "prediction" not in finding.evidence + finding.recommendation
    assert "once per run" not in rec.speedup_basis + finding.evidence  # no first batches known


def test_the_workers_one_time_start_is_said_with_the_training_that_wins_it_back():
    """The spawn script's case: per epoch, 1 worker kept alive beats none, but starting it
    costs 2.5 s once per run, which no probe measures (their warm-up holds it): the claim says
    so, and after how long the gain pays for it (a short run loses: plain launches of 2 and
    6 epochs gave 0.82x and 0.93x where epochs alone gave 1.10x)."""
    from ddp_profile.rules import evaluate

    run = kept_instead(1.9, noise=(1.0, 1.01, 0.99, 1.0, 1.005), first=(0.05, 2.55))
    rec = evaluate(run).recommendation
    assert rec.probe_id == "k1"
    words = "starting them costs 2.5 s once per run (the first batch waited 2.5 s against 0.1 s)"
    assert words in rec.speedup_basis, rec.speedup_basis
    assert "won back after about 5 s of training at 1.9" in rec.speedup_basis
    finding = persistent_workers(run, T)
    assert finding is not None and words in finding.evidence, finding.evidence


def test_workers_kept_alive_within_noise_of_the_script_settings_leave_them_kept():
    from ddp_profile.rules import evaluate

    run = kept_instead(1.03, noise=(1.0, 0.95, 1.05, 1.04, 0.96))
    rec = evaluate(run).recommendation
    assert rec.config["num_workers"] == 0 and rec.probe_id == "base"
    assert not rec.persistent_workers and "persistent_workers" not in rec.snippet
    assert not rec.persistent_in_speedup
    assert persistent_workers(run, T) is None


def test_workers_kept_alive_that_win_per_epoch_but_lose_a_run_this_short_are_said_so():
    """The spawn script's case: every launch of the alternation ran the 2-epoch script to its
    end. Read as whole runs (each first batch's wait charged), 3 workers kept alive lose, so
    the script's settings stay; per epoch once they run they won 1.16x beyond noise. What
    was seen is said, low, with the training after which the start-up is won back as a
    prediction; the recommendation does not change."""
    from ddp_profile.rules import evaluate

    noise = (1.0, 1.01, 0.99, 1.0, 1.005)
    run = kept_instead(1.15, noise=noise, first=(0.05, 2.55), whole=True)
    analysis = evaluate(run)
    rec = analysis.recommendation
    assert rec.config["num_workers"] == 0 and not rec.persistent_workers
    finding = persistent_workers(run, T)
    assert finding is not None and finding.severity == "low", finding
    assert "ran 1.16x (the fit of its 5 launches: 1.12-1.20x" in finding.evidence, \
        finding.evidence
    assert "as whole runs of the script (alternated A B A B A in launches, probes k0-k4" \
        in finding.evidence
    assert finding.recommendation.startswith("For runs this short, keep the script's "
                                             "settings. Predicted, not measured:")
    assert "but 0.85x [0.77-0.93] as whole runs" in finding.evidence
    # 2.5 s of start-up over the 14 % a second of training saves: about 18 s
    assert "pays in a run training past about 18 s (the start-up, 2.5 s" in \
        finding.recommendation, finding.recommendation
    assert [f.rule for f in analysis.findings].count("persistent-workers") == 1
    # per epoch within noise: nothing was seen to say
    assert persistent_workers(kept_instead(1.02, noise=(1.0, 0.95, 1.05, 1.04, 0.96),
                                           first=(0.05, 2.55), whole=True), T) is None


def short_spawn_run(script_samples: int):
    """The spawn script's case before any alternation: no workers kept (751 samples/s); 1
    worker restarts every 62-step epoch (4.06 s), 802 samples/s between restarts; a launch
    ran the 2-epoch script to its end (``script_samples``: 2 x 62 steps x 16 x 2 ranks)."""
    steady, restart = 802.0, 4.06
    return (RunBuilder(world_size=2)
            .probe("base", kind="baseline", num_workers=0, throughput=751.0,
                   entry={"script_samples": script_samples}).steps(n=20, data_wait=0.8)
            .probe("w1", num_workers=1, throughput=300.0,
                   entry={"throughput": 300.0, "steady_throughput": steady,
                          "epoch_steps": 62, "epoch_restart_s": restart})
            .steps(n=20, data_wait=0.8)
            .build())


def test_workers_whose_start_outweighs_a_whole_run_are_a_low_prediction_not_advice():
    """Over the script's whole run (3,968 samples: 5.3 s at 751 samples/s) 1 worker kept
    alive starts once (4.06 s) and then saves 0.3 s: no advice to keep it alive, but what
    was seen, low, with the training past which the start is won back."""
    finding = persistent_workers(short_spawn_run(3968), T)
    assert finding is not None and finding.severity == "low", finding
    assert "802 between restarts, 1.07x the script's settings" in finding.evidence
    assert "whole run (3,968 samples, run to its end in base) takes 5.3 s" in finding.evidence
    assert "start once (4.1 s, what a restart cost them) and take 9.0 s" in finding.evidence
    assert finding.recommendation.startswith("For runs this short, keep the script's settings")
    # 4.06 s over the 6.4 % each second of training saves: about 64 s
    assert "pays in a run training past about 64 s" in finding.recommendation
    # where another configuration is recommended, "keep the script's settings" is not said
    faster = (RunBuilder(world_size=2)
              .probe("base", kind="baseline", num_workers=0, throughput=751.0,
                     entry={"script_samples": 3968}).steps(n=20, data_wait=0.8)
              .probe("w1", num_workers=1, throughput=300.0,
                     entry={"throughput": 300.0, "steady_throughput": 1000.0,
                            "epoch_steps": 62, "epoch_restart_s": 4.06})
              .steps(n=20, data_wait=0.8)
              .probe("w0b", num_workers=0, pin_memory=True, throughput=900.0)
              .steps(n=20, data_wait=0.8)
              .build())
    from ddp_profile.rules import evaluate
    assert evaluate(faster).recommendation.config["pin_memory"] is True
    other = persistent_workers(faster, T)
    assert other is None or "keep the script's settings" not in other.recommendation
    # a run 100 times as long wins the start back: the prediction of a gain is said as one
    long = persistent_workers(short_spawn_run(396800), T)
    assert long is not None and long.severity == "medium"
    assert "num_workers=1, persistent_workers=True). Predicted" in long.recommendation
