"""A loader change the recommendation measured faster always has the finding that explains
it, from the recommendation's own figure, also where the baseline waits below the
data-wait threshold (a run recommended 1 worker at a measured gain while its findings were
empty: the baseline waited 19 % of each step)."""

from __future__ import annotations

from ddp_profile.rules import Thresholds, evaluate
from ddp_profile.rules.findings.data import data_loader_bound
from tests.rules.tables import RunBuilder

T = Thresholds()


def below_threshold(worker_throughput: float):
    """The script's settings wait 15 % of each step (below the 20 % threshold); one worker
    hides that wait."""
    return (RunBuilder()
            .probe("p0", kind="baseline", num_workers=0, prefetch_factor=None, throughput=1000.0)
            .steps(n=40, data_wait=0.015, compute=0.085, jitter=0.01)
            .probe("p1", num_workers=1, prefetch_factor=2, throughput=worker_throughput)
            .steps(n=40, data_wait=0.0005, compute=0.085, jitter=0.01, seed=1)
            .build())


def test_a_loader_change_measured_faster_below_the_wait_threshold_has_its_finding():
    run = below_threshold(1170.0)
    analysis = evaluate(run)
    rec = analysis.recommendation
    assert rec.probe_id == "p1" and rec.expected_speedup and rec.expected_speedup > 1.1
    found = [f for f in analysis.findings if f.rule == "data-loader-bound"]
    assert len(found) == 1, [f.rule for f in analysis.findings]
    finding = found[0]
    assert finding.severity == "medium"
    assert "15 %" in finding.evidence and "below the 20 %" in finding.evidence
    # the recommendation's own figure, not a second computation of it
    low, high = rec.expected_speedup_interval
    figure = f"{rec.expected_speedup:.2f}x [{low:.2f}-{high:.2f}]"
    assert f"num_workers=1, prefetch_factor=2 ran {figure}" in finding.evidence, finding.evidence
    assert "runs" in finding.recommendation and rec.snippet in finding.recommendation
    assert analysis.cause() == finding
    assert analysis.summary_fields()["cause"] == "data-loader-bound"
    assert analysis.summary_fields()["recommendation"]["check"] == {
        "alternated": False, "launches": None, "rounds": None, "whole_runs": False}


def test_no_loader_finding_below_the_threshold_where_the_script_settings_are_kept():
    run = below_threshold(1002.0)  # within noise: the script's settings stay
    analysis = evaluate(run)
    assert analysis.recommendation.probe_id == "p0"
    assert "data-loader-bound" not in {f.rule for f in analysis.findings}
    assert analysis.summary_fields()["cause"] is None
    assert analysis.summary_fields()["recommendation"]["check"] is None
    # called alone (no recommendation handed in), the rule keeps to the wait threshold
    assert data_loader_bound(below_threshold(1170.0), T) is None
