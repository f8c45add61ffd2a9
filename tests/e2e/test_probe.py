"""One probe of a real 2-rank torchrun job (gloo on CPU): what is measured, and bad input."""

from __future__ import annotations

import os

import pytest

from ddp_profile.errors import ExitCode
from ddp_profile.profiler.store.results import load_run
from tests.conftest import DEMO, ONE_RANK, ONE_THREAD, SCRIPTS

pytestmark = pytest.mark.e2e

FAST = ["--steps", "25", "--warmup", "3", "--no-ceiling", "--no-comm", "--pairs", "0",
        "--no-report", "--quiet"]
OWN = ["--num-workers", "0"]  # the scripts' own setting: the baseline is the only launch


def test_sleeping_dataset_data_wait_matches_the_sleep(cli, run_dir):
    # 8 samples x 4 ms asleep per batch with no workers: each step waits >= 32 ms for data
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0", *FAST, "--",
                  "--load-ms", "4", "--batch-size", "8"], out=run_dir)
    assert result.returncode == 0, result.stderr
    run = load_run(run_dir)
    steps = run.steps[run.steps.measured & (run.steps.probe_id == "p000")]
    assert set(steps["rank"]) == {0, 1}
    assert steps.groupby("rank").size().tolist() == [25, 25]  # every rank stops at one step
    implied_wait = 8 * 0.004
    median_wait = float(steps["data_wait_s"].median())
    assert implied_wait <= median_wait <= implied_wait * 1.3 + 0.003, median_wait
    # the share the sleep implies, given the compute and other time measured around it
    implied_share = implied_wait / (implied_wait + float((steps.compute_s + steps.other_s).mean()))
    measured_share = result.summary()["probes"][0]["data_wait_fraction"]
    assert abs(measured_share - implied_share) < 0.05, (measured_share, implied_share)
    assert (steps["samples"] == 8).all()
    assert (steps["compute_s"] > 0).all()


def test_batch_sampler_script_honours_batch_size_and_records_context(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, "--batch-size", "24", "--num-workers", "1",
                  "--prefetch-factor", "3", *FAST, "--", "--batch-sampler", "--batch-size", "8",
                  "--persistent-workers", "--num-workers", "2"], out=run_dir)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["baseline"] == {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2,
                                   "batch_size": 8}
    measured = next(p for p in summary["probes"] if p["kind"] == "sweep")
    assert measured["config"] == {"num_workers": 1, "pin_memory": False, "prefetch_factor": 3,
                                  "batch_size": 24}
    run = load_run(run_dir)
    steps = run.steps[(run.steps.probe_id == measured["id"]) & run.steps.measured]
    assert (steps["samples"] == 24).all()
    context = run.contexts[(measured["id"], 0)]
    assert context["loader"]["batch_sampler"] == "BatchSampler"
    assert context["loader"]["sampler"] == "DistributedSampler"
    assert context["loader"]["persistent_workers"] is True
    assert context["backend"] == "gloo" and context["world_size"] == 2
    assert context["torch_version"] and context["cpu_count"] >= 1
    assert "--batch-sampler" in context["argv"]


def test_prefetch_without_workers_is_not_applied_and_recorded(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "0", "--prefetch-factor", "4",
                  *FAST, *ONE_RANK, "--", "--num-workers", "2"], out=run_dir,
                 env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    probe = next(p for p in result.summary()["probes"] if p["kind"] == "sweep")
    assert probe["config"]["num_workers"] == 0 and probe["config"]["prefetch_factor"] is None
    assert probe["skipped_overrides"][0]["setting"] == "prefetch_factor"


