"""The gate end to end on synthetic run directories: sides, refusals, exit codes, outputs."""

from __future__ import annotations

import io
import json
import os
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from ddp_profile.commands.baseline_gate import (
    baseline_warnings,
    build_result,
    parse_config,
    run_baseline_export,
    run_gate,
)
from ddp_profile.errors import BadRunDir, ExitCode, Incomparable, UsageError
from ddp_profile.profiler.store.baseline import (
    ConfigNotFound,
    export_baseline,
    load_side,
    step_throughput_samples,
)
from ddp_profile.profiler.store.results import load_run
from ddp_profile.reports import ci
from tests.synthetic import lognormal_step_time, probe, write_run

FAST = {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2, "batch_size": 32}


def _probes(slowdown: float = 1.0, seed: int = 0, steps: int = 40, cv: float = 0.05):
    """A slow baseline probe, the recommended w2 probe (optionally slowed), and a ceiling."""
    noise = lognormal_step_time(0.04, cv, seed)

    def w2(probe_id, rank, step):
        return tuple(part * slowdown for part in noise(probe_id, rank, step))

    return [probe("baseline", kind="baseline", steps=steps),
            probe("w2", step_time_fn=w2, steps=steps, **FAST),
            probe("ceiling", kind="ceiling", num_workers=8, steps=steps,
                  step_time_fn=lambda p, r, s: 0.001)]


@pytest.fixture
def runs(tmp_path):
    return {"base": write_run(tmp_path / "base", _probes(seed=0)),
            "same": write_run(tmp_path / "same", _probes(seed=1)),
            "slow": write_run(tmp_path / "slow", _probes(slowdown=1.15, seed=2)),
            "short": write_run(tmp_path / "short", _probes(seed=3, steps=5)),
            "noisy": write_run(tmp_path / "noisy", _probes(seed=4, steps=12, cv=0.12)),
            "noisy2": write_run(tmp_path / "noisy2", _probes(seed=6, steps=12, cv=0.12))}


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=100)


def test_synthetic_run_loads_as_written(runs):
    run = load_run(runs["base"])
    assert list(run.probes["id"]) == ["baseline", "w2", "ceiling"]
    assert set(run.steps["rank"]) == {0, 1}
    measured = run.steps[run.steps["measured"] & (run.steps["probe_id"] == "w2")]
    assert len(measured) == 2 * 40
    assert run.contexts[("w2", 1)]["world_size"] == 2
    assert run.summary["recommended"] == FAST
    assert not run.warnings


def test_step_samples_use_the_slowest_rank(tmp_path):
    def step_time(probe_id, rank, step):
        return 0.1 if rank == 0 else 0.2 + 0.01 * step

    run = load_run(write_run(tmp_path / "r", [probe("p", batch_size=16)], steps=10, warmup=2,
                             step_time_fn=step_time))
    samples = step_throughput_samples(run, "p")
    expected = [32 / (0.2 + 0.01 * step) for step in range(2, 12)]
    assert samples == pytest.approx(expected)


def test_steps_missing_on_a_rank_are_left_out(tmp_path):
    run_dir = write_run(tmp_path / "r", [probe("p")], steps=10, warmup=0)
    path = os.path.join(run_dir, "probes", "p", "rank-1.jsonl")
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    with open(path, "w", encoding="utf-8") as handle:  # drop rank 1's step 4
        handle.writelines(line for line in lines if '"step": 4,' not in line)
    assert len(step_throughput_samples(load_run(run_dir), "p")) == 9


def test_default_side_is_the_recommended_probe_never_the_ceiling(runs):
    side = load_side(runs["base"])
    assert side.probe_id == "w2" and side.config == FAST and len(side.samples) == 40
    assert load_side(runs["base"], {"num_workers": 0}).probe_id == "baseline"
    with pytest.raises(ConfigNotFound):
        load_side(runs["base"], {"num_workers": 8})  # only the ceiling probe has it


@pytest.mark.parametrize("kind", ["threads", "ddp"])
def test_gate_never_picks_or_pools_a_counterfactual_probe(tmp_path, kind):
    """A threads or DDP counterfactual runs the recommended settings faster than the user's
    script would; the gate compares and pools only what the user runs."""
    fast = lognormal_step_time(0.01, 0.05, 7)
    run_dir = write_run(tmp_path / "run", [
        probe("baseline", kind="baseline", steps=30), probe("w2", steps=30, **FAST),
        probe("w2-repeat", kind="repeat", steps=30, **FAST),
        probe("w2-cf", kind=kind, step_time_fn=fast, steps=30, **FAST)], recommended=FAST)
    side = load_side(run_dir)
    assert side.probe_ids == ["w2", "w2-repeat"] and len(side.samples) == 60
    assert load_side(run_dir, {"num_workers": 2}).probe_ids == ["w2", "w2-repeat"]


