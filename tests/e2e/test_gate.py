"""The CI gate on real runs of the built-in workload (one torchrun rank, one intra-op thread:
the gate reads steps, and a second rank would double each launch's start-up on a CPU-bound
suite; 2 ranks and their all-reduce are the sweep's tests' subject).

Four runs in all: a baseline and the same workload slowed by ~15 % per step, each measured in
two launches (``--repeat 2``, so the gate's launch-level rule is on), the same workload again in
one launch, and a run configured only by a ``ddp-profile.toml`` (no flags). The workload's
step is dominated by one known sleep (``--step-sleep-ms 50``; a tiny model, no loading cost), so
its step time is steady even on a busy 2-core machine: many short sleeps per step (``--load-ms``)
or real compute drift by 10 % between runs there when other jobs come and go, more than the
gate's 5 % tolerance. The slowdown is 15 % of the first run's measured median step time, added
to that sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from ddp_profile.errors import ExitCode
from tests.conftest import DEMO, ONE_THREAD, TEST_ID_VAR, _current_test_id, probe_processes, run_cli

pytestmark = pytest.mark.e2e

STEPS = 30
RUN = ["--steps", str(STEPS), "--warmup", "3", "--no-ceiling", "--no-comm", "--num-workers", "0",
       "--nproc-per-node", "1", "--no-report", "--quiet"]
WORKLOAD = ["--hidden", "32", "--layers", "1", "--batch-size", "8"]
STEP_SLEEP_MS = 50.0
SLOWDOWN = 0.15


def _run(out: str, step_sleep_ms: float = STEP_SLEEP_MS, repeat: int = 1) -> None:
    result = run_cli(["run", DEMO, "--out", out, *RUN, "--repeat", str(repeat), "--",
                      *WORKLOAD, "--step-sleep-ms", f"{step_sleep_ms:.2f}"], out=out,
                     env=ONE_THREAD)
    assert result.returncode == 0, result.stderr


def _step_time_s(run_dir: str) -> float:
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        probe = json.load(handle)["probes"][0]
    return max(rank["step_time_median_s"] for rank in probe["per_rank"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Baseline (2 launches), same again (1) and slowed (2): real runs shared by the tests."""
    root = tmp_path_factory.mktemp("gate")
    paths = {name: str(root / name) for name in ("base", "same", "slow")}
    _run(paths["base"], repeat=2)
    _run(paths["same"])
    sleep_ms = SLOWDOWN * _step_time_s(paths["base"]) * 1000
    _run(paths["slow"], STEP_SLEEP_MS + sleep_ms, repeat=2)
    assert not probe_processes()
    return {**paths, "root": str(root), "sleep_ms": sleep_ms}


def _gate(runs, baseline: str, current: str, name: str, *extra: str):
    outputs = {kind: os.path.join(runs["root"], f"{name}.{kind}") for kind in ("xml", "md", "json")}
    result = run_cli(["gate", baseline, current, "--junit", outputs["xml"], "--markdown",
                      outputs["md"], "--json", outputs["json"], *extra],
                     out=os.path.join(runs["root"], name))
    with open(outputs["json"], encoding="utf-8") as handle:
        verdict = json.load(handle)["comparisons"][0]["verdict"]
    print(f"{name}: exit {result.returncode}, {verdict['status']}, ratio "
          f"{verdict['ratio']:.3f} [{verdict['ratio_ci_low']:.3f}, "
          f"{verdict['ratio_ci_high']:.3f}], p={verdict['p_value']:.2g}, "
          f"detectable {verdict['min_detectable']:.3f}, "
          f"n={verdict['n_baseline']}/{verdict['n_current']}")
    return result, verdict, outputs


def _junit(path: str) -> ET.Element:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1"
    return suite


def test_repeat_measures_the_configuration_in_more_launches(runs):
    with open(os.path.join(runs["base"], "summary.json"), encoding="utf-8") as handle:
        probes = json.load(handle)["probes"]
    assert [p["kind"] for p in probes] == ["baseline", "repeat"]
    assert all(p["status"] == "ok" and p["steps_measured"] == STEPS for p in probes)
    assert probes[0]["config"] == probes[1]["config"]


def test_same_workload_twice_passes(runs):
    result, verdict, outputs = _gate(runs, runs["base"], runs["same"], "same")
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert verdict["status"] == "pass" and verdict["n_baseline"] == 2 * STEPS
    assert (verdict["launches_baseline"], verdict["launches_current"]) == (2, 1)
    assert verdict["launch"] is None  # one launch on the current side: the step rule alone
    with open(outputs["json"], encoding="utf-8") as handle:
        warnings = json.load(handle)["warnings"]
    assert any("single launch" in w and "--repeat 3" in w for w in warnings), warnings
    assert 0.9 < verdict["ratio"] < 1.1 and 0.9 < verdict["median_ratio"] < 1.1
    assert 0 < verdict["min_detectable"] < 0.5
    suite = _junit(outputs["xml"])
    assert suite.get("failures") == "0" and suite.find("testcase/failure") is None
    with open(outputs["md"], encoding="utf-8") as handle:
        markdown = handle.read()
    assert "pass" in markdown.splitlines()[0].lower() and "w=0" in markdown


