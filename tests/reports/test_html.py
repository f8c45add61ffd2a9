"""The report's data (``build_report_data``), its escaping, its offline-ness and its scale."""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import time

import numpy as np
import plotly.graph_objects as go
import pytest

from ddp_profile.reports import figures
from ddp_profile.reports.html import (
    build_report_data,
    plotly_js,
    render_report,
    template_env,
    write_report,
)
from tests.reports import fixtures
from tests.reports.conftest import make_run


def _points(trace: dict, axis: str = "y") -> np.ndarray:
    value = trace[axis]
    if isinstance(value, dict):  # plotly's base64 typed array
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return np.asarray(value)


def _all_figures(data: dict) -> list[dict]:
    out = list(data["client"]["figures"].values())
    for probe in data["client"]["probes"]:
        out += [f["figure"] for f in probe["figures"]]
    return out


def test_headline_carries_the_recommendation(data_bound_run):
    data = build_report_data(data_bound_run)
    head = data["headline"]
    summary = data_bound_run.summary
    assert head["recommended"] == summary["recommended"]
    assert "num_workers=4" in head["recommended_text"]
    assert head["expected_speedup"] == pytest.approx(summary["expected_speedup"])
    lo, hi = summary["expected_speedup_interval"]
    assert head["interval_text"] == f"{lo:.2f}–{hi:.2f}×"
    assert head["ceiling_share"] == pytest.approx(summary["recommendation"]["ceiling_share"])
    assert head["snippet"].startswith("DataLoader(")
    assert head["recommended_probe"] == data["client"]["default_probe"]


def test_findings_grouped_by_severity_and_default_to_summary(straggler_run):
    data = build_report_data(straggler_run)
    assert [g["severity"] for g in data["findings"]] == ["medium", "low"]
    straggler = data["findings"][0]["items"][0]
    assert straggler["ranks_text"] == "rank 1"
    assert ("median_step_s", "0.04") in straggler["evidence"]["pairs"]
    custom = [{"severity": "weird", "title": "t", "evidence": None}]
    assert build_report_data(straggler_run, custom)["findings"] == [
        {"severity": "other", "items": [{"rule": "", "title": "t", "evidence": {"text": ""},
                                         "recommendation": "", "ranks_text": ""}]}]
    assert build_report_data(straggler_run, [])["findings"] == []


def test_table_rows_and_sort_keys(failed_run):
    data = build_report_data(failed_run)
    table = data["table"]
    assert len(table["rows"]) == len(failed_run.probes)
    column = table["columns"].index("samples/s")
    oom = next(r for r in table["rows"] if r["cells"][2]["text"] == "oom")
    assert oom["cells"][column] == {"text": "–", "sort": None}
    assert sum(r["recommended"] for r in table["rows"]) == 1
    ok = [r for r in table["rows"] if r["cells"][2]["text"] == "ok"]
    assert all(isinstance(r["cells"][column]["sort"], float) for r in ok)


def test_failed_probes_listed_with_reason(failed_run):
    failed = build_report_data(failed_run)["failed"]
    assert len(failed) == 1
    assert failed[0]["status"] == "oom" and failed[0]["reason"] == "exit_code"
    assert "out of memory" in failed[0]["error"]
    assert failed[0]["root_cause_rank"] == "0"
    # A failed probe has no data, so it has no per-probe charts.
    assert failed[0]["id"] not in [p["id"] for p in build_report_data(failed_run)
                                   ["client"]["probes"]]


def test_no_gpu_gives_reason_and_no_gpu_charts(data_bound_run):
    data = build_report_data(data_bound_run)
    assert data["gpu"] == {"available": False,
                           "reason": data_bound_run.summary["gpu_unavailable_reason"]}
    names = {f["name"] for p in data["client"]["probes"] for f in p["figures"]}
    assert names == {"ranks", "steps", "cpu"}
    html = render_report(data_bound_run)
    assert "GPU metrics were unavailable" in html and "libnvidia-ml.so" in html


def test_gpu_samples_give_gpu_timelines(gpu_run):
    data = build_report_data(gpu_run)
    assert data["gpu"]["available"]
    for probe in data["client"]["probes"]:
        names = [f["name"] for f in probe["figures"]]
        assert names == ["ranks", "steps", "gpu_util", "gpu_mem", "cpu"]
        util = next(f["figure"] for f in probe["figures"] if f["name"] == "gpu_util")
        assert len(util["data"]) == gpu_run.summary["world_size"]
        assert 0 <= _points(util["data"][0]).max() <= 100
    assert "GPU metrics were unavailable" not in render_report(gpu_run)