def test_script_without_optimizer_still_gets_data_and_compute(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *FAST, *OWN, *ONE_RANK, "--", "--no-optimizer",
                  "--load-ms", "1"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    steps = load_run(run_dir).steps
    assert (steps["data_wait_s"] > 0).all() and (steps["compute_s"] > 0).all()
    assert (steps["other_s"] == 0).all()


def test_validation_loader_is_not_the_training_loader(cli, run_dir):
    # 128 samples / 1 rank / batch 16 = 8 batches an epoch, then a validation pass
    result = cli(["run", DEMO, "--out", run_dir, *FAST, *OWN, *ONE_RANK, "--", "--validate",
                  "--samples", "128", "--no-set-epoch"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    run = load_run(run_dir)
    assert run.steps["loader_id"].unique().tolist() == [0]
    iters = run.loader_iters[run.loader_iters.loader_id == 0]
    assert iters["iter_index"].max() >= 1  # several epochs of the training loader
    assert (run.loader_iters.loader_id == 1).any()  # the validation loader ran too
    assert "missing-set-epoch" in {f["rule"] for f in run.summary["findings"]}


def test_script_arguments_after_double_dash_reach_the_script(cli, run_dir):
    result = cli(["run", os.path.join(SCRIPTS, "argparse_train.py"), "--out", run_dir, *FAST,
                  *OWN, *ONE_RANK, "--", "--lr", "0.5", "--tag", "hello world"], out=run_dir,
                 env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    run = load_run(run_dir)
    argv = run.contexts[(run.summary["probes"][0]["id"], 0)]["argv"]
    assert argv[1:] == ["--lr", "0.5", "--tag", "hello world"]


# ---- bad input -------------------------------------------------------------------------------

def test_missing_script(cli, tmp_path):
    result = cli(["run", str(tmp_path / "nope.py"), "--quiet"])
    assert result.returncode == ExitCode.SCRIPT_NOT_FOUND
    assert result.stderr.strip().count("\n") == 0 and "not found" in result.stderr


def test_syntax_error(cli, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def f(:\n    pass\n")
    result = cli(["run", str(script), "--quiet"])
    assert result.returncode == ExitCode.SCRIPT_INVALID
    assert "SyntaxError" in result.stderr and result.stderr.strip().count("\n") == 0


def test_script_that_raises_at_step_3(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *FAST, "--", "--crash-at-step", "3",
                  "--crash-rank", "1"], out=run_dir)
    assert result.returncode == ExitCode.SCRIPT_FAILED
    assert result.stderr.strip().count("\n") == 0
    probe = result.summary()["probes"][0]
    assert probe["status"] == "crash" and probe["root_cause_rank"] == 1
    assert "injected failure at step 3 on rank 1" in probe["error"]
    run = load_run(run_dir)  # the run directory stays readable
    assert len(run.steps[run.steps["rank"] == 1]) == 3


def test_script_that_never_builds_a_dataloader(cli, run_dir):
    result = cli(["run", DEMO, "--out", run_dir, *FAST, *ONE_RANK, "--", "--no-dataloader"],
                 out=run_dir, env=ONE_THREAD)
    assert result.returncode == ExitCode.NO_DATALOADER
    assert "DataLoader" in result.stderr
    assert result.summary()["probes"][0]["reason"] == "no_dataloader"


@pytest.mark.parametrize("args, fragment", [
    (["--num-workers", "-1"], "--num-workers"),
    (["--num-workers", "two"], "not an integer"),
    (["--batch-size", "0"], "--batch-size"),
    (["--pin-memory", "maybe"], "--pin-memory"),
    (["--bogus"], "No such option"),
    (["--search", "random"], "--search"),
    (["--repeat", "0"], "--repeat"),
])
def test_invalid_cli_values_exit_2_with_one_line(cli, args, fragment):
    result = cli(["run", DEMO, *args])
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert fragment in result.stderr and result.stderr.strip().count("\n") == 0


def test_corrupt_run_directory(cli, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    result = cli(["report", str(bad)])
    assert result.returncode == ExitCode.BAD_RUN_DIR
    assert result.stderr.strip().count("\n") == 0


def test_importing_the_package_changes_nothing():
    import subprocess
    import sys

    code = ("import torch.utils.data as d; before = d.DataLoader.__init__; "
            "import ddp_profile, ddp_profile.cli, ddp_profile.profiler.rank.hook as h; "
            "assert h.activate() is False; assert d.DataLoader.__init__ is before; print('ok')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDP_PROFILE")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_workers_restarted_every_short_epoch_are_measured_as_the_epochs_run(cli, run_dir):
    # 160 samples per rank in batches of 8: 20-step epochs, each starting 2 workers again
    result = cli(["run", DEMO, "--out", run_dir, "--num-workers", "2", "--steps", "40",
                  "--warmup", "3", "--no-ceiling", "--no-comm", "--pairs", "0", "--no-report",
                  "--quiet", "--", "--num-workers", "2", "--samples", "320", "--batch-size", "8",
                  "--load-ms", "2"], out=run_dir)
    assert result.returncode == 0, result.stderr
    probe = result.summary()["probes"][0]
    assert probe["epoch_steps"] == 20 and probe["epoch_restart_s"] > 0
    assert probe["steady_throughput"] > probe["throughput"]
    # the truth from the records: the second epoch, start to start, restart and all
    run = load_run(run_dir)
    steps = run.steps[run.steps.probe_id == probe["id"]]
    rates = []
    for _, rank in steps.groupby("rank"):
        starts = rank.set_index("step")["t_s"]
        rates.append(20 * 8 / (starts[40] - starts[20]))
    truth = sum(rates)
    assert 0.75 * truth <= probe["throughput"] <= 1.25 * truth, (probe["throughput"], truth)
    # a window that happened to hold no restart would have read far above it
    assert probe["steady_throughput"] > 1.2 * truth
