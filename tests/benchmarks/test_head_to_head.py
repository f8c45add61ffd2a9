"""The head-to-head benchmark's pure parts: the settings a workload runs with, and the
probe check's settings as given on its command line."""

from __future__ import annotations

import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import head_to_head  # noqa: E402


def test_a_workloads_own_settings_are_read_from_its_arguments():
    own = head_to_head.own_settings(list(head_to_head.WORKLOADS["deep_mlp"].args))
    assert own == {"num_workers": 2, "pin_memory": False, "prefetch_factor": None,
                   "batch_size": 64}
    # bench_train.py's defaults where a flag is absent; no prefetch without workers
    assert head_to_head.own_settings(["--prefetch-factor", "4"]) == {
        "num_workers": 0, "pin_memory": False, "prefetch_factor": None, "batch_size": 16}


def test_the_probe_checks_settings_launch_as_they_were_given():
    given = dict(head_to_head._setting(s) for s in ("num_workers=13", "prefetch_factor=4",
                                                     "pin_memory=true"))
    config = {**head_to_head.own_settings(["--load-ms", "3", "--batch-size", "8"]), **given}
    assert head_to_head.settings_args(config) == [
        "--num-workers", "13", "--batch-size", "8", "--prefetch-factor", "4", "--pin-memory"]
    assert head_to_head._setting("prefetch_factor=none") == ("prefetch_factor", None)
    with pytest.raises(argparse.ArgumentTypeError):
        head_to_head._setting("workers=2")
