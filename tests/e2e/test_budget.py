"""A run's budget on the real CLI: the plan before the first probe, no launch past the budget,
the answer so far with what was not done, and ``--resume`` going on past it."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import DEMO, ONE_RANK, ONE_THREAD, probe_processes

pytestmark = pytest.mark.e2e
QUICK = ["--num-workers", "0,2", "--steps", "20", "--warmup", "3", "--no-report", "--no-comm",
         "--no-ceiling", "--pairs", "0"]  # the search alone, of one rung: the baseline, a
# screen of 2 workers, its confirmation (the climb is test_loading's)
IO_BOUND = ["--", "--load-ms", "3", "--batch-size", "8"]
BUDGET_S = 20  # of which 10 are kept for the analysis (state.FINISH_RESERVE_S): room for the
# baseline and at most the screen after it, never for the whole search


def test_a_budget_stops_between_probes_and_resume_goes_on_past_it(cli, run_dir):
    begun = time.monotonic()
    first = cli(["run", DEMO, "--out", run_dir, "--budget", f"{BUDGET_S}s", *QUICK, *ONE_RANK,
                 *IO_BOUND], out=run_dir, env=ONE_THREAD)
    wall = time.monotonic() - begun
    assert first.returncode == 0, first.stderr
    assert probe_processes() == []
    assert "plan: about" in first.stderr and "estimate: about" in first.stderr
    summary = first.summary()
    assert summary["state"] == "budget_spent"
    stop = summary["search"]["budget"]["stopped"]
    assert stop["not_done"] and stop["launch"], stop  # what it did not do, named
    assert summary["search"]["budget"]["budget_s"] == BUDGET_S
    assert summary["recommended"] is not None  # the best-evidenced answer so far
    assert "budget spent" in first.stderr and "not done:" in first.stdout
    # the launches fit the budget: the CLI's own start-up, the baseline's measurement (never
    # refused) and the analysis come on top, within a launch's length
    launch_s = max(p.get("wall_s") or 0.0 for p in summary["probes"])
    assert wall < BUDGET_S + launch_s + 15, (wall, launch_s)
    kept = open(os.path.join(run_dir, "ledger.jsonl")).read()

    resumed = cli(["run", DEMO, "--out", run_dir, "--resume", "--quiet"], out=run_dir,
                  env=ONE_THREAD)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.summary()["state"] == "complete"
    assert "budget" not in resumed.summary()["search"]  # resumed without one: no stop
    assert open(os.path.join(run_dir, "ledger.jsonl")).read().startswith(kept)
    ids = [p["id"] for p in resumed.ledger()]
    assert ids == [f"p{i:03d}" for i in range(len(ids))]  # none lost, none recorded twice
    assert len(ids) > len(summary["probes"])  # it went on past the budget's stop


def test_a_bad_budget_is_a_usage_error(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, "--budget", "soon"], out=run_dir)
    assert result.returncode == 2 and "--budget:" in result.stderr, result.stderr
    assert not os.path.exists(run_dir)
