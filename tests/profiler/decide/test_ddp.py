"""Which DDP options the communication counterfactuals try, from the baseline's own DDP."""

from __future__ import annotations

import math
from typing import Optional

import pytest

from ddp_profile.profiler.decide.ddp import ddp_counterfactuals
from ddp_profile.profiler.store.probes import ProbeRecord


def baseline(comm: Optional[dict] = None) -> ProbeRecord:
    return ProbeRecord.from_json({"id": "p000", "kind": "baseline", "status": "ok",
                                  **({"comm": comm} if comm is not None else {})})


def test_four_times_the_bucket_cap_and_bucket_views_where_off():
    assert ddp_counterfactuals(baseline({"bucket_cap_bytes": 25 * 2 ** 20})) == [
        {"bucket_cap_mb": 100}, {"gradient_as_bucket_view": True}]
    assert ddp_counterfactuals(baseline()) == [{"bucket_cap_mb": 100},
                                               {"gradient_as_bucket_view": True}]
    assert ddp_counterfactuals(baseline({"bucket_cap_bytes": 50 * 2 ** 20,
                                         "gradient_as_bucket_view": True})) == [
        {"bucket_cap_mb": 200}]


def test_find_unused_parameters_off_only_where_none_was_unused():
    comm = {"find_unused_parameters": True, "unused_parameter_size": 0,
            "gradient_as_bucket_view": True}
    assert {"find_unused_parameters": False} in ddp_counterfactuals(baseline(comm))
    comm["unused_parameter_size"] = 4096  # some parameters really are unused
    assert {"find_unused_parameters": False} not in ddp_counterfactuals(baseline(comm))


def test_an_alternation_places_every_candidate_between_two_references():
    from ddp_profile.profiler.decide.paired import rounds

    assert rounds(1, 3) == [-1, 0, -1, 0, -1, 0, -1]
    assert rounds(2, 2) == [-1, 0, -1, 1, -1, 0, -1, 1, -1]


def test_the_fit_of_an_alternation_cancels_a_drifting_machine():
    """A machine 10 % faster each place: two options (1.2x and 0.9x) alternated with the
    reference, A B A C A B A C A, come out at their own speedups."""
    from ddp_profile.profiler.decide.paired import fit_alternation, rounds

    gains = {0: 1.2, 1: 0.9}
    rows = [(None if i < 0 else f"o{i}", float(place),
             100.0 * 1.1 ** place * (gains[i] if i >= 0 else 1.0))
            for place, i in enumerate(rounds(2, 2))]
    fit = fit_alternation(rows)
    assert fit is not None and fit.dof == 5
    assert fit.ratio("o0") == pytest.approx(1.2) and fit.ratio("o1") == pytest.approx(0.9)
    assert math.exp(fit.drift) == pytest.approx(1.1)
    assert fit.errors["o0"] == pytest.approx(0.0, abs=1e-9)


def test_an_alternation_without_room_for_its_noise_fits_nothing():
    from ddp_profile.profiler.decide.paired import fit_alternation

    # A B A: level, drift and gain fit it exactly, nothing is left to tell the noise
    assert fit_alternation([(None, 0.0, 100.0), ("b", 1.0, 150.0), (None, 2.0, 110.0)]) is None
    fit = fit_alternation([(None, 0.0, 100.0), ("b", 1.0, 150.0), (None, 2.0, 110.0),
                           ("b", 3.0, 160.0), (None, 4.0, 112.0)])
    assert fit is not None and fit.dof == 2
    assert fit_alternation([(None, 0.0, 100.0), ("b", 1.0, 150.0)]) is None
    assert fit_alternation([("b", 0.0, 100.0), ("b", 1.0, 150.0), ("b", 2.0, 1.0)]) is None
    assert fit_alternation([(None, 0.0, 100.0), ("b", 1.0, 0.0), (None, 2.0, 1.0)]) is None
