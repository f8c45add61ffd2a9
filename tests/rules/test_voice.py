"""One voice: findings that advise a setting agree with the recommendation and name the probe
that measured it; an unmeasured setting is a labelled prediction; no pointer to a finding that
did not fire."""

from __future__ import annotations

from ddp_profile.rules import evaluate
from tests.rules.tables import RunBuilder


def _by_rule(run):
    findings, rec = evaluate(run)
    return {f.rule: f for f in findings}, rec


def test_oversubscribed_baseline_and_a_tie_never_contradict():
    """The issue's case: num_workers=1 ties num_workers=4 on a compute-bound script; the
    recommendation keeps 4, so the finding must not say "use num_workers=1"."""
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("p0", kind="baseline", num_workers=4).steps(data_wait=0.001, compute=0.05)
           .probe("p1", num_workers=1).steps(data_wait=0.001, compute=0.0502, seed=1)
           .build())
    findings, rec = _by_rule(run)
    assert rec.config["num_workers"] == 4
    advice = findings["worker-oversubscription"].recommendation
    assert advice.startswith("Measured in this run: num_workers=1") and "p1" not in advice
    assert "within noise" in advice and "recommendation stays" in advice
    assert "num_workers=4" in advice


def test_recommended_probe_with_the_setting_is_cited():
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("p0", kind="baseline", num_workers=4).steps(data_wait=0.05, compute=0.05)
           .probe("p1", num_workers=0).steps(data_wait=0.0, compute=0.05, seed=1)
           .build())
    findings, rec = _by_rule(run)
    assert rec.probe_id == "p1"
    advice = findings["worker-oversubscription"].recommendation
    assert advice.startswith("Measured in this run: num_workers=") and rec.snippet in advice
    assert "p1" not in advice  # the probe id stays in the evidence


def test_unmeasured_setting_is_a_labelled_prediction():
    run = (RunBuilder(world_size=2, cpus=2)
           .probe("p0", kind="baseline", num_workers=4).steps(data_wait=0.001, compute=0.05)
           .build())
    advice = _by_rule(run)[0]["worker-oversubscription"].recommendation
    assert advice.startswith("Prediction (not measured): num_workers=1")
    assert "--num-workers 1,4" in advice


def test_data_loader_bound_points_only_to_findings_that_fired():
    run = (RunBuilder(world_size=1)
           .probe("p0", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.05)
           .probe("p1", num_workers=2).steps(data_wait=0.05, compute=0.05, seed=1).build())
    findings, _ = _by_rule(run)
    advice = findings["data-loader-bound"].recommendation
    assert advice.startswith("Measured in this run: num_workers=2") \
        and "recommendation stays" in advice
    assert "p1" not in advice
    fired = set(findings)
    for rule in ("cpu-bound-preprocessing", "io-bound-loading"):
        assert (rule in advice) == (rule in fired), (rule, advice, fired)
    assert "cpu-/io-bound" not in advice


def test_measured_gain_is_cited_with_the_recommended_snippet():
    run = (RunBuilder(world_size=1)
           .probe("p0", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.05)
           .probe("p1", num_workers=4).steps(data_wait=0.0, compute=0.05, seed=1).build())
    findings, rec = _by_rule(run)
    advice = findings["data-loader-bound"].recommendation
    # 0.101 / 0.051 s
    assert advice.startswith("Measured in this run: num_workers=") and "1.98x" in advice
    assert rec.snippet in advice


def test_cpu_bound_finding_never_cites_a_worker_count_the_recommendation_did_not_choose():
    """CPU-bound loading the CPUs can keep up with at num_workers=4 (predicted), measured, but
    2 workers ran faster: the finding must not send the reader to num_workers=4."""
    run = (RunBuilder(world_size=2, cpus=8)
           .probe("p0", kind="baseline", num_workers=0).steps(data_wait=0.05, compute=0.01)
           .loading(1.0, 0.1)
           .probe("w2", num_workers=2).steps(data_wait=0.0, compute=0.01, seed=1)
           .loading(1.0, 0.1)
           .probe("w4", num_workers=4).steps(data_wait=0.004, compute=0.01, seed=2)
           .loading(1.0, 0.1)
           .build())
    assert run.summary["capacity"]["workers_for_demand"] == 4
    findings, rec = _by_rule(run)
    assert rec.probe_id == "w2"
    text = findings["cpu-bound-preprocessing"].recommendation
    assert "recommendation stays" in text and text.startswith(
        "Measured in this run: num_workers=4, pin_memory=False"), text
    assert "keep up with num_workers=4 (measured" not in text


def test_a_faster_window_measured_again_slower_is_within_the_runs_own_launch_noise():
    """A real run (cold files, 2 ranks): 3 workers ran 1.26x the baseline in the first screen,
    then like the baseline in the second. The run's own launches disagree that much
    (``choose.launch_spread``), so the 1.36x here is within noise and the data-bound script
    keeps its settings; the advice never says a compute-bound script needs a clear gain."""
    run = (RunBuilder(world_size=2)
           .probe("p0", kind="baseline", num_workers=0).steps(data_wait=0.09, compute=0.01)
           .probe("p2", num_workers=3).steps(data_wait=0.0635, compute=0.01, seed=1)
           .probe("p5", num_workers=3).steps(data_wait=0.11, compute=0.01, seed=2)
           .probe("p6", num_workers=3).steps(data_wait=0.11, compute=0.01, seed=3)
           .build())
    findings, rec = _by_rule(run)
    assert rec.probe_id == "p0"
    advice = findings["data-loader-bound"].recommendation
    assert advice.startswith("Measured in this run: num_workers=3") and "ran at 1.36x" in advice \
        and "(within noise)" in advice
    # the advice's own example is a setting no probe ran: said apart, never as measured
    measured, unmeasured = advice.split(" Not measured as such: ")
    assert "e.g." not in measured and unmeasured.startswith("load in parallel and ahead (e.g.")
    assert "compute-bound" not in advice
