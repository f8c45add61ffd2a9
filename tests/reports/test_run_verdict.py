"""The verdict a person reads first (``reports.run_verdict``), and what the report must never
show: ``null`` in a chart, "rank -1", a loader recommendation beside "Findings (0)", probe
ids in the sentences of the first screen."""

from __future__ import annotations

import dataclasses
import re
from html import unescape

from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.reports import figures
from ddp_profile.reports.html import build_findings, build_report_data, render_report
from ddp_profile.reports.run_verdict import build_verdict, check_phrase, grouped_warnings
from ddp_profile.rules import evaluate
from tests.rules.tables import RunBuilder
from tests.rules.test_host import windows_threads_run


def short(probe_id: str, kind: str = "sweep") -> ProbeRecord:
    return ProbeRecord.from_json({
        "id": probe_id, "status": "ok", "kind": kind, "throughput": 100.0, "steps": 30,
        "steps_measured": 12, "short": True,
        "short_reason": "the script ended after 12 measured step(s) of the 30 asked: run more"})


def test_warnings_are_one_line_per_kind_with_the_probes_listed():
    lines = grouped_warnings(
        [short("p001"), short("p002"), short("p003", kind="paired")],
        ["probe p004 rank 0: skipped 2 unreadable line(s)",
         "probe p005 rank 1: skipped 1 unreadable line(s)", "ledger.jsonl: skipped 1 line(s)",
         "ledger.jsonl: skipped 1 line(s)"])
    assert len(lines) == 3, lines
    assert lines[0].startswith("2 probes ran short, the script ended first: p001 (12 of 30 "
                               "steps), p002 (12 of 30 steps).")
    assert "p003" not in lines[0]  # an alternation's launch runs to the script's end on purpose
    assert lines[1] == "Unreadable lines skipped: p004 rank 0 (2), p005 rank 1 (1)."
    assert lines[2] == "ledger.jsonl: skipped 1 line(s)"


def test_the_check_is_a_short_phrase():
    def phrase(check, speedup=1.3):
        return check_phrase({"expected_speedup": speedup, "recommendation": {"check": check}})

    assert phrase({"alternated": True, "launches": 1, "rounds": 3}) == \
        "alternated with the script's settings, 3 rounds of each in one launch"
    assert phrase({"alternated": True, "launches": 5, "rounds": 2, "whole_runs": True}) == \
        "alternated with the script's settings, 2 rounds of each over 5 launches, each a whole run"
    assert phrase({"alternated": False}) == "from two probes of the search, not alternated"
    assert phrase(None, speedup=None) == "nothing was measured to compare"
    # the script's settings kept: what is kept is its loader, and only the loader's settings
    # were weighed (a threads finding beside it can have measured a gain of its own)
    kept = {"expected_speedup": 1.0, "recommendation": {"probe_id": "p000",
                                                         "baseline_probe_id": "p000"}}
    assert check_phrase(kept) == "no loader setting beat them beyond noise"


def test_the_cause_is_the_named_finding_in_one_sentence_without_probe_ids():
    summary = {"cause": "io-bound-loading", "findings": [
        {"rule": "data-loader-bound", "severity": "high", "title": "Training waits",
         "evidence": "It waits."},
        {"rule": "io-bound-loading", "severity": "medium", "title": "Loading waits",
         "evidence": "Producing a sample waits 2.1 ms (probes p003-p009) in 0.4 s. More."}],
        "baseline": {"num_workers": 0, "batch_size": 8, "prefetch_factor": None},
        "recommended": {"num_workers": 2, "batch_size": 8, "prefetch_factor": 2},
        "recommendation": {"unsettled": [{"probe": "p007", "ratio": 1.4, "why": "short (p007)",
                                          "config": {"num_workers": 4, "batch_size": 8}}]}}
    verdict = build_verdict(summary, [])
    assert (verdict.cause_title, verdict.cause_rule) == ("Loading waits", "io-bound-loading")
    assert verdict.cause_text == "Producing a sample waits 2.1 ms in 0.4 s."
    assert verdict.change_text() == "num_workers 0 → 2"  # no prefetch without workers before
    assert verdict.not_established[0]["text"] == \
        "num_workers=4 (1.40× in the search): short"
    summary["recommended"]["prefetch_factor"] = 4  # not DataLoader's own: a change to make
    assert build_verdict(summary, []).change_text() == \
        "num_workers 0 → 2, prefetch_factor default → 4"


