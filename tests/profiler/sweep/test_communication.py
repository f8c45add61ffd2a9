"""Which DDP options the communication counterfactuals try, from the baseline's own DDP."""

from __future__ import annotations

from ddp_profile.profiler.sweep.communication import ddp_counterfactuals


def test_four_times_the_bucket_cap_and_bucket_views_where_off():
    assert ddp_counterfactuals({"comm": {"bucket_cap_bytes": 25 * 2 ** 20}}) == [
        {"bucket_cap_mb": 100}, {"gradient_as_bucket_view": True}]
    assert ddp_counterfactuals({}) == [{"bucket_cap_mb": 100}, {"gradient_as_bucket_view": True}]
    assert ddp_counterfactuals({"comm": {"bucket_cap_bytes": 50 * 2 ** 20,
                                         "gradient_as_bucket_view": True}}) == [
        {"bucket_cap_mb": 200}]


def test_find_unused_parameters_off_only_where_none_was_unused():
    base = {"comm": {"find_unused_parameters": True, "unused_parameter_size": 0,
                     "gradient_as_bucket_view": True}}
    assert {"find_unused_parameters": False} in ddp_counterfactuals(base)
    base["comm"]["unused_parameter_size"] = 4096  # some parameters really are unused
    assert {"find_unused_parameters": False} not in ddp_counterfactuals(base)
