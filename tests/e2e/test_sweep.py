"""Sweeps of real 2-rank torchrun jobs: search, ceiling, fault isolation, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ddp_profile.errors import ExitCode
from tests.conftest import (
    DEMO,
    ONE_RANK,
    ONE_THREAD,
    TEST_ID_VAR,
    _current_test_id,
    claim_groups,
    probe_processes,
)

pytestmark = pytest.mark.e2e
LEAN = ["--no-ceiling", "--no-comm", "--pairs", "0"]  # no compute-only, communication or
# claim-checking probes

QUICK = ["--steps", "20", "--warmup", "3", "--no-report", "--quiet"]
IO_BOUND = ["--", "--load-ms", "3", "--batch-size", "8"]


def test_io_bound_script_gets_more_workers(cli, run_dir):
    # the default (adaptive) search
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0,2",
                  "--prefetch-factor", "2", *QUICK, *IO_BOUND], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["baseline"]["num_workers"] == 0
    assert summary["recommended"]["num_workers"] == 2
    assert summary["expected_speedup"] > 1.3
    kinds = [p["kind"] for p in summary["probes"]]
    assert kinds[0] == "baseline"
    assert any(f["rule"] == "data-loader-bound" for f in summary["findings"])
    # the data-bound demo's small all-reduce is timed; one all-reduce a step, no batch norm
    assert summary["probes"][0]["comm"]["timed_steps"] >= 3
    rules = {f["rule"]: f for f in summary["findings"]}
    assert not {"allreduce-per-micro-batch", "per-step-collectives", "sync-batchnorm"} & set(rules)
    # its communication is a finding only on the direct evidence: the reducer's timers read
    # all-reduce that backward did not cover, and the steps without gradient synchronisation
    # ran faster beyond noise (a loaded machine slows gloo's all-reduce enough for both)
    if "exposed-communication" in rules:
        evidence = rules["exposed-communication"]["evidence"]
        assert summary["probes"][0]["comm"]["exposed_fraction"] >= 0.03
        low = float(evidence.split(" as fast as with it")[0].rsplit("[", 1)[1].split("-")[0])
        assert low > 1.0, evidence
    assert len(result.ledger()) == len(summary["probes"])
    # the ladder and the ceiling in one launch; no launch of its own to confirm the choice:
    # the check's windows measure it again, in a launch of their own (with prefetch and
    # pinning given, the second screen has no variant to ride there)
    assert "ceiling" in kinds
    loader = [p for p in summary["probes"] if p["kind"] not in ("ddp", "paired")]
    launches = {p.get("launch", p["id"]) for p in loader}
    assert len(launches) == 2 and all(p.get("screened") for p in loader[1:])
    chosen = [p for p in loader if p["config"] == summary["recommended"]]
    assert len({p["launch"] for p in chosen}) == 1
    # then the claim checked: the script's settings and the recommendation alternated in one
    # launch, A B A B A B A, and the speedup read from that alternation alone (then, where
    # another configuration measured faster in the search, that contender the same way)
    # (where the windows left the gain open, the same two again a launch each)
    paired, again, contender = claim_groups(summary)
    assert [p["pair"]["role"] for p in paired] == ["reference", "candidate"] * 3 + ["reference"]
    assert len({p["launch"] for p in paired}) == 1 and all(p["status"] == "ok" for p in paired)
    assert {p["config"]["num_workers"] for p in paired} == {0, 2}
    assert len(again) <= 1 and len(contender) <= 1
    assert all(p["status"] == "ok" for g in again + contender for p in g)
    low, high = summary["expected_speedup_interval"]
    assert low <= summary["expected_speedup"] <= high
    assert "alternated" in summary["recommendation"]["speedup_basis"]
    ceiling = summary["ceiling_throughput"]
    assert ceiling and all(p["score"] == pytest.approx(p["throughput"] / ceiling)
                           for p in summary["probes"] if p["status"] == "ok")


def test_a_hang_and_a_killed_worker_do_not_stop_the_sweep(cli, run_dir):
    # one launch each (grid): a rank that hangs is timed out, the sweep goes on to a launch
    # whose DataLoader worker is killed, found on its own rank (a rank that raises, in a
    # launch of its own: test_probe's step-3 crash; in a screen's window: the screen test)
    result = cli(["run", DEMO, "--out", run_dir, "--search", "grid", "--num-workers", "0,2,3",
                  "--prefetch-factor", "2", "--timeout", "15", *LEAN, *QUICK, "--",
                  "--hang-at-step", "4", "--hang-rank", "1", "--hang-workers", "2",
                  "--kill-worker-at-step", "4", "--kill-worker-workers", "3"], out=run_dir)
    assert result.returncode == 0, result.stderr
    by_workers = {p["requested"]["num_workers"]: p for p in result.ledger()
                  if p["kind"] == "sweep"}
    by_workers[0] = result.ledger()[0]
    assert by_workers[0]["status"] == "ok"
    assert by_workers[2]["status"] == "timeout"
    killed = by_workers[3]
    assert killed["status"] == "crash" and "DataLoader worker" in killed["error"]
    assert killed["root_cause_rank"] == 0
    assert result.summary()["recommended"]["num_workers"] == 0
    assert probe_processes() == []  # nothing of any probe is left (process tree, not exit codes)


def test_a_screen_records_a_crashed_window_and_relaunches_the_rest(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0,1,2,3",
                  "--prefetch-factor", "2", "--timeout", "40", *LEAN, *QUICK, "--",
                  "--load-ms", "3", "--batch-size", "8",
                  "--crash-at-step", "4", "--crash-rank", "1", "--crash-workers", "1",
                  "--kill-worker-at-step", "4", "--kill-worker-workers", "3"], out=run_dir)
    assert result.returncode == 0, result.stderr
    ledger = result.ledger()
    by_workers = {p["requested"]["num_workers"]: p for p in ledger[1:4]}
    assert by_workers[1]["status"] == "crash" and by_workers[1]["root_cause_rank"] == 1
    assert "injected failure" in by_workers[1]["error"]
    # the window after the crash measured in full (at least --steps; a fast window longer)
    assert by_workers[2]["status"] == "ok" and by_workers[2]["steps_measured"] >= 20
    assert by_workers[2]["short"] is False
    assert by_workers[3]["status"] == "crash" and "DataLoader worker" in by_workers[3]["error"]
    # 1 crashed its launch; 2 and 3 shared the next one
    assert by_workers[1]["launch"] != by_workers[2]["launch"] == by_workers[3]["launch"]
    assert result.summary()["recommended"]["num_workers"] == 2
    assert probe_processes() == []


def test_a_short_script_is_measured_in_every_window_its_run_can_hold(cli, run_dir):
    """The script runs 20 steps (160 samples, 1 rank, batch 8, one epoch); workers at
    prefetch 8 drain 8, 16 and 24 prefetched batches. Before: the first screen's second window
    began 2 steps before the script ended and was recorded as a crash ("ended after 2 steps,
    before the 16 warm-up steps"), and 3 workers, launched alone, crashed the same way after
    all 20 steps (24 warm-up). Now a window the script ended in its warm-up starts the next
    launch, and once a launch ran the script to its end, a warm-up leaves half the run to
    measure: 14 steps at most of 20 here, 6 measured (``settings.warmup_room``)."""
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0,1,2,3",
                  "--prefetch-factor", "8", "--steps", "6", "--warmup", "2", *LEAN,
                  *ONE_RANK, "--no-report", "--quiet", "--", "--samples", "160", "--epochs",
                  "1", "--batch-size", "8", "--load-ms", "2"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    ledger = result.ledger()
    assert [p["status"] for p in ledger] == ["ok"] * len(ledger), ledger
    measured = {p["requested"]["num_workers"] for p in ledger if p["kind"] == "sweep"}
    assert measured == {1, 2, 3}
    ran_to_end = [p for p in ledger if p["script_samples"] == 160]
    assert ran_to_end  # a launch ran the script to its end: 20 steps
    after = [p for p in ledger[ledger.index(ran_to_end[0]) + 1:] if p["kind"] == "sweep"]
    assert after and all(p["warmup"] <= 14 for p in after), after
    three = [p for p in ledger if p["requested"]["num_workers"] == 3]
    assert three and all(p["steps_measured"] >= 6 for p in three), three  # 24 batches' drain


def test_oom_at_a_batch_size_skips_larger_ones(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, "--search", "grid", "--num-workers", "0",
                  "--batch-size", "8,16,32", *LEAN, *QUICK, *ONE_RANK, "--",
                  "--batch-size", "8", "--oom-above-batch", "8"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    ledger = result.ledger()
    batches = [p["requested"]["batch_size"] for p in ledger if p["kind"] == "sweep"]
    assert batches == [16]  # 8 is the baseline; 16 runs out of memory; 32 is never launched
    assert ledger[-1]["status"] == "oom"
    assert "allocate" in ledger[-1]["error"]


def test_repeat_launches_exactly_the_recommended_configuration(cli, run_dir):
    # compute-bound: the loop sleeps 40 ms a step and hardly waits for data, so workers cannot
    # win clearly and the recommendation (and with it the repeats) moves to the larger batch,
    # not the baseline's settings (one larger batch: each is a launch of its own)
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0,1", "--prefetch-factor", "2",
                  "--batch-size", "8,16", *LEAN, "--repeat", "2", *QUICK, *ONE_RANK, "--",
                  "--batch-size", "8", "--hidden", "32", "--layers", "1",
                  "--step-sleep-ms", "40"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["probes"][0]["data_wait_fraction"] < 0.2  # compute-bound indeed
    recommended = summary["recommended"]
    assert recommended["batch_size"] == 16, recommended  # not the baseline's 8
    chosen = next(p for p in summary["probes"] if p["id"] == summary["recommended_probe"])
    assert chosen["config"] == recommended
    repeats = [p for p in summary["probes"] if p["kind"] == "repeat"]
    assert repeats and all(p["config"] == recommended for p in repeats)
    launches = [p for p in summary["probes"] if p["status"] == "ok"
                and p["kind"] != "ceiling" and p["config"] == recommended]
    assert len(launches) == 2


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, **ONE_THREAD, **{TEST_ID_VAR: _current_test_id[0]})
    # A suite started in the background by a non-interactive shell (`pytest &`) inherits
    # SIGINT ignored, and Python then keeps it ignored: give the harness the default action,
    # as a terminal's foreground job has.
    return subprocess.Popen([sys.executable, "-m", "ddp_profile", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_ledger(run_dir: str, lines: int, timeout: float = 120) -> None:
    path = os.path.join(run_dir, "ledger.jsonl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and sum(1 for _ in open(path)) >= lines:
            return
        time.sleep(0.2)
    raise AssertionError(f"ledger never reached {lines} line(s)")


def _wait_until_gone(timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_hangup_is_ignored_and_a_sigkilled_sweep_resumes_without_losing_a_probe(cli, run_dir):
    args = ["run", DEMO, "--out", run_dir, "--search", "grid", "--num-workers", "0,1",
            "--prefetch-factor", "2", *LEAN, *QUICK, *ONE_RANK, *IO_BOUND]
    proc = _start(args)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(run_dir, "run.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGHUP)  # the terminal closed: the sweep goes on
    _wait_for_ledger(run_dir, 1)
    time.sleep(1.5)  # the second probe is in flight
    assert proc.poll() is None, proc.communicate()[1]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_until_gone()
    assert probe_processes() == []  # the probe's ranks end themselves without the harness
    first = open(os.path.join(run_dir, "ledger.jsonl")).read()
    result = cli(["run", DEMO, "--out", run_dir, "--resume", "--quiet"], out=run_dir)
    assert result.returncode == 0, result.stderr
    ledger = result.ledger()
    assert open(os.path.join(run_dir, "ledger.jsonl")).read().startswith(first)
    ids = [p["id"] for p in ledger]
    assert ids == [f"p{i:03d}" for i in range(len(ids))]  # no probe lost, none recorded twice
    measured = [(p["kind"], json.dumps(p["requested"]), p["steps"]) for p in ledger]
    assert len(measured) == len(set(measured))  # none re-run (a longer re-measure is new)
    assert {p["requested"]["num_workers"] for p in ledger} == {None, 1}
    assert result.summary()["state"] == "complete"


def test_ctrl_c_stops_cleanly_and_leaves_a_resumable_run(cli, run_dir):
    args = ["run", DEMO, "--out", run_dir, "--num-workers", "0,2", *LEAN, *QUICK, *ONE_RANK,
            *IO_BOUND]
    proc = _start(args)
    _wait_for_ledger(run_dir, 1)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert "--resume" in err
    assert probe_processes() == []
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert summary["state"] == "interrupted" and summary["probes"][0]["status"] == "ok"
    assert os.path.exists(os.path.join(run_dir, "run.json"))
