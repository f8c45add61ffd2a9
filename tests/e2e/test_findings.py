"""Findings from real 2-rank runs: each rule fires from measurements, and only then."""

from __future__ import annotations

import os

import pytest

from tests.conftest import DEMO, SCRIPTS

pytestmark = pytest.mark.e2e

ONE_PROBE = ["--num-workers", "0", "--no-ceiling", "--no-comm", "--steps", "20", "--warmup", "3",
             "--no-report", "--quiet"]
DATA_RULES = {"data-loader-bound", "io-bound-loading", "cpu-bound-preprocessing",
              "persistent-workers", "pin-memory"}


def test_straggler_missing_sampler_and_checkpoints_are_found(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *ONE_PROBE, "--",
                  "--straggler-rank", "1", "--straggler-ms", "25", "--no-distributed-sampler",
                  "--checkpoint-every", "5", "--checkpoint-ms", "120"], out=run_dir)
    assert result.returncode == 0, result.stderr
    findings = {f["rule"]: f for f in result.summary()["findings"]}
    assert findings["straggler"]["ranks"] == [1]
    assert "rank 1" in findings["straggler"]["evidence"].lower()
    assert "missing-distributed-sampler" in findings
    assert "every 5 steps" in findings["frequent-io"]["evidence"], findings["frequent-io"]
    assert not DATA_RULES & set(findings)


def test_compute_bound_script_waits_little_for_data_and_gets_no_data_loading_advice(cli,
                                                                                     run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *ONE_PROBE, "--",
                  "--hidden", "1024", "--layers", "3", "--batch-size", "64"], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["probes"][0]["data_wait_fraction"] < 0.1
    assert summary["world_size"] == 2 and summary["device"] == "cpu"
    assert summary["gpu_available"] is False and summary["gpu_unavailable_reason"]
    rules = {f["rule"] for f in summary["findings"]}
    assert not DATA_RULES & rules, rules
    assert "straggler" not in rules and "frequent-io" not in rules
    assert summary["probes"][0]["comm"]["timed_steps"] >= 3  # its all-reduce is timed


def test_ranks_that_each_read_the_whole_dataset_are_found_though_their_batches_differ(
        cli, run_dir):
    """shuffle=True without a sampler, seeded by rank: the batches differ on every rank (the
    fingerprints prove nothing), but each rank's epoch covers all 2,048 samples of the same
    dataset."""
    result = cli(["run", os.path.join(SCRIPTS, "rank_seeded_shuffle_train.py"), "--out",
                  run_dir, *ONE_PROBE], out=run_dir)
    assert result.returncode == 0, result.stderr
    findings = {f["rule"]: f for f in result.summary()["findings"]}
    evidence = findings["missing-distributed-sampler"]["evidence"]
    assert "Each of the 2 ranks built the same dataset" in evidence and "2048" in evidence
    # an in-memory TensorDataset: whatever its loading costs, there is nothing to decode
    advice = " ".join(f["recommendation"] for f in findings.values())
    assert "decode_jpeg" not in advice and "DALI" not in advice, advice