def test_probe_order_and_heatmap(sweep_run, data_bound_run):
    data = build_report_data(sweep_run)
    probes = data["client"]["probes"]
    assert [p["role"] for p in probes[:3]] == ["recommended", "baseline", "ceiling"]
    assert "heatmap" in data["client"]["figures"]
    heat = data["client"]["figures"]["heatmap"]["data"][0]
    assert heat["x"] == ["0", "2", "4"] and heat["y"] == ["32", "64"]
    assert "heatmap" not in build_report_data(data_bound_run)["client"]["figures"]


def test_straggler_visible_in_step_timeline(straggler_run):
    steps = build_report_data(straggler_run)["client"]["probes"][0]["figures"][1]
    assert steps["name"] == "steps"
    medians = [float(np.median(_points(t))) for t in steps["figure"]["data"]]
    assert int(np.argmax(medians)) == 1
    assert medians[1] > 1.5 * np.median(medians)


def test_environment_listed(gpu_run):
    env = dict(build_report_data(gpu_run)["environment"])
    assert env["torch"] == "2.13.0" and env["GPU model"] == "NVIDIA H100 80GB HBM3"
    assert env["CPU count"] == "32" and env["host"] == "node-a"
    assert env["command line"].startswith("ddp-profile run train.py")


def test_every_figure_is_valid_plotly(sweep_run):
    for fig in _all_figures(build_report_data(sweep_run)):
        go.Figure(fig)  # validates every property; raises on a typo


def test_downsample_keeps_extremes_and_order():
    x = np.arange(10_000, dtype=float)
    y = np.sin(x / 300.0)
    y[7_777] = 50.0
    y[123] = np.nan
    xs, ys = figures.downsample(x, y, 500)
    assert len(xs) <= 500 and np.all(np.diff(xs) > 0)
    assert ys.max() == 50.0 and not np.isnan(ys).any()
    short_x, _ = figures.downsample(x[:200], y[:200], 500)
    assert len(short_x) == 199  # short: only the NaN point dropped


def test_long_timelines_are_downsampled_not_dropped(tmp_path_factory):
    run = make_run(tmp_path_factory, fixtures.Scenario(steps=3000, ranks=2), "long")
    probe = build_report_data(run)["client"]["probes"][0]
    steps = next(f["figure"] for f in probe["figures"] if f["name"] == "steps")
    assert len(steps["data"]) == 2
    for trace in steps["data"]:
        assert 400 <= len(_points(trace)) <= figures.MAX_POINTS


def test_offline_single_plotly_and_cached_environment(gpu_run):
    html = render_report(gpu_run)
    assert html.count(plotly_js()) == 1
    assert 'src="http' not in html and "src='http" not in html
    assert not re.search(r"<link[^>]+href=", html)
    assert "cdn." not in html.replace(plotly_js(), "")
    assert "@import" not in html and "fonts.googleapis" not in html
    assert "Content-Security-Policy" in html
    assert template_env() is template_env()
    assert template_env().autoescape


HOSTILE_SCRIPT = 'x"><img src=x onerror=alert(1)>.py'
HOSTILE_ERROR = "bad </script><script>alert(2)</script> & <!-- more"


def _script_bodies(html: str) -> list[str]:
    return re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S)


def test_user_strings_are_escaped(tmp_path_factory):
    scenario = fixtures.Scenario(script=HOSTILE_SCRIPT, script_args=("--tag", "<b>x</b>"),
                                 error_message=HOSTILE_ERROR, hostname="<svg onload=alert(3)>",
                                 finding_title="<i onmouseover=alert(4)>slow</i>",
                                 failed_probe=True)
    run = make_run(tmp_path_factory, scenario, "hostile")
    # Put hostile text into the JSON the page's scripts read, too (probe labels).
    hostile_id = "p001</script><script>alert(5)</script>"
    run = _rename_probe(run, "p001", hostile_id)
    html = render_report(run)
    for needle in ("<img src=x", "<svg onload", "<i onmouseover", "<b>x</b>",
                   "<script>alert", "<!-- more"):
        assert needle not in html
    assert "x&#34;&gt;&lt;img src=x onerror=alert(1)&gt;.py" in html
    assert "bad &lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt; &amp;" in html
    # Exactly our own scripts: plotly, the data block, the page code.
    assert len(_script_bodies(html)) == 3
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html,
                     flags=re.S).group(1)
    assert "alert(5)" in data and "\\u003c/script\\u003e" in data
    assert "<" not in data and ">" not in data and "&" not in data