def test_injected_slowdown_is_a_regression(runs):
    result, verdict, outputs = _gate(runs, runs["base"], runs["slow"], "slow")
    assert result.returncode == ExitCode.REGRESSION, result.stdout + result.stderr
    assert verdict["status"] == "regression" and verdict["p_value"] < 0.002
    assert verdict["ratio_ci_high"] < 0.95  # wholly beyond the 5 % tolerance
    assert 0.65 < verdict["ratio"] < 0.93, (verdict, runs["sleep_ms"])
    launch = verdict["launch"]  # two launches a side: the launch medians agree
    assert (verdict["launches_baseline"], verdict["launches_current"]) == (2, 2)
    assert launch["ratio"] < 0.95 and abs(launch["ratio"] - verdict["ratio"]) < 0.05
    assert "2 / 2 launches" in verdict["reason"]
    suite = _junit(outputs["xml"])
    failure = suite.find("testcase/failure")
    assert suite.get("failures") == "1" and failure is not None
    assert failure.get("type") == "ThroughputRegression" and "tolerance" in failure.get("message")
    with open(outputs["md"], encoding="utf-8") as handle:
        markdown = handle.read()
    assert "REGRESSION" in markdown.splitlines()[0] and "regression" in markdown


def test_a_looser_tolerance_lets_the_slowdown_pass(runs):
    result, verdict, _ = _gate(runs, runs["base"], runs["slow"], "loose",
                               "--max-regression", "0.4")
    assert result.returncode == ExitCode.OK and verdict["status"] == "pass"


def test_exported_baseline_file_gates_like_the_run(runs):
    baseline = os.path.join(runs["root"], "baseline.json")
    result = run_cli(["baseline", runs["base"], "-o", baseline], out=baseline)
    assert result.returncode == 0, result.stderr
    with open(baseline, encoding="utf-8") as handle:
        data = json.load(handle)
    assert data["kind"] == "ddp-profile-baseline" and len(data["samples"]) == 2 * STEPS
    assert [len(launch["samples"]) for launch in data["launches"]] == [STEPS, STEPS]
    assert data["config"]["num_workers"] == 0 and data["environment"]["world_size"] == 1
    passed, _, _ = _gate(runs, baseline, runs["same"], "file-same")
    assert passed.returncode == ExitCode.OK
    failed, verdict, _ = _gate(runs, baseline, runs["slow"], "file-slow")
    assert failed.returncode == ExitCode.REGRESSION and verdict["ratio_ci_high"] < 0.95
    assert verdict["launches_baseline"] == 2 and verdict["launch"]["ratio"] < 0.95


def test_ci_flow_from_a_project_file_with_no_flags(runs, tmp_path):
    """`ddp-profile run` then `ddp-profile gate`, both with no arguments, as a CI job runs them."""
    args = [*WORKLOAD, "--step-sleep-ms", f"{STEP_SLEEP_MS:.2f}"]
    (tmp_path / "ddp-profile.toml").write_text(
        f"script = {json.dumps(DEMO)}\nargs = {json.dumps(args)}\n"
        f"num_workers = [0]\nnproc_per_node = 1\nsteps = {STEPS}\nwarmup = 3\nceiling = false\n"
        "comm = false\n"
        'out = "current"\nbaseline = "baseline.json"\nmax_regression = 0.05\n')
    baseline = run_cli(["baseline", runs["base"], "-o", str(tmp_path / "baseline.json")])
    assert baseline.returncode == 0, baseline.stderr

    def cli_here(*args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, **ONE_THREAD, **{TEST_ID_VAR: _current_test_id[0]})
        return subprocess.run([sys.executable, "-m", "ddp_profile", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=240, env=env)

    ran = cli_here("run")
    assert ran.returncode == 0, ran.stderr
    assert "settings from ./ddp-profile.toml" in ran.stdout, ran.stdout
    with open(tmp_path / "current" / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    probe = summary["probes"][0]
    assert [p["kind"] for p in summary["probes"]] == ["baseline"]  # one probe: no ceiling,
    # no communication counterfactual
    assert probe["status"] == "ok" and probe["steps_measured"] == STEPS
    assert summary["script_args"] == args
    assert (tmp_path / "current" / "report.html").is_file()  # the report is on by default

    gated = cli_here("gate", "--junit", "gate.xml")
    assert gated.returncode == ExitCode.OK, gated.stdout + gated.stderr
    assert _junit(str(tmp_path / "gate.xml")).get("failures") == "0"
