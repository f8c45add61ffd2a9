"""The checks every run of the suite passes through (``tests.conftest``) catch what they are
for: a finding or a recommendation that contradicts the probes it stands on."""

from __future__ import annotations

import copy

import pytest

from tests.conftest import assert_findings_agree_with_probes

SUMMARY = {
    "probes": [{"id": "p000", "status": "ok", "config": {"num_workers": 0, "batch_size": 64}},
               {"id": "p001", "status": "ok", "config": {"num_workers": 2, "batch_size": 64}},
               {"id": "p002", "status": "ok", "config": {"num_workers": 4, "batch_size": 64}},
               {"id": "p003", "status": "crashed", "config": {"num_workers": 8}}],
    "recommended": {"num_workers": 2, "batch_size": 64}, "recommended_probe": "p001",
    "expected_speedup": 1.4, "expected_speedup_interval": [1.2, 1.6],
    "recommendation": {"baseline_probe_id": "p000", "notes": ["p003 crashed"],
                       "speedup_basis": "alternated (p000-p001)",
                       "unsettled": [{"probe": "p002", "ratio": 1.1, "why": "within noise"}]},
    "findings": [{"evidence": "p001 waits 5 % of its steps", "recommendation": "see p001"}],
}


def broken(change) -> dict:
    summary = copy.deepcopy(SUMMARY)
    change(summary)
    return summary


def test_a_summary_that_agrees_with_its_probes_passes():
    assert_findings_agree_with_probes(SUMMARY)


@pytest.mark.parametrize("change", [
    lambda s: s["findings"].append({"evidence": "p009 ran 2x"}),  # a probe that never ran
    lambda s: s.update(recommended_probe="p003"),  # a crashed probe recommended
    lambda s: s["recommended"].update(num_workers=4),  # not the settings it ran
    lambda s: s.update(expected_speedup=1.7),  # outside its own interval
    lambda s: s["recommendation"]["unsettled"][0].update(ratio=0.9),  # "faster", slower
    lambda s: s["recommendation"]["unsettled"][0].update(probe="p001"),  # the pick itself
    lambda s: s["recommendation"].update(baseline_probe_id="p003"),
])
def test_each_contradiction_fails_the_run_that_shows_it(change):
    with pytest.raises(AssertionError):
        assert_findings_agree_with_probes(broken(change))