def _rename_probe(run, old: str, new: str):
    def rename(frame, column):
        frame = frame.copy()
        frame[column] = frame[column].replace(old, new)
        return frame
    summary = dict(run.summary)
    summary["probes"] = [dict(p, id=new) if p["id"] == old else p for p in summary["probes"]]
    return dataclasses.replace(run, summary=summary, probes=rename(run.probes, "id"),
                               steps=rename(run.steps, "probe_id"),
                               samples=rename(run.samples, "probe_id"))


def test_what_measured_faster_and_stays_open_is_shown_and_inert(data_bound_run):
    """The report says, under the recommendation, what measured faster and was not
    established, and the command that would settle it (the script's arguments are the
    user's: they come out as text)."""
    summary = dict(data_bound_run.summary)
    summary["recommendation"] = {**(summary.get("recommendation") or {}), "unsettled": [{
        "probe": "p002", "ratio": 1.31, "config": {"num_workers": 1, "batch_size": 32},
        "why": "alternated with the script's settings it measured 1.14x [0.81-1.60]",
        "settle": "ddp-profile run t.py --num-workers 1 --pairs 5 -- --tag '<b>x</b>'"}]}
    html = render_report(dataclasses.replace(data_bound_run, summary=summary))
    block = re.search(r'<div id="unsettled">(.*?)</div>\s*</section>', html, flags=re.S)
    assert block is not None and "Measured, not established" in block.group(1)
    # on the first screen without the probe id: it belongs with the command, lower down
    # what differs, the search's figure marked as the search's
    assert "num_workers=1 (1.31× in the search): " in block.group(1)
    assert "p002" not in block.group(1)
    settle = re.search(r'<div id="settle">(.*?)</div>\s*</section>', html, flags=re.S)
    assert settle is not None and "(probe p002)" in settle.group(1)
    assert "&lt;b&gt;x&lt;/b&gt;" in settle.group(1) and "<b>x</b>" not in html


def test_write_report_writes_the_file(data_bound_run, tmp_path):
    path = write_report(data_bound_run, str(tmp_path / "report.html"))
    with open(path, encoding="utf-8") as handle:
        assert handle.read().startswith("<!DOCTYPE html>")
    assert os.listdir(tmp_path) == ["report.html"]


def test_scale_50_probes_8_ranks(tmp_path_factory, tmp_path):
    run = make_run(tmp_path_factory, fixtures.scale(probes=50, ranks=8), "scale")
    assert len(run.probes) == 50
    start = time.perf_counter()
    path = write_report(run, str(tmp_path / "report.html"))
    seconds = time.perf_counter() - start
    extra_mb = (os.path.getsize(path) - len(plotly_js().encode())) / 2**20
    assert extra_mb < 3.0, f"{extra_mb:.2f} MB beyond plotly.js"
    assert seconds < 15.0, f"rendered in {seconds:.1f} s"  # ~2 s on a quiet 2-core machine
    data = build_report_data(run)
    assert len(data["client"]["probes"]) == 49  # every probe with data; the failed one has none
    for fig in _all_figures(data):
        for trace in fig["data"]:
            if trace.get("type") == "scatter":
                assert len(_points(trace)) <= figures.MAX_POINTS


def test_ranks_are_labelled_by_node_when_they_span_nodes():
    import pandas as pd

    from ddp_profile.reports.figures import step_timeline, time_split_by_rank

    steps = pd.DataFrame([{"probe_id": "p0", "rank": r, "node": r // 2, "step": s,
                           "measured": True, "t_s": s * 0.1, "data_wait_s": 0.01,
                           "compute_s": 0.02, "other_s": 0.0, "step_s": 0.03}
                          for r in range(4) for s in range(5)])
    names = [t["name"] for t in step_timeline(steps, "p0").to_dict()["data"]]
    assert names == ["node 0 · rank 0", "node 0 · rank 1", "node 1 · rank 2", "node 1 · rank 3"]
    bars = time_split_by_rank(steps, "p0").to_dict()["data"][0]["x"]
    assert list(bars)[-1] == "node 1 · rank 3"
    one_node = steps.assign(node=0)
    assert step_timeline(one_node, "p0").to_dict()["data"][0]["name"] == "rank 0"


def test_exposed_communication_is_the_fourth_part_of_a_step():
    import pandas as pd

    from ddp_profile.reports.figures import time_split_by_config

    rows = [{"probe_id": "p0", "rank": r, "node": 0, "step": s, "measured": True,
             "t_s": s * 0.1, "data_wait_s": 0.01, "compute_s": 0.08, "other_s": 0.01,
             "step_s": 0.1, "comm_s": 0.03 if s % 2 else float("nan")}  # read every 2nd step
            for r in range(2) for s in range(6)]
    steps = pd.DataFrame(rows)
    parts = {t["name"]: t["y"][0] for t in time_split_by_config(steps, {"p0": "base"})
             .to_dict()["data"]}
    assert list(parts) == ["data wait", "compute", "exposed comm", "other"]
    assert parts["compute"] == pytest.approx(50.0) and parts["exposed comm"] == pytest.approx(30.0)
    without = steps.assign(comm_s=float("nan"))
    names = [t["name"] for t in time_split_by_config(without, {"p0": "base"}).to_dict()["data"]]
    assert names == ["data wait", "compute", "other"]


