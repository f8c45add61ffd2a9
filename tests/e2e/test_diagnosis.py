"""Diagnoses from direct evidence on real 2-rank runs (issue 16): each cause found, and only
when it is there."""

from __future__ import annotations

import os

import pytest

from ddp_profile.reports.console import summary_lines
from tests.conftest import DEMO, ONE_THREAD, SCRIPTS

pytestmark = pytest.mark.e2e
LEAN = ["--no-ceiling", "--no-comm"]  # no compute-only or communication probes

ONE_PROBE = ["--num-workers", "0", *LEAN, "--steps", "10", "--warmup", "2",
             "--no-report", "--quiet"]
BATCHES = os.path.join(SCRIPTS, "batch_sampler_train.py")


def _findings(result) -> dict:
    assert result.returncode == 0, result.stderr
    return {f["rule"]: f for f in result.summary()["findings"]}


def test_process_group_without_ddp_is_found(cli, run_dir):
    findings = _findings(cli(["run", DEMO, "--out", run_dir, *ONE_PROBE, "--", "--no-ddp"],
                             out=run_dir))
    assert findings["no-ddp"]["severity"] == "high"
    assert "missing-distributed-sampler" not in findings  # it shards with DistributedSampler


def test_ddp_script_gets_neither_no_ddp_nor_sampler_finding(cli, run_dir):
    findings = _findings(cli(["run", DEMO, "--out", run_dir, *ONE_PROBE], out=run_dir))
    assert not {"no-ddp", "missing-distributed-sampler"} & set(findings), findings


def test_batch_sampler_that_shards_by_rank_is_not_flagged(cli, run_dir):
    findings = _findings(cli(["run", BATCHES, "--out", run_dir, *ONE_PROBE, "--", "--shard"],
                             out=run_dir))
    assert "missing-distributed-sampler" not in findings, findings


def test_batch_sampler_that_does_not_shard_is_flagged_from_the_data(cli, run_dir):
    findings = _findings(cli(["run", BATCHES, "--out", run_dir, *ONE_PROBE], out=run_dir))
    finding = findings["missing-distributed-sampler"]
    assert finding["ranks"] == [0, 1] and "RankBatches" in finding["evidence"]


def test_one_rank_with_launcher_none_is_counted_as_one(cli, run_dir):
    """The script starts one rank itself: evidence and sizing use 1 rank, not the default 2.
    Its workers spend 1 ms of CPU per sample, so they are busy and do compete."""
    cpus = len(os.sched_getaffinity(0))
    workers = cpus + 1  # oversubscribed by one rank alone
    result = cli(["run", DEMO, "--launcher", "none", "--out", run_dir,
                  "--num-workers", str(workers), *LEAN, "--steps", "6", "--warmup", "2",
                  "--pairs", "0",  # the ranks counted are the subject, not a claim's check
                  "--no-report", "--quiet", "--", "--num-workers", str(workers), "--cpu-ms", "1"],
                 out=run_dir, env=ONE_THREAD)  # one intra-op thread: no threads counterfactual
    findings = _findings(result)
    summary = result.summary()
    assert summary["world_size"] == 1 and summary["ranks_per_host"] == 1
    evidence = findings["worker-oversubscription"]["evidence"]
    assert f"1 rank(s) per machine x num_workers={workers}" in evidence, evidence


def test_script_that_ends_early_is_marked_short(cli, run_dir):
    """96 samples, 2 ranks, batch 16, one epoch: 3 steps a rank, 10 asked.

    ``--no-ddp``: a DDP model freed as the script returns can deadlock torch's gloo teardown
    (the main thread joins gloo's run loop while holding the GIL, the run loop waits for the GIL
    to free a finished all-reduce): a race in torch that hung this test twice under load."""
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0", *LEAN,
                  "--steps", "10", "--warmup", "1", "--no-report", "--",
                  "--samples", "96", "--epochs", "1", "--batch-size", "16", "--no-ddp"],
                 out=run_dir)
    assert result.returncode == 0, result.stderr
    probe = result.summary()["probes"][0]
    assert probe["status"] == "ok" and probe["short"] is True and probe["steps_measured"] == 2
    assert "ended after 2 measured step(s) of the 10 asked" in probe["short_reason"]
    assert "short: 2 of 10 steps, the script ended first" in result.progress  # the progress line
    assert f"ran short, the script ended first: {probe['id']} (2 of 10 steps)" \
        in result.stdout  # the summary's one warning line
    # the launch ran the script to its end: its whole run, 96 samples, timed from the first
    # batch to the end of the script (one epoch of 3 steps; within the launch's own wall time)
    assert probe["script_samples"] == 96
    assert 0 < probe["script_run_s"] < probe["wall_s"]


