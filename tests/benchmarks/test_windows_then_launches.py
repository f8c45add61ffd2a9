"""The model of a check in windows followed by launches: it reads the project's own fit, so a
change there that let equal settings be claimed faster, or lost real gains, shows here."""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import windows_then_launches as model  # noqa: E402

ARGS = argparse.Namespace(trials=800, window_noise=0.03, window_walk=0.04, between=0.05,
                          noise=0.05, walk=0.04, seed=1)


def test_equal_settings_are_rarely_claimed_and_a_real_gain_mostly_found():
    equal = model.shares(0.0, ARGS)
    assert equal["windows alone"] <= equal["with the follow-up"] <= 0.05
    assert 0.3 < equal["open"] < 0.7  # only windows that read a gain are followed
    real = model.shares(math.log(1.2), ARGS)
    assert real["with the follow-up"] >= 0.95 > real["windows alone"]
