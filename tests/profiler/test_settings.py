"""A probe plan's modes as the harness writes them for the ranks and the ranks read them."""

from __future__ import annotations

import json

from ddp_profile.profiler.settings import Mode, ProbePlan


def test_a_plans_modes_travel_as_plain_strings_and_come_back_as_modes():
    plan = ProbePlan(probe_id="p", out_dir="/tmp/x", mode=Mode.SCREEN,
                     windows=({"overrides": {}, "mode": Mode.CEILING}, {"overrides": {}}))
    text = plan.to_json()
    data = json.loads(text)
    assert data["mode"] == "screen" and data["windows"][0]["mode"] == "ceiling"
    assert type(data["mode"]) is str  # what a rank of an older version reads too
    back = ProbePlan.from_json(text)
    assert back.mode is Mode.SCREEN
    assert back.window_mode(0) is Mode.CEILING and back.window_mode(1) is Mode.NORMAL
    assert back == plan
    assert ProbePlan.from_json(json.dumps({"probe_id": "p", "out_dir": "/tmp/x"})).mode \
        is Mode.NORMAL


def test_a_screens_windows_carry_their_threads_through_the_environment():
    """A window's ``threads`` (the threads check's B) comes back from the plan's JSON; a
    window without them runs the script's own (None), and a screen without any switches
    none."""
    windows = ({"overrides": {}}, {"overrides": {}, "threads": 2}, {"overrides": {}})
    plan = ProbePlan.from_json(ProbePlan(probe_id="s", out_dir="x", windows=windows).to_json())
    assert [plan.window_threads(i) for i in range(3)] == [None, 2, None]
    assert plan.switches_threads and plan.threads is None
    assert not ProbePlan(probe_id="s", out_dir="x", windows=windows[:1]).switches_threads
    assert ProbePlan(probe_id="p", out_dir="x").window_threads(0) is None  # no screen