def test_in_place_ranks_with_default_threads_get_a_measured_counterfactual(cli, run_dir):
    """mp.spawn ranks (no OMP_NUM_THREADS) size torch's pool to the machine: the sweep
    alternates the script's own settings with its own threads (A) and with threads that fit
    (B) in windows of one launch, A B A B A B A, every rank switching its threads at each
    window's first step; the finding is the figure of that alternation.

    ``--pairs 1``: where the windows leave the gain open, no launches follow (A B A leaves no
    room for its noise). The script's own threads oversubscribe the CPUs, so beside other work
    its A windows ran at 89 to 1,930 samples/s, and a gain left open was alternated again in
    5 to 9 launches of their own: the test took 35-118 s in ``make test``'s concurrent pass,
    17-37 s in its 2 launches. Windows then launches: test_adaptive's
    ``test_windows_that_leave_the_threads_gain_open_are_followed_by_launches``."""
    cpus = len(os.sched_getaffinity(0))
    # 6 steps and 1 of warm-up: the script's own threads run its steps 3-13x slower
    short = [*ONE_PROBE[:ONE_PROBE.index("--steps")], "--steps", "6", "--warmup", "1",
             *ONE_PROBE[ONE_PROBE.index("--warmup") + 2:]]
    result = cli(["run", os.path.join(SCRIPTS, "spawn_heavy_train.py"), "--launcher", "none",
                  "--out", run_dir, *short, "--pairs", "1", "--", "29751"], out=run_dir)
    findings = _findings(result)
    probes = result.summary()["probes"]
    base = probes[0]
    if base["intra_op_threads"] * 2 <= cpus:
        pytest.skip(f"torch starts {base['intra_op_threads']} thread(s) on {cpus} CPUs: the "
                    "2 ranks do not oversubscribe them here")
    fit = max(1, cpus // 2)
    threads = [p for p in probes if p["kind"] == "threads"]
    assert all(p.get("pair") for p in threads)  # no launch of the threads that fit alone
    windows = [p for p in threads if p.get("screened")]
    # A B A B A B A in windows of one launch, and nothing after them
    assert len(windows) == 7 == len(threads) and len({p["launch"] for p in windows}) == 1
    assert len({p["pair"]["group"] for p in windows}) == 1
    assert [(p["threads"], p["pair"]["role"]) for p in windows] == [
        (None, "reference"), (fit, "candidate")] * 3 + [(None, "reference")]
    assert all(p["status"] == "ok" for p in windows)
    assert [p["intra_op_threads"] for p in windows] == \
        [base["intra_op_threads"], fit] * 3 + [base["intra_op_threads"]]
    rates = [p["throughput"] for p in windows]
    # the fit's figure lies between the slowest B over the fastest A and the reverse
    within = (min(rates[1::2]) / max(rates[0::2]), max(rates[1::2]) / min(rates[0::2]))
    if "thread-oversubscription" in findings:
        finding = findings["thread-oversubscription"]
        ids = f"probes {windows[0]['id']}-{windows[-1]['id']}"
        assert f"alternated A B A B A B A in windows of one launch ({ids})" \
            in finding["evidence"]
        ratio = float(finding["evidence"].split(" per rank the script ran ")[1].split("x")[0])
        assert within[0] * 0.99 <= ratio <= within[1] * 1.01, (ratio, within)
        assert "torch.set_num_threads" in finding["recommendation"]
        # the recommendation carries the finding's own reading where it stands as measured
        change = result.summary()["recommendation"]["threads"]
        if finding["severity"] == "low":
            assert change is None
        else:
            assert change["threads"] == fit and change["probes"] == [p["id"] for p in windows]
            assert f"{change['speedup']:.2f}x" in finding["evidence"]
            console = summary_lines(result.summary(), run_dir)  # (the run was --quiet)
            assert f"(OMP_NUM_THREADS={fit}): {change['speedup']:.2f}x as fast" in console[1]
    # the counterfactuals never compete with the DataLoader settings
    assert result.summary()["recommended_probe"] not in {p["id"] for p in threads}
