"""The peers benchmark's pure parts: each tool's verdicts read from its own output, mapped to
causes, scored against the workload's known cause, and the head-to-head quality figures."""

from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import _peer_tools  # noqa: E402
import _verdicts  # noqa: E402


def test_ddp_profile_rules_and_its_compute_bound_note_are_read_from_the_summary():
    summary = {"findings": [{"rule": "data-loader-bound"}, {"rule": "io-bound-loading"}],
               "recommendation": {"notes": ["The baseline waits only 2 % of each step for "
                                            "data: it is compute-bound, and ..."]}}
    verdicts = _verdicts.ddp_profile_verdicts(summary)
    assert verdicts == ["data-loader-bound", "io-bound-loading", "note:compute-bound"]
    assert _verdicts.causes("ddp_profile", verdicts) == ["loading", "loading_wait", "compute"]


def test_traceml_kinds_are_collected_from_every_section_once_primary_first():
    summary = {"primary_diagnosis": {"kind": "COMPUTE_STRAGGLER"},
               "step_time": {"diagnosis": {"kind": "COMPUTE_STRAGGLER"},
                             "issues": [{"kind": "COMPUTE_STRAGGLER"}, {"kind": "INPUT_BOUND"}]},
               "system": {"diagnosis": {"kind": "NORMAL"}, "issues": [{"kind": "NORMAL"}]},
               "step_memory": {"diagnosis": {"kind": "NO_GPU"}}}
    verdicts = _verdicts.traceml_verdicts(summary)
    assert verdicts == ["COMPUTE_STRAGGLER", "INPUT_BOUND", "NORMAL", "NO_GPU"]
    assert _verdicts.causes("traceml", verdicts) == ["straggler", "loading"]


@pytest.mark.parametrize("narrative, verdict", [
    ("The workload is **input-bound** (77% data wait) with **CPU already saturated** (97%): "
     "more workers cannot help.", "input-bound, CPU saturated"),
    ("The workload is **input-bound**: 44% of step time is spent waiting", "input-bound"),
    ("The workload is **compute-bound** (data wait 1%); extra workers", "compute-bound"),
    ("The input pipeline is mildly contended (data wait 9%).", "mildly contended"),
])
def test_loadtune_narrative_gives_one_verdict(narrative, verdict):
    assert _verdicts.loadtune_verdicts(narrative) == [verdict]
    assert _verdicts.loadtune_verdicts("") == []


@pytest.mark.parametrize("named, known, expected", [
    (["loading", "loading_wait"], "loading_wait", "right"),
    (["loading_cpu"], "loading_wait", "wrong"),  # CPU named on a sleep-bound loader
    (["loading"], "loading_cpu", "partial"),  # input-bound, without telling which kind
    (["loading"], "threads", "wrong"),
    (["straggler", "loading"], "straggler", "wrong"),  # a wrong cause beside the right one
    ([], "unsharded", "nothing"),
    (["compute"], "compute", "right"),
    (["loading"], "compute", "wrong"),
    (["straggler", "compute"], "straggler", "right"),  # the loop does not wait for data: true
    (["compute"], "threads", "partial"),  # true of oversubscribed ranks, but not the cause
    (["unsharded", "compute"], "unsharded", "right"),
    (["comm", "compute"], "comm", "right"),  # the exposed all-reduce, on a loop not waiting
    (["compute"], "comm", "partial"),  # true, but the all-reduce is what bounds the step
    (["loading"], "comm", "wrong"),
])
def test_score(named, known, expected):
    assert _verdicts.score(named, known) == expected


