"""The rules on a run directory read back by ``load_run`` (tables as the profiler makes them)."""

from __future__ import annotations

from ddp_profile.profiler.store.results import load_run
from ddp_profile.rules import evaluate, finding_to_dict
from tests.synthetic import write_run


def test_evaluate_a_loaded_data_bound_run(tmp_path):
    write_run(tmp_path / "run")  # baseline without workers, then 2 workers: faster
    findings, rec = evaluate(load_run(str(tmp_path / "run")))
    assert "data-loader-bound" in [f.rule for f in findings]
    assert all(set(finding_to_dict(f)) == {"rule", "severity", "title", "evidence",
                                           "recommendation", "ranks"} for f in findings)
    assert rec.probe_id == "w2" and rec.expected_speedup > 1.5
    lo, hi = rec.expected_speedup_interval
    assert lo <= rec.expected_speedup <= hi