def test_a_a_gate_passes_and_regression_fails(runs, tmp_path):
    assert run_gate(runs["base"], runs["same"], console=_quiet()) == ExitCode.OK
    junit = tmp_path / "out" / "junit.xml"
    junit.parent.mkdir()
    code = run_gate(runs["base"], runs["slow"], junit=str(junit), console=_quiet())
    assert code == ExitCode.REGRESSION
    root = ET.parse(junit).getroot()
    suites = root.findall("testsuite")
    assert len(suites) == 1 and suites[0].get("failures") == "1"
    cases = suites[0].findall("testcase")
    assert len(cases) == 1
    failure = cases[0].find("failure")
    assert failure is not None and "tolerance" in failure.get("message")


def test_inconclusive_is_skipped_in_junit(runs, tmp_path):
    junit = tmp_path / "junit.xml"
    code = run_gate(runs["base"], runs["short"], junit=str(junit), console=_quiet())
    assert code == ExitCode.INCONCLUSIVE
    case = ET.parse(junit).getroot().find("testsuite/testcase")
    assert case.find("skipped") is not None and case.find("failure") is None


def test_markdown_json_and_github_summary(runs, tmp_path, monkeypatch):
    summary_file = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_file))
    md_path, json_path = tmp_path / "gate.md", tmp_path / "gate.json"
    run_gate(runs["base"], runs["slow"], markdown=str(md_path), json_out=str(json_path),
             console=_quiet())
    text = md_path.read_text(encoding="utf-8")
    assert "| Config | Baseline samples/s | Current samples/s |" in text
    assert "| w=2 pin=false pf=2 bs=32 |" in text and "regression" in text
    assert "Hodges-Lehmann" in text and "| Detectable |" in text
    assert summary_file.read_text(encoding="utf-8").strip() == text.strip()
    # the slowdown's part: synthetic steps split 10 / 80 / 10 % (data wait / compute / other)
    assert "| Part | Baseline | Current | Change |" in text
    compute = next(line for line in text.splitlines() if line.startswith("| compute |"))
    base_ms, current_ms = (float(v) for v in compute.split("|")[2:4])
    assert current_ms > base_ms * 1.1
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["status"] == "regression"
    verdict = data["comparisons"][0]["verdict"]
    assert verdict["n_current"] == 40 and verdict["interval_method"] == "normal"
    assert verdict["ratio_ci_low"] < verdict["ratio"] < verdict["ratio_ci_high"] < 0.95
    assert 0.05 < verdict["min_detectable"] < 0.15
    row = next(line for line in text.splitlines() if line.startswith("| w=2 pin=false"))
    assert f"| {-verdict['min_detectable'] * 100:+.1f} % |" in row
    assert data["baseline"]["probe_id"] == "w2"


def test_github_summary_stays_under_one_mib(tmp_path):
    path = tmp_path / "summary.md"
    path.write_text("x" * (ci.GITHUB_SUMMARY_LIMIT - 100), encoding="utf-8")
    ci.write_github_summary("# table\n" + "y" * 5000, {"GITHUB_STEP_SUMMARY": str(path)})
    assert os.path.getsize(path) < ci.GITHUB_SUMMARY_LIMIT
    assert ci.write_github_summary("z", {}) is None


def test_console_table_names_the_verdict(runs):
    console = Console(file=io.StringIO(), width=80)
    run_gate(runs["base"], runs["slow"], console=console)
    out = console.file.getvalue()
    assert "REGRESSION" in out and "w=2 pin=false" in out and "Detectable" in out
    assert all(len(line) <= 80 for line in out.splitlines())
    result = build_result(load_side(runs["base"]), load_side(runs["slow"]))
    detectable = result.comparison.verdict.min_detectable
    assert f"{-detectable * 100:+.1f} %" in out


def test_too_few_steps_for_a_ten_percent_slowdown_earn_a_warning(runs, tmp_path):
    """12 noisy steps a side cannot see 10 %: every output says so and names the steps."""
    console = Console(file=io.StringIO(), width=80)
    md_path, json_path, junit = (tmp_path / "gate.md", tmp_path / "gate.json",
                                 tmp_path / "gate.xml")
    run_gate(runs["noisy"], runs["noisy2"], console=console, markdown=str(md_path),
             json_out=str(json_path), junit=str(junit))
    data = json.loads(json_path.read_text(encoding="utf-8"))
    verdict = data["comparisons"][0]["verdict"]
    assert verdict["min_detectable"] > 0.10 and verdict["steps_needed"] > 12
    needed = f"about {verdict['steps_needed']} steps per side"
    assert any(needed in w for w in data["warnings"])
    assert needed in md_path.read_text(encoding="utf-8")
    assert needed in " ".join(console.file.getvalue().split())
    assert needed in ET.parse(junit).getroot().find("testsuite/system-err").text
    # enough quiet steps: no warning
    quiet = build_result(load_side(runs["base"]), load_side(runs["same"]))
    assert quiet.comparison.verdict.steps_needed is None
    assert not any("steps per side" in w for w in quiet.warnings)


