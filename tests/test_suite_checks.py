"""The checks every run of the suite passes through (``tests.conftest``) catch what they are
for: a finding or a recommendation that contradicts the probes it stands on, and a process a
module's fixture left running."""

from __future__ import annotations

import copy

import pytest

from tests.conftest import _current_test_id, assert_findings_agree_with_probes

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


THREADS = [{"id": f"p{4 + i:03d}", "status": "ok", "kind": "threads",
            "throughput": 2000.0 + 40 * i if i % 2 else 1000.0 - 20 * i,
            "pair": {"role": "candidate" if i % 2 else "reference", "index": i}}
           for i in range(5)]  # A 1000, B 2040, A 960, B 2120, A 920
ALTERNATED = ("2 rank(s) per machine x 2 intra-op threads compete for 2 available CPUs. "
              "Measured: with 1 thread(s) per rank the script ran 2.10x [1.80-2.40] as fast as "
              "with its own threads, alternated A B A B A in launches (probes p004-p008).")
SINGLE = ("Measured: with 1 thread(s) per rank the script's own settings ran 2,040.0 "
          "samples/s (probe p005) against 1,000.0 (baseline p004), 2.04x.")


def broken(change) -> dict:
    summary = copy.deepcopy(SUMMARY)
    summary["probes"] += copy.deepcopy(THREADS)
    change(summary)
    return summary


def test_a_summary_that_agrees_with_its_probes_passes():
    assert_findings_agree_with_probes(SUMMARY)
    with_threads = broken(lambda s: s["findings"].extend(
        {"rule": "thread-oversubscription", "evidence": text} for text in (ALTERNATED, SINGLE)))
    assert_findings_agree_with_probes(with_threads)


@pytest.mark.parametrize("change", [
    lambda s: s["findings"].append({"evidence": "p009 ran 2x"}),  # a probe that never ran
    lambda s: s.update(recommended_probe="p003"),  # a crashed probe recommended
    lambda s: s["recommended"].update(num_workers=4),  # not the settings it ran
    lambda s: s.update(expected_speedup=1.7),  # outside its own interval
    lambda s: s["recommendation"]["unsettled"][0].update(ratio=0.9),  # "faster", slower
    lambda s: s["recommendation"]["unsettled"][0].update(probe="p001"),  # the pick itself
    lambda s: s["recommendation"].update(baseline_probe_id="p003"),
    lambda s: s["probes"][1].update(gpu_idle_fraction=1.18),  # idle longer than its steps
    # a threads figure that is not its alternation's, or not its two probes' ratio
    lambda s: s["findings"].append({"rule": "thread-oversubscription", "evidence": ALTERNATED
                                    .replace("2.10x [1.80-2.40]", "3.10x [2.80-3.40]")}),
    lambda s: s["findings"].append({"rule": "thread-oversubscription", "evidence": SINGLE
                                    .replace("2.04x", "2.40x")}),
])
def test_each_contradiction_fails_the_run_that_shows_it(change):
    with pytest.raises(AssertionError):
        assert_findings_agree_with_probes(broken(change))


@pytest.fixture(scope="module")
def module_ids():
    """The test id a module's fixture runs under, then each test's, in the order they ran."""
    return [_current_test_id[0]]


def _take_id(module_ids: list) -> None:
    """The first test of the module runs under its fixture's id (its leak check reads what
    the fixture's runs left); every later one under an id of its own."""
    first = len(module_ids) == 1
    module_ids.append(_current_test_id[0])
    assert module_ids[-1] != ""
    assert (module_ids[-1] == module_ids[0]) is first, module_ids
    assert len(set(module_ids[1:])) == len(module_ids) - 1


def test_a_modules_fixture_runs_under_its_first_tests_id(module_ids):
    _take_id(module_ids)


def test_a_later_test_runs_under_an_id_of_its_own(module_ids):
    _take_id(module_ids)