def test_every_ddp_profile_rule_has_a_cause_in_the_vocabulary():
    """A rule added without its entry would score as "other" (wrong) on every workload."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "ddp_profile", "rules")
    names = set()
    for folder, _, files in os.walk(root):  # the findings live in rules/findings/
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as handle:
                    names |= set(re.findall(r'rule="([a-z-]+)"', handle.read()))
    assert names and names <= set(_verdicts.VOCABULARY["ddp_profile"]), \
        sorted(names - set(_verdicts.VOCABULARY["ddp_profile"]))
    assert _verdicts.causes("ddp_profile", ["exposed-communication"]) == ["comm"]


def test_unknown_verdicts_count_as_another_cause_and_neutral_ones_as_none():
    assert _verdicts.causes("traceml", ["SOMETHING_NEW"]) == ["other"]
    assert _verdicts.causes("traceml", ["NORMAL", "NO_GPU", "HIGH_CPU", "RESIDUAL_HEAVY"]) == []
    cell = _verdicts.diagnosis_row("traceml", ["NORMAL"], "straggler")
    assert cell["score"] == "nothing" and cell["verdicts"] == ["NORMAL"]


def test_a_tool_that_does_not_apply_or_failed_is_never_scored_right():
    assert _verdicts.diagnosis_row("loadtune", None, "straggler", "n/a")["score"] == "n/a"
    failed = _verdicts.diagnosis_row("traceml", None, "threads", "exit 1: boom")
    assert failed["score"] == "nothing" and failed["status"] == "exit 1: boom"


def test_tally_counts_each_tools_scores():
    rows = [{"tools": {"a": {"score": "right"}, "b": {"score": "n/a"}}},
            {"tools": {"a": {"score": "wrong"}, "b": {"score": "partial"}}}]
    tally = _verdicts.tally(rows, ["a", "b"])
    assert tally["a"]["right"] == 1 and tally["a"]["wrong"] == 1
    assert tally["b"] == {"right": 0, "partial": 1, "wrong": 0, "nothing": 0, "n/a": 1}


def test_quality_is_each_choice_median_over_the_best_grid_median():
    measured = {"workers=0": [100.0, 110.0], "workers=8": [390.0, 410.0, 400.0],
                "workers=2": [200.0, 220.0], "workers=2,prefetch=4": [250.0]}
    out = _verdicts.quality(measured, ["workers=0", "workers=2", "workers=8"],
                            {"x": "workers=2,prefetch=4", "y": "workers=8", "z": None})
    assert out["grid_best"] == {"config": "workers=8", "throughput": 400.0}
    assert out["tools"]["x"]["vs_grid_best"] == 0.625
    assert out["tools"]["y"]["vs_grid_best"] == 1.0
    assert out["tools"]["z"] == {"config": None, "throughput": None, "vs_grid_best": None}
    # launches of one configuration differ by ~5 % here: 0.625 is far outside that
    assert 0.04 < out["launch_sd"] < 0.07 and out["tools"]["x"]["within_noise"] is False
    assert out["tools"]["y"]["within_noise"] is True


def test_a_choice_within_the_launch_noise_of_the_grid_best_says_so():
    # compute-bound, 2 launches each, launches ~15 % apart: the grid's best is a lucky median
    measured = {"workers=0": [4000.0, 5000.0], "workers=1": [5800.0, 4600.0],
                "workers=2": [4400.0, 5200.0]}
    out = _verdicts.quality(measured, list(measured), {"t": "workers=0"})
    assert out["tools"]["t"]["vs_grid_best"] == pytest.approx(4500 / 5200, abs=1e-4)
    assert 0.12 < out["launch_sd"] < 0.17
    assert out["tools"]["t"]["within_noise"] is True


def test_choices_are_judged_again_on_launches_that_chose_nothing():
    # the grid named workers=16 best; new launches of it and of each choice decide the ratio
    fresh = {"workers=16": [5000.0, 5200.0, 5100.0], "workers=32": [5150.0, 4950.0, 5050.0],
             "workers=2": [900.0, 880.0, 910.0]}
    out = _verdicts.confirm(fresh, "workers=16",
                            {"a": "workers=32", "b": "workers=2", "c": "workers=16", "d": None})
    assert out["medians"] == {"workers=16": 5100.0, "workers=32": 5050.0, "workers=2": 900.0}
    assert out["tools"]["a"]["vs_best_fresh"] == pytest.approx(5050 / 5100, abs=1e-4)
    assert out["tools"]["a"]["within_noise_fresh"] is True
    assert out["tools"]["b"]["vs_best_fresh"] == pytest.approx(900 / 5100, abs=1e-4)
    assert out["tools"]["b"]["within_noise_fresh"] is False
    assert out["tools"]["c"] == {"vs_best_fresh": 1.0, "launches": 3, "within_noise_fresh": True}
    assert "d" not in out["tools"] and out["launch_sd"] < 0.03
    # a choice that ran faster than the grid's best in the new launches reads above 1
    faster = _verdicts.confirm({"workers=2": [1000.0, 1010.0], "workers=3": [1100.0, 1090.0]},
                               "workers=2", {"t": "workers=3"})
    assert faster["tools"]["t"]["vs_best_fresh"] > 1.05


def test_configuration_labels_leave_defaults_out_so_equal_choices_meet():
    assert _peer_tools.config_label({"num_workers": 4, "prefetch_factor": 2,
                                     "batch_size": 16}) == "workers=4"
    assert _peer_tools.config_label({"num_workers": 0, "prefetch_factor": 4}) == "workers=0"
    assert _peer_tools.config_label({"num_workers": 2, "prefetch_factor": 4, "batch_size": 64,
                                     "threads": 1}, batch=16) == \
        "workers=2,prefetch=4,bs=64,threads=1"
    assert _peer_tools.config_args({"num_workers": 2, "prefetch_factor": None,
                                    "threads": 1}) == ["--num-workers", "2", "--threads", "1"]
    assert _peer_tools.default_batch(["--hidden", "8", "--batch-size", "64"]) == 64


# datapath-doctor 0.2.1's report as peers_train.py --datapath-doctor printed it (2 ranks,
# --load-ms 2), the fix lines shortened
DPD_LATENCY = """\
== datapath-doctor rank 0 ==
datapath-doctor: 40 samples analyzed, 1 finding(s):