@pytest.mark.parametrize("change", [{"torch_version": "2.12.0+cpu"}, {"world_size": 4},
                                    {"cpu_model": "Other CPU"}, {"device": "cuda",
                                                                  "gpu_name": "NVIDIA H100"}])
def test_incomparable_environments_are_refused_unless_forced(runs, tmp_path, change):
    other = write_run(tmp_path / "other", _probes(seed=5), **change)
    with pytest.raises(Incomparable) as excinfo:
        run_gate(runs["base"], other, console=_quiet())
    assert "--force" in str(excinfo.value) and "\n" not in str(excinfo.value)
    out = tmp_path / "forced.json"
    code = run_gate(runs["base"], other, force=True, json_out=str(out), console=_quiet())
    assert code == ExitCode.OK
    assert any("--force" in w for w in json.loads(out.read_text())["warnings"])


def test_exporting_a_short_or_noisy_baseline_says_so(runs, tmp_path, capsys):
    warnings = run_baseline_export(runs["noisy"], str(tmp_path / "noisy.json"))
    assert len(warnings) == 1 and "holds 12 steps" in warnings[0]
    assert "warning: the baseline holds 12 steps" in capsys.readouterr().err
    assert "only 5 usable" in baseline_warnings([1000.0 + i for i in range(5)])[0]


def test_exported_baseline_round_trips(runs, tmp_path):
    path = tmp_path / "baseline.json"
    assert run_baseline_export(runs["base"], str(path)) == []
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["config"] == FAST and len(data["samples"]) == 40
    assert set(data["environment"]) >= {"device", "world_size", "torch_version", "cpu_model",
                                        "gpu_name", "hostname"}
    assert path.stat().st_size < 10_000
    assert set(data["split"]) == {"data_wait_s", "compute_s", "comm_s", "other_s"}
    assert load_side(str(path)).split == pytest.approx(data["split"])
    old = {k: v for k, v in data.items() if k != "split"}  # a file written before the split
    (tmp_path / "old.json").write_text(json.dumps(old), encoding="utf-8")
    assert load_side(str(tmp_path / "old.json")).split is None
    assert run_gate(str(path), runs["same"], console=_quiet()) == ExitCode.OK
    assert run_gate(str(path), runs["slow"], console=_quiet()) == ExitCode.REGRESSION
    # the baseline file fixes the configuration; the current side is read at the same one
    assert export_baseline(load_run(runs["base"]), {"num_workers": 0})["probe_id"] == "baseline"
    with pytest.raises(ConfigNotFound):
        run_gate(str(path), runs["same"], config="w=0", console=_quiet())


@pytest.mark.parametrize("content", ["{not json", "[]", '{"kind": "something-else"}',
                                     '{"kind": "ddp-profile-baseline", "schema_version": 1, '
                                     '"samples": ["a"], "environment": {}, "config": {}}',
                                     '{"kind": "ddp-profile-baseline", "schema_version": 99, '
                                     '"samples": [], "environment": {}, "config": {}}',
                                     '{"kind": "ddp-profile-baseline", "schema_version": 2, '
                                     '"samples": [1.0, 2.0], "environment": {}, "config": {}, '
                                     '"launches": [{"samples": [1.0]}]}',
                                     '{"kind": "ddp-profile-baseline", "schema_version": 2, '
                                     '"samples": [1.0], "environment": {}, "config": {}, '
                                     '"launches": [{"samples": "1.0"}]}'])
def test_corrupt_baseline_is_a_bad_run_dir(runs, tmp_path, content):
    path = tmp_path / "baseline.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BadRunDir) as excinfo:
        run_gate(str(path), runs["same"], console=_quiet())
    assert "\n" not in str(excinfo.value)


def test_missing_or_corrupt_run_dir_is_a_bad_run_dir(runs, tmp_path):
    with pytest.raises(BadRunDir):
        run_gate(str(tmp_path / "nowhere"), runs["same"], console=_quiet())
    with open(os.path.join(runs["slow"], "summary.json"), "w", encoding="utf-8") as handle:
        handle.write('{"probes": [')
    with pytest.raises(BadRunDir):
        run_gate(runs["base"], runs["slow"], console=_quiet())


def test_run_without_successful_probe_is_a_bad_run_dir(tmp_path):
    run_dir = write_run(tmp_path / "failed", [probe("a", status="oom"),
                                              probe("b", status="crash")])
    with pytest.raises(BadRunDir):
        load_side(run_dir)


def test_config_parsing():
    assert parse_config("w=4 pin=true pf=2 bs=64") == {"num_workers": 4, "pin_memory": True,
                                                       "prefetch_factor": 2, "batch_size": 64}
    assert parse_config("num_workers=0,prefetch_factor=none") == {"num_workers": 0,
                                                                  "prefetch_factor": None}
    for bad in ("workers", "colour=red", "w=four", ""):
        with pytest.raises(UsageError):
            parse_config(bad)


def test_invalid_tolerance_is_a_usage_error(runs):
    with pytest.raises(UsageError):
        run_gate(runs["base"], runs["same"], max_regression=2.0, console=_quiet())