def test_headline_keeps_the_baseline_when_it_is_also_the_recommended_probe(tmp_path):
    from ddp_profile.reports.html import build_headline, probe_roles
    from tests.synthetic import probe, write_run

    path = write_run(str(tmp_path / "run"), probes=[probe("p000", kind="baseline",
                                                          num_workers=0)],
                     recommended={"num_workers": 0, "pin_memory": False,
                                  "prefetch_factor": None, "batch_size": 32},
                     summary_extra={"recommended_probe": "p000"})
    from ddp_profile.profiler.store.results import load_run

    run = load_run(path)
    roles = probe_roles(run)
    headline = build_headline(run, roles)
    assert roles["p000"] == "recommended"
    assert headline["baseline_throughput_text"] != "–"
    assert headline["baseline_throughput_text"] == headline["recommended_throughput_text"]


def test_a_single_sample_is_drawn_as_a_point():
    import pandas as pd

    from ddp_profile.reports.figures import sample_timeline

    samples = pd.DataFrame([{"probe_id": "p", "rank": 0, "source": "host", "t_s": 0.5,
                             "cpu_percent": 40.0}])
    trace = sample_timeline(samples, "p", "host", "cpu_percent", "CPU", "%").to_dict()["data"][0]
    assert "markers" in trace["mode"]


def test_capacity_chart_shows_the_model_and_the_measured_points(data_bound_run):
    from ddp_profile.profiler.decide.capacity import Capacity

    assert "capacity" not in build_report_data(data_bound_run)["client"]["figures"]
    model = Capacity(cpu_per_sample_s=1e-4, wait_per_sample_s=3e-3, cpus_per_rank=1.0,
                     ranks=2, demand=6000.0, memory_workers=None)
    run = dataclasses.replace(data_bound_run,
                              summary={**data_bound_run.summary, "capacity": model.to_dict()})
    figure = build_report_data(run)["client"]["figures"]["capacity"]
    go.Figure(figure)  # valid plotly
    traces = {t["name"]: t for t in figure["data"]}
    assert set(traces) == {"loading capacity", "loop demand", "CPU limit", "measured"}
    assert _points(traces["loop demand"]).tolist() == [6000.0, 6000.0]
    assert max(_points(traces["loading capacity"], "x")) == 64
    ok = run.probes[(run.probes["status"] == "ok") & (run.probes["kind"] != "ceiling")]
    assert len(_points(traces["measured"])) == len(ok)
    assert 'id="capacity"' in render_report(run)
    assert "runnable" not in figure["layout"]["title"]["text"]
    # pinning that limits, and producers that queued for busy CPUs, are shown too
    from ddp_profile.profiler.decide.capacity import RunQueue

    busy = dataclasses.replace(model, pin_per_sample_s=2e-4,
                               contention=RunQueue(per_sample_s=1.7e-3, share=0.35, workers=38))
    run = dataclasses.replace(data_bound_run,
                              summary={**data_bound_run.summary, "capacity": busy.to_dict()})
    figure = build_report_data(run)["client"]["figures"]["capacity"]
    traces = {t["name"]: t for t in figure["data"]}
    assert _points(traces["pinning limit"]).tolist() == [10000.0, 10000.0]  # 2 ranks / 0.2 ms
    assert "1.70 ms per sample runnable" in figure["layout"]["title"]["text"]
    assert "38 workers" in figure["layout"]["title"]["text"]


def test_the_ceiling_share_is_the_recommendations_alone(data_bound_run):
    """The headline's share of the compute-only ceiling is the one the recommendation
    computed (a ceiling at its own batch size); where it has none, the report makes none of
    its own against a ceiling at another batch size (timm: 61 % of a batch-32 ceiling beside a
    batch-16 pick), and says why."""
    summary = dict(data_bound_run.summary)
    summary["recommendation"] = dict(summary["recommendation"], ceiling_share=None)
    assert summary.get("ceiling_throughput")
    head = build_report_data(dataclasses.replace(data_bound_run, summary=summary))["headline"]
    assert head["ceiling_share"] is None
    assert head["ceiling_share_text"] == "not at this batch size"