def test_a_process_without_a_process_group_is_the_process():
    run = RunBuilder().probe("p0", kind="baseline").steps(n=10).build()
    steps = run.steps.assign(rank=-1)  # as a script that never joins a process group records
    split = figures.time_split_by_rank(steps, "p0")
    assert [list(trace.x) for trace in split.data] == [["the process"]] * len(split.data)
    timeline = figures.step_timeline(steps, "p0")
    assert [trace.name for trace in timeline.data] == ["the process"]
    assert figures.rank_name(-1, {}) == "the process" and figures.rank_name(2, {}) == "rank 2"
    found = build_findings([{"rule": "r", "severity": "low", "title": "t", "ranks": [-1]},
                            {"rule": "s", "severity": "low", "title": "t", "ranks": [0, 3]}])
    assert [f["ranks_text"] for f in found[0]["items"]] == ["the process", "ranks 0, 3"]


def test_a_heatmap_cell_not_measured_is_blank_never_null(sweep_run):
    probes = sweep_run.probes
    gap = probes[(probes["num_workers"] == 0) & (probes["batch_size"] == 64)].index
    heat = figures.workers_batch_heatmap(probes.drop(gap))
    text = [cell for row in heat.data[0].text for cell in row]
    assert "" in text and None not in text and "null" not in text and "None" not in text


def loader_gain_below_the_wait_threshold():
    """The script's settings wait 15 % of each step; one worker measured faster."""
    run = (RunBuilder()
           .probe("p0", kind="baseline", num_workers=0, prefetch_factor=None, throughput=1000.0)
           .steps(n=40, data_wait=0.015, compute=0.085, jitter=0.01)
           .probe("p1", num_workers=1, prefetch_factor=2, throughput=1170.0)
           .steps(n=40, data_wait=0.0005, compute=0.085, jitter=0.01, seed=1)
           .build())
    summary = {**run.summary, "script": "train.py",
               "baseline": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                            "batch_size": 32}, **evaluate(run).summary_fields()}
    return dataclasses.replace(run, summary=summary)


def test_a_loader_recommendation_never_stands_beside_no_findings():
    run = loader_gain_below_the_wait_threshold()
    data = build_report_data(run)
    verdict = data["verdict"]
    assert verdict["moves"] and verdict["change_text"] == "num_workers 0 → 1"
    assert data["finding_count"] >= 1
    assert verdict["cause_rule"] == "data-loader-bound"
    assert "15 %" in verdict["cause_text"]
    html = render_report(run)
    assert "Findings (0)" not in html and "No findings" not in html
    first_screen = re.search(r'<section class="card verdict" id="summary">(.*?)</section>', html,
                             flags=re.S).group(1)
    assert not re.search(r"\bp\d{3}\b|\bp[01]\b", first_screen)  # no probe ids up there


def test_a_measured_threads_change_is_the_first_screens_change_and_figure():
    """A run whose only measured gain is one thread per rank (alternated in windows of one
    launch, the loader's settings kept): the first screen says to set it, with its figure
    and interval as the expected speedup, never "1.00×" beside a measured gain."""
    run = windows_threads_run([600.0, 3700.0, 620.0, 3800.0, 640.0, 3750.0, 630.0])
    summary = {**run.summary, "script": "train.py",
               "baseline": run.probe("p0").config.to_dict(), **evaluate(run).summary_fields()}
    run = dataclasses.replace(run, summary=summary)
    change = summary["recommendation"]["threads"]
    verdict = build_verdict(summary, run.records)
    assert not verdict.moves and verdict.threads is not None
    assert verdict.threads.text() == "intra-op threads per rank 2 → 1 (OMP_NUM_THREADS=1)"
    assert verdict.threads.speedup == change["speedup"]
    html = render_report(run)
    first_screen = unescape(re.search(r'<section class="card verdict" id="summary">(.*?)</section>',
                                      html, flags=re.S).group(1))
    assert "Set intra-op threads per rank 2 → 1 (OMP_NUM_THREADS=1)" in first_screen
    assert "Keep the script's loader settings" in first_screen
    big = re.search(r'id="expected-speedup">([^<]*)<', first_screen).group(1)
    assert big == f"{change['speedup']:.2f}×" and big != "1.00×"
    low, high = change["interval"]
    assert f"interval {low:.2f}–{high:.2f}×" in first_screen
    assert "alternated with the script's threads, 3 rounds of each in one launch" in \
        first_screen
    assert not re.search(r"\bp\d{1,3}\b", first_screen)
