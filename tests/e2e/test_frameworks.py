"""Frameworks as real components: a PyTorch Lightning Trainer(strategy="ddp",
accelerator="cpu", devices=2) script and an HF accelerate script under torchrun, profiled
unchanged: measured steps on both ranks and no false finding.

Both frameworks come from the ``test`` extra (installed with ``-c constraints-cpu.txt`` so the
pinned torch stays); a test is skipped, saying so, only where its framework is not installed.
"""

from __future__ import annotations

import os

import pytest

from ddp_profile.profiler.store.results import load_run
from tests.conftest import SCRIPTS

pytestmark = pytest.mark.e2e

ONE_PROBE = ["--num-workers", "0", "--no-ceiling", "--no-comm", "--steps", "10", "--warmup", "2",
             "--no-report", "--quiet"]
FALSE_HERE = {"missing-distributed-sampler", "no-ddp", "worker-oversubscription",
              "thread-oversubscription", "straggler"}


def _measured_on_both_ranks(result, steps: int = 10) -> dict:
    """The summary, its baseline measured on both ranks (``steps`` steady steps each at least)
    and its communication timed by the framework's own reducer."""
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    base = summary["probes"][0]
    assert summary["world_size"] == 2 and base["status"] == "ok", base
    assert sorted(r["rank"] for r in base["per_rank"]) == [0, 1]
    assert all(r["steps"] >= steps for r in base["per_rank"]), base["per_rank"]
    # the framework's DDP is timed by its own reducer, matched step by step
    assert base["comm"]["timed_steps"] >= 1 and base["comm"]["backend"] == "gloo", base["comm"]
    assert base["comm"]["syncs_per_optimizer_step"] == 1.0
    return summary


def test_lightning_ddp_on_cpu(cli, run_dir):
    pytest.importorskip("pytorch_lightning", reason="the test extra installs pytorch-lightning")
    result = cli(["run", os.path.join(SCRIPTS, "lightning_train.py"), "--launcher", "none",
                  "--out", run_dir, *ONE_PROBE, "--steps", "40"], out=run_dir, timeout=300)
    summary = _measured_on_both_ranks(result)
    rules = {f["rule"] for f in summary["findings"]}
    assert not FALSE_HERE & rules, summary["findings"]
    # Lightning starts rank 1 as a child of rank 0, busy on a core of its own: with
    # num_workers=0 there is no worker, so no worker CPU
    run = load_run(run_dir)
    host = run.samples[(run.samples["source"] == "host") & (run.samples["rank"] == 0)]
    assert not host.empty and host["worker_count"].max() == 0, host["worker_count"].tolist()
    assert host["worker_cpu_percent"].max() < 5.0


def test_accelerate_under_torchrun_is_timed_as_its_loop_trains(cli, run_dir):
    """An accelerate script under torchrun: measured on both ranks, no false finding, the
    ranks' data checked (and different). Its prepared loader fetches a batch ahead: epochs of
    3 batches a rank (96 samples), each step at least 40 ms, so 2 ranks x 16 samples / 0.04 s
    is the most the loop can run; read as the loader hands out batches (one an epoch taken
    with no training) it read 1.5x that."""
    pytest.importorskip("accelerate", reason="the test extra installs accelerate")
    result = cli(["run", os.path.join(SCRIPTS, "accelerate_train.py"), "--out", run_dir,
                  *ONE_PROBE, "--", "--samples", "96", "--epochs", "12", "--step-sleep", "0.04"],
                 out=run_dir, timeout=300)
    # each epoch's first step (a fresh iterator) is charged once an epoch, not as a steady
    # step: of 3-batch epochs, 7 of the 10 are steady
    summary = _measured_on_both_ranks(result, steps=5)
    rules = {f["rule"] for f in summary["findings"]}
    assert not FALSE_HERE & rules, summary["findings"]
    run = load_run(run_dir)
    prints = run.events[run.events["name"] == "batch_fingerprint"]
    assert set(prints["rank"]) == {0, 1}  # the data was checked, and the ranks differ
    base = summary["probes"][0]
    bound = 2 * 16 / 0.04
    assert 0.6 * bound < base["throughput"] <= 1.02 * bound, base["throughput"]
