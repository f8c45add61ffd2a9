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