[CRITICAL] DPD-001  Data pipeline is the training bottleneck
           The GPU spent 93.5% of step time waiting on the data pipeline across 40 steps \
(mean 34.7 ms/step of pure wait). Compute is starved.
           Fix: This step time is dominated by waiting, not computing.

== datapath-doctor rank 1 ==
datapath-doctor: 40 samples analyzed, 1 finding(s):

[CRITICAL] DPD-001  Data pipeline is the training bottleneck
           The GPU spent 93.8% of step time waiting on the data pipeline across 40 steps \
(mean 34.7 ms/step of pure wait). Compute is starved.
           Fix: This step time is dominated by waiting, not computing.

== datapath-doctor straggler: none
"""


def test_datapath_doctor_report_gives_its_rule_ids_once():
    verdicts = _verdicts.datapath_doctor_verdicts("W1124 torchrun warning\n" + DPD_LATENCY)
    assert verdicts == ["DPD-001"]
    assert _verdicts.diagnosis_row("datapath_doctor", verdicts, "loading_wait")["score"] == \
        "partial"


# datapath-doctor 0.2.1's render_findings() for [DPD-001 starved, DPD-005 cpu] and for no
# finding, over 40 samples (recorded; checked against the package below where it is installed)
DPD_CORRELATED = (
    "datapath-doctor: 40 samples analyzed, 2 finding(s):\n\nLIKELY ROOT CAUSE\n"
    "  CPU-bound input preprocessing is starving the training loop\n  Confidence: medium\n"
    "  Evidence chain:\n    1. training waits on input for 60.0% of step time\n"
    "    2. DataLoader workers average 99.0% CPU\n  Supporting rules: DPD-001, DPD-005\n\n"
    "[CRITICAL] DPD-001  starved\n           m\n\n[CRITICAL] DPD-005  cpu\n           m\n")
DPD_HEALTHY = "datapath-doctor: 40 samples analyzed, no issues found. Input path looks healthy."


def test_the_recorded_datapath_doctor_reports_are_what_the_package_renders():
    pytest.importorskip("datapath_doctor", reason="the bench extra (make bench) is not installed")
    from datapath_doctor.models import Finding, Severity
    from datapath_doctor.report import render_findings

    starved = Finding(rule_id="DPD-001", severity=Severity.CRITICAL, title="starved",
                      message="m", evidence={"data_wait_fraction": 0.6})
    cpu = Finding(rule_id="DPD-005", severity=Severity.CRITICAL, title="cpu", message="m",
                  evidence={"mean_worker_cpu_pct": 99.0})
    assert render_findings([starved, cpu], 40) == DPD_CORRELATED
    assert render_findings([], 40) == DPD_HEALTHY


def test_datapath_doctor_correlated_diagnosis_healthy_ranks_and_straggler_are_read():
    text = (f"== datapath-doctor rank 0 ==\n{DPD_CORRELATED}\n"
            f"== datapath-doctor rank 1 ==\n{DPD_HEALTHY}\n"
            "== datapath-doctor straggler: rank 1 waits 60.0 ms per step for input\n")
    verdicts = _verdicts.datapath_doctor_verdicts(text)
    assert verdicts == ["CPU-bound input preprocessing is starving the training loop",
                        "DPD-001", "DPD-005", "healthy", "input-straggler"]
    assert _verdicts.causes("datapath_doctor", verdicts) == ["loading_cpu", "loading",
                                                             "straggler"]
    assert _verdicts.datapath_doctor_verdicts("Traceback: boom") is None
    healthy = _verdicts.datapath_doctor_verdicts(DPD_HEALTHY)
    assert _verdicts.diagnosis_row("datapath_doctor", healthy, "compute")["score"] == "nothing"


def test_fournex_labels_come_from_the_scope_its_report_shows():
    # frx analyze --json of one rank's bundle (fournex 0.3.1, --load-ms 2), trimmed; its whole-run
    # scope changed to another label, to tell which scope is read
    analysis = {"mode": "run_bundle", "result": {
        "run": {"diagnosis": {"primary_bottleneck": "copy_bound",
                              "user_facing_bottleneck": "copy_bound"},
                "bottlenecks": [{"label": "copy_bound", "score": 0.3}]},
        "steady_state": {"diagnosis": {"primary_bottleneck": "input_bound",
                                       "user_facing_bottleneck": "input_bound",
                                       "secondary_bottlenecks": []},
                         "bottlenecks": [{"label": "input_bound", "score": 1.0}]}}}
    assert _verdicts.fournex_verdicts(analysis) == ["input_bound"]
    assert _verdicts.diagnosis_row("fournex", ["input_bound"], "loading_cpu")["score"] == \
        "partial"
    nothing = {"result": {"run": {"diagnosis": {"primary_bottleneck": "inconclusive"},
                                  "bottlenecks": []}}}
    assert _verdicts.fournex_verdicts(nothing) == ["inconclusive"]
    assert _verdicts.diagnosis_row("fournex", ["inconclusive"], "compute")["score"] == "nothing"


def test_tools_option_picks_rows_and_refuses_unknown_names(capsys):
    import peers

    assert peers.parse([]).tools == list(peers.TOOLS)
    assert peers.parse(["--tools", "fournex,datapath_doctor"]).tools == \
        ["fournex", "datapath_doctor"]
    with pytest.raises(SystemExit):
        peers.parse(["--tools", "fournex,frx"])
    assert "unknown workload or tool: frx" in capsys.readouterr().err


def test_ddp_profiles_answer_carries_the_threads_its_measured_finding_gives():
    recommended = {"num_workers": 16, "prefetch_factor": 2, "batch_size": 16}
    probes = [{"id": "p4", "kind": "sweep", "status": "ok", "config": recommended},
              {"id": "p9", "kind": "threads", "status": "ok", "threads": 1,
               "config": recommended}]

    def summary(severity):
        return {"recommended_probe": "p4", "probes": probes,
                "findings": [{"rule": "thread-oversubscription", "severity": severity}]}

    assert _peer_tools._ddp_profile_config(summary("medium"), recommended) == \
        {**recommended, "threads": 1}
    # a prediction (nothing measured) is not what the tool tells the user to run
    assert "threads" not in _peer_tools._ddp_profile_config(summary("low"), recommended)
    other = {**recommended, "num_workers": 8}
    assert "threads" not in _peer_tools._ddp_profile_config(summary("medium"), other)
