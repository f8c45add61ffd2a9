"""The rules on a run directory read back by ``load_run`` (tables as the profiler makes them)."""

from __future__ import annotations

from ddp_profile.profiler.store.results import load_run
from ddp_profile.rules import evaluate, finding_to_dict
from tests.synthetic import lognormal_step_time, probe, write_run


def test_evaluate_a_loaded_data_bound_run(tmp_path):
    write_run(tmp_path / "run")  # baseline without workers, then 2 workers: faster
    findings, rec = evaluate(load_run(str(tmp_path / "run")))
    assert "data-loader-bound" in [f.rule for f in findings]
    assert all(set(finding_to_dict(f)) == {"rule", "severity", "title", "evidence",
                                           "recommendation", "ranks"} for f in findings)
    assert rec.probe_id == "w2" and rec.expected_speedup > 1.5


def test_the_speedup_interval_of_loaded_runs_covers_the_true_ratio(tmp_path):
    # steps of 80 ms without workers and 40 ms with two (5 % noise): the true speedup is 2
    intervals = []
    for seed in range(10):
        path = write_run(tmp_path / f"run{seed}", [
            probe("baseline", kind="baseline",
                  step_time_fn=lognormal_step_time(0.08, seed=2 * seed + 1)),
            probe("w2", num_workers=2, step_time_fn=lognormal_step_time(0.04, seed=2 * seed + 2))])
        intervals.append(evaluate(load_run(path))[1].expected_speedup_interval)
    assert sum(lo < 2.0 < hi for lo, hi in intervals) >= 7  # a 90 % interval: about 9 of 10
    assert all(hi - lo < 0.15 for lo, hi in intervals)  # 30 steps of 5 % noise: a few percent


def test_the_package_exports_load_run_and_its_types_without_loading_pandas(tmp_path):
    """``ddp_profile.load_run`` is the public way in; importing the package alone (as the
    start-up hook does in every rank and worker) loads no pandas."""
    import subprocess
    import sys

    path = write_run(tmp_path / "run")
    code = ("import sys, ddp_profile; assert 'pandas' not in sys.modules; "
            f"run = ddp_profile.load_run({str(path)!r}); "
            "assert isinstance(run, ddp_profile.Run); "
            "assert run.summary['probes'][0]['status'] == ddp_profile.Status.OK; "
            "assert run.summary['probes'][0]['kind'] == ddp_profile.Kind.BASELINE; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
