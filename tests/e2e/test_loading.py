"""Loading measured where batches are made, on real 2-rank CPU runs with defaults: the search
follows the measured capacity, and the findings tell waiting from CPU work."""

from __future__ import annotations

import os

import pytest

from tests.conftest import DEMO

pytestmark = pytest.mark.e2e

QUICK = ["--steps", "12", "--warmup", "2", "--no-report", "--quiet"]


def _cpus_per_rank() -> int:
    return max(1, len(os.sched_getaffinity(0)) // 2)


def test_sleep_bound_loading_climbs_past_the_cpus_with_a_wait_bound_finding(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *QUICK, "--", "--load-ms", "3"], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["recommended"]["num_workers"] > _cpus_per_rank()
    assert summary["expected_speedup"] > 3.0
    capacity = summary["capacity"]
    assert capacity["bound"] == "wait"
    assert 2.5e-3 < capacity["wait_per_sample_s"] < 5e-3  # the 3 ms sleep, measured
    assert capacity["cpu_per_sample_s"] < 1e-3
    findings = {f["rule"]: f for f in summary["findings"]}
    assert "io-bound-loading" in findings and "cpu-bound-preprocessing" not in findings
    assert "ms of waiting" in findings["io-bound-loading"]["evidence"]
    baseline = summary["probes"][0]
    assert baseline["loading"]["producers"] == 2  # the two ranks, num_workers=0
    assert any((p.get("loading") or {}).get("worker_private_rss") for p in summary["probes"])


def test_cpu_heavy_transform_is_cpu_bound_and_gets_no_storage_advice(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *QUICK, "--", "--cpu-ms", "2"], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["capacity"]["bound"] == "cpu"
    assert 1.5e-3 < summary["capacity"]["cpu_per_sample_s"] < 4e-3
    findings = {f["rule"]: f for f in summary["findings"]}
    assert "cpu-bound-preprocessing" in findings and "io-bound-loading" not in findings
    text = " ".join([f["recommendation"] for f in summary["findings"]]
                    + list((summary.get("recommendation") or {}).get("notes") or []))
    assert "NVMe" not in text and "storage" not in text.replace("not storage", "")
    # CPU-bound: no climb past the point where the rank's CPUs saturate
    assert max(p["config"]["num_workers"] for p in summary["probes"]) <= 2 * _cpus_per_rank()


def test_bad_loading_is_recorded_and_the_sweep_goes_on(cli, run_dir):
    # 2 workers kill one of their workers mid-probe; every other setting runs
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0,1,2", "--no-ceiling",
                  *QUICK, "--", "--load-ms", "1", "--kill-worker-at-step", "6",
                  "--kill-worker-workers", "2"], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    by_workers: dict = {}
    for probe in summary["probes"]:
        by_workers.setdefault(probe["requested"].get("num_workers"), []).append(probe)
    assert all(p["status"] != "ok" for p in by_workers[2]), by_workers[2]
    assert any(p["status"] == "ok" and p["loading"] for p in by_workers[1])
    dead = by_workers[2][0]
    probe_dir = os.path.join(run_dir, "probes", dead["id"])
    workers = os.listdir(os.path.join(probe_dir, "workers"))
    assert workers  # the dead probe's workers left their batch records
    assert summary["recommended"]["num_workers"] in (0, 1)  # never the setting that died


def test_a_transform_that_raises_fails_its_probe_only(cli, run_dir):
    from tests.conftest import SCRIPTS

    script = os.path.join(SCRIPTS, "raising_transform_train.py")
    result = cli(["run", script, "--out", run_dir, "--num-workers", "0,1,2", "--no-ceiling",
                  *QUICK], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    failed = [p for p in summary["probes"] if p["requested"].get("num_workers") == 2]
    assert failed and all(p["status"] == "crash" for p in failed), failed
    assert failed[0]["error"]  # (its root cause: see the probe's launcher.log)
    ok = [p for p in summary["probes"] if p["status"] == "ok"]
    assert {p["config"]["num_workers"] for p in ok} >= {0, 1}
    assert all(p["loading"] and p["loading"]["samples"] > 0 for p in ok)
    assert summary["capacity"] is not None
