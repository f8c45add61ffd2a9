"""The classification of finished probes: status, root cause, throughput error."""

from __future__ import annotations

import json
import os

import pytest
from torch.utils.data import DataLoader, Dataset

from ddp_profile.profiler.launch.ranks import LaunchOutcome
from ddp_profile.profiler.rank.process import error_record
from ddp_profile.profiler.settings import LoaderSettings, ProbePlan
from ddp_profile.profiler.sweep.probe import summarise_probe


def write_rank(directory, rank, records):
    with open(os.path.join(directory, f"rank-{rank}.jsonl"), "w") as handle:
        for record in records:
            handle.write(json.dumps({"rank": rank, **record}) + "\n")


def outcome(tmp_path, returncode=1, timed_out=False):
    return LaunchOutcome(returncode=returncode, timed_out=timed_out, interrupted=False,
                         wall_s=2.0, log_path=str(tmp_path / "launcher.log"))


def test_root_cause_is_the_failing_rank_not_its_disconnected_peer(tmp_path):
    plan = ProbePlan(probe_id="p001", out_dir=str(tmp_path), overrides=LoaderSettings(2))
    write_rank(tmp_path, 0, [{"kind": "error", "t_ns": 1, "exc_type": "RuntimeError",
                              "message": "Connection closed by peer [127.0.0.1]:1234",
                              "last_line": "RuntimeError: Connection closed by peer"}])
    write_rank(tmp_path, 1, [{"kind": "error", "t_ns": 2, "exc_type": "ValueError",
                              "message": "bad sample", "last_line": "ValueError: bad sample",
                              "causes": ["KeyError: 'label'"]}])
    entry = summarise_probe(plan, outcome(tmp_path), "sweep", 60).to_json()
    assert entry["status"] == "crash" and entry["root_cause_rank"] == 1
    assert "ValueError: bad sample" in entry["error"] and "KeyError" in entry["error"]


class _ResetDataset(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        raise ConnectionResetError(104, "Connection reset by peer")


def _raised(fn):
    with pytest.raises(Exception) as info:
        fn()
    return error_record(info.type, info.value)


def test_a_connection_the_ranks_own_loader_lost_is_a_cause_not_a_peers_symptom(tmp_path):
    # rank 0's loader lost a worker (ConnectionResetError raised inside torch.utils.data);
    # rank 1's collective lost rank 0, and said so first
    loader_error = _raised(lambda: next(iter(DataLoader(_ResetDataset()))))
    script_error = _raised(lambda: (_ for _ in ()).throw(ConnectionResetError("reset")))
    assert loader_error["origin"] == "data_loader" and script_error["origin"] is None
    write_rank(tmp_path, 0, [{**loader_error, "rank": 0, "t_ns": 2}])
    write_rank(tmp_path, 1, [{"kind": "error", "t_ns": 1, "exc_type": "RuntimeError",
                              "origin": "distributed",
                              "message": "[pair.cc:553] Connection reset by peer [127.0.0.1]:1",
                              "last_line": "RuntimeError: Connection reset by peer"}])
    plan = ProbePlan(probe_id="p006", out_dir=str(tmp_path))
    entry = summarise_probe(plan, outcome(tmp_path), "sweep", 60).to_json()
    assert entry["root_cause_rank"] == 0
    assert "ConnectionResetError" in entry["error"] and "DataLoader worker" in entry["error"]


def test_oom_and_timeout_are_told_apart_and_an_error_before_the_deadline_is_the_cause(
        tmp_path):
    plan = ProbePlan(probe_id="p002", out_dir=str(tmp_path))
    write_rank(tmp_path, 0, [{"kind": "error", "t_ns": 1, "exc_type": "OutOfMemoryError",
                              "message": "CUDA out of memory", "oom": True,
                              "last_line": "torch.OutOfMemoryError: CUDA out of memory"}])
    assert summarise_probe(plan, outcome(tmp_path), "sweep", 60).to_json()["status"] == "oom"
    # the launch ran out its time after rank 0 raised (its peers waited on it): the cause
    timed = summarise_probe(plan, outcome(tmp_path, None, True), "sweep", 60).to_json()
    assert timed["status"] == "oom" and "then ran out its 60 s" in timed["error"], timed
    quiet = tmp_path / "quiet"  # no rank raised: a timeout, the first rank to stop named
    quiet.mkdir()
    write_rank(quiet, 0, [{"kind": "context", "t_ns": 1}])
    write_rank(quiet, 1, [{"kind": "context", "t_ns": 1}])
    timed = summarise_probe(ProbePlan(probe_id="p002", out_dir=str(quiet)),
                            outcome(quiet, None, True), "sweep", 60).to_json()
    assert timed["status"] == "timeout" and "60 s" in timed["error"]
    write_rank(quiet, 1, [{"kind": "error", "t_ns": 2, "exc_type": "RuntimeError",
                           "message": "Connection closed by peer",
                           "last_line": "RuntimeError: Connection closed by peer"}])
    timed = summarise_probe(ProbePlan(probe_id="p002", out_dir=str(quiet)),
                            outcome(quiet, None, True), "sweep", 60).to_json()
    assert timed["status"] == "timeout"  # a symptom is no cause


def test_crash_without_records_reads_the_launcher_log(tmp_path):
    (tmp_path / "launcher.log").write_text(
        "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"t.py\"\n"
        "[rank1]: ZeroDivisionError: division by zero\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "  rank      : 1 (local_rank: 1)\n")
    plan = ProbePlan(probe_id="p003", out_dir=str(tmp_path))
    entry = summarise_probe(plan, outcome(tmp_path), "sweep", 60).to_json()
    assert entry["status"] == "crash" and entry["root_cause_rank"] == 1
    assert "ZeroDivisionError: division by zero" in entry["error"]


def test_a_loader_built_but_never_iterated_is_told_from_a_short_run(tmp_path):
    plan = ProbePlan(probe_id="p007", out_dir=str(tmp_path), warmup=5)
    write_rank(tmp_path, 0, [{"kind": "context", "t_ns": 1},
                             {"kind": "loader", "loader_id": 0, "t_ns": 2}])
    entry = summarise_probe(plan, outcome(tmp_path, returncode=0), "baseline", 60).to_json()
    assert (entry["status"], entry["reason"]) == ("crash", "no_dataloader")
    assert "without taking a batch" in entry["error"] and "--warmup" not in entry["error"]
    steps = [{"kind": "step", "loader_id": 0, "step": i, "t_ns": 10 + i, "wall_s": 0.01,
              "data_wait_s": 0.0, "measured": False} for i in range(3)]
    write_rank(tmp_path, 0, [{"kind": "context", "t_ns": 1},
                             {"kind": "loader", "loader_id": 0, "t_ns": 2}, *steps])
    short = summarise_probe(plan, outcome(tmp_path, returncode=0), "baseline", 60).to_json()
    assert short["reason"] == "too_few_steps" and "after 3 step(s)" in short["error"]


def test_bursty_but_steady_steps_give_a_small_throughput_error(tmp_path):
    plan = ProbePlan(probe_id="p004", out_dir=str(tmp_path), warmup=0)
    # a loader with workers: one long wait every 4 steps, the same pattern throughout
    pattern = [0.040, 0.002, 0.002, 0.002]
    records = [{"kind": "step", "loader_id": 0, "step": i, "measured": True, "t_ns": i,
                "data_wait_s": pattern[i % 4], "compute_s": 0.01, "other_s": 0.0, "samples": 8}
               for i in range(40)]
    write_rank(tmp_path, 0, [{"kind": "loader", "loader_id": 0, "applied": {}}, *records])
    entry = summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep", 60).to_json()
    assert entry["status"] == "ok"
    assert entry["step_time_cv"] > 0.5  # single steps vary a lot
    assert entry["throughput_rse"] < 0.01  # the throughput does not


def test_the_error_of_a_workers_loader_is_taken_over_whole_rounds(tmp_path):
    # 6 workers started together: 6 batches arrive at once, then the loop waits for the next
    # round, the same every round. Blocks of 6 steps all run at the same rate; blocks of 4
    # (5 blocks of these 20 steps) catch 1 or 2 waits and differ by 1.8x.
    pattern = [0.060, 0.002, 0.002, 0.002, 0.002, 0.002]
    records = [{"kind": "step", "loader_id": 0, "step": i, "measured": True, "t_ns": i,
                "data_wait_s": pattern[i % 6], "compute_s": 0.01, "other_s": 0.0,
                "samples": 8} for i in range(20)]
    write_rank(tmp_path, 0, [{"kind": "loader", "loader_id": 0,
                              "applied": {"num_workers": 6}}, *records])
    plan = ProbePlan(probe_id="p006", out_dir=str(tmp_path), warmup=0)
    entry = summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep", 60).to_json()
    assert entry["throughput_rse"] < 0.01
    write_rank(tmp_path, 0, [{"kind": "loader", "loader_id": 0,
                              "applied": {"num_workers": 2}}, *records])
    rse = summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep", 60).throughput_rse
    assert rse > 0.05  # what rounds cut in blocks look like


def _worker_costs(directory, rank, cpu_s_per_sample, n=12):
    os.makedirs(os.path.join(directory, "workers"), exist_ok=True)
    with open(os.path.join(directory, "workers", f"r{rank}-l0-w0-p1.jsonl"), "w") as handle:
        for i in range(n):
            handle.write(json.dumps({"kind": "batch_cost", "rank": rank, "loader_id": 0,
                                     "pid": 1, "t_ns": i, "samples": 8,
                                     "cpu_s": 8 * cpu_s_per_sample,
                                     "wall_s": 8 * cpu_s_per_sample}) + "\n")


def test_worker_cores_are_what_the_batches_cost_on_one_machine(tmp_path):
    """The one author of the busy worker cores: a public script's case (imagenet --dummy), 2
    ranks x 2 workers, 2 ms of CPU per sample at ~16 samples/s: busy on 0.03 cores."""
    plan = ProbePlan(probe_id="p007", out_dir=str(tmp_path), warmup=0)
    for rank in (0, 1):
        steps = [{"kind": "step", "loader_id": 0, "step": i, "measured": True, "t_ns": i,
                  "data_wait_s": 0.0, "compute_s": 1.0, "other_s": 0.0, "samples": 8}
                 for i in range(10)]
        write_rank(tmp_path, rank, [{"kind": "context", "hostname": "h"},
                                    {"kind": "loader", "loader_id": 0,
                                     "applied": {"num_workers": 2}}, *steps])
        _worker_costs(tmp_path, rank, 0.002)
    entry = summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep", 60).to_json()
    assert entry["throughput"] == 16.0 and entry["ranks_per_host"] == 2
    assert abs(entry["worker_cores"] - 0.032) < 0.002
    for rank in (0, 1):  # no workers: nothing busy, whatever the main process spends
        write_rank(tmp_path, rank, [{"kind": "loader", "loader_id": 0,
                                     "applied": {"num_workers": 0}}, *steps])
    assert summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep",
                           60).to_json()["worker_cores"] == 0.0


def test_pinning_per_sample_counts_the_measured_batches_of_the_training_loader(tmp_path):
    plan = ProbePlan(probe_id="p008", out_dir=str(tmp_path), warmup=0)
    steps = [{"kind": "step", "loader_id": 0, "step": i, "measured": i >= 2, "t_ns": 100 + i,
              "data_wait_s": 0.0, "compute_s": 0.01, "other_s": 0.0, "samples": 8}
             for i in range(10)]
    pins = [{"kind": "pin_cost", "loader_id": loader, "thread": "pin", "t_ns": t,
             "wall_s": wall, "cpu_s": wall / 2, "samples": 8}
            for loader, t, wall in ((0, 50, 9.0),  # before the measured steps: warm-up
                                    (0, 103, 0.004), (0, 104, 0.004), (1, 104, 5.0))]
    write_rank(tmp_path, 0, [{"kind": "loader", "loader_id": 0,
                              "applied": {"num_workers": 2}}, *steps, *pins])
    _worker_costs(tmp_path, 0, 0.001)
    loading = summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep",
                              60).to_json()["loading"]
    assert abs(loading["pin_per_sample_s"] - 0.0005) < 1e-9
    assert abs(loading["pin_cpu_per_sample_s"] - 0.00025) < 1e-9


def test_cpu_busy_is_the_share_of_the_available_cpus_busy_while_measured(tmp_path):
    # a 4-core affinity mask under a 2-CPU quota: 50 % of 4 cores busy is both CPUs
    plan = ProbePlan(probe_id="p009", out_dir=str(tmp_path), warmup=0)
    steps = [{"kind": "step", "loader_id": 0, "step": i, "measured": i >= 2, "t_ns": 100 * i,
              "data_wait_s": 0.0, "compute_s": 0.01, "other_s": 0.0, "samples": 8}
             for i in range(10)]
    samples = [{"kind": "sample", "source": "host", "t_ns": t, "cpu_percent": percent,
                "cpu_per_core": [percent] * 4}
               for t, percent in ((50, 5.0), (300, 45.0), (500, 50.0), (700, 55.0))]
    write_rank(tmp_path, 0, [{"kind": "context", "cpus_available": 2},
                             {"kind": "loader", "loader_id": 0, "applied": {}},
                             *steps, *samples])
    entry = summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep", 60).to_json()
    assert entry["cpu_busy"] == 1.0  # median 50 % x 4 cores = 2 of 2; the warm-up's 5 % not
    write_rank(tmp_path, 0, [{"kind": "context", "cpus_available": 4},
                             {"kind": "loader", "loader_id": 0, "applied": {}},
                             *steps, *samples])
    assert summarise_probe(plan, outcome(tmp_path, returncode=0), "sweep",
                           60).to_json()["cpu_busy"] == 0.5


def test_when_only_symptoms_were_recorded_the_log_names_the_cause(tmp_path):
    (tmp_path / "launcher.log").write_text(
        "[rank0]: RuntimeError: DataLoader worker (pid 123) is killed by signal: Killed.\n"
        "[rank1]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1\n")
    write_rank(tmp_path, 1, [{"kind": "error", "t_ns": 2, "exc_type": "RuntimeError",
                              "message": "Connection closed by peer [127.0.0.1]:1",
                              "last_line": "RuntimeError: Connection closed by peer"}])
    plan = ProbePlan(probe_id="p005", out_dir=str(tmp_path))
    entry = summarise_probe(plan, outcome(tmp_path), "sweep", 60).to_json()
    assert entry["root_cause_rank"] == 0 and "DataLoader worker" in entry["error"]


@pytest.mark.parametrize("message", [
    "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
    "RuntimeError: Distributed package doesn't have NCCL built in",
    "AssertionError: Torch not compiled with CUDA enabled"])
def test_a_cuda_only_script_on_a_machine_without_cuda_is_named(message):
    from ddp_profile.profiler.launch.failure import _needs_cuda
    from ddp_profile.profiler.store.probedir import RankData

    cpu = RankData(rank=0, context={"device": "cpu"})
    assert _needs_cuda({"message": message, "last_line": message}, [cpu])
    gpu = RankData(rank=0, context={"device": "cuda"})
    assert not _needs_cuda({"message": message, "last_line": message}, [gpu])
    assert not _needs_cuda({"message": "ValueError: bad shape", "last_line": ""}, [cpu])


def test_the_gpu_starved_share_is_the_part_of_each_gpu_gap_the_host_spent_waiting_for_data():
    """A step's GPU gap (CUDA events) lost to data is at most its host's data wait: a wait the
    GPU covered with queued work (gap 0) costs nothing; a gap longer than the wait (the host's
    own work after the GPU finished) is idle, not starved."""
    from ddp_profile.profiler.store.probedir import RankData
    from ddp_profile.profiler.sweep.probe import _gpu_idle

    def step(i, wait, compute, other=0.0):
        return {"loader_id": 0, "step": i, "measured": True, "data_wait_s": wait,
                "compute_s": compute, "other_s": other}

    hidden = RankData(rank=0, steps=[step(i, 0.010, 0.020) for i in range(4)],
                      gpu_steps={(0, i): {"gpu_busy_s": 0.030, "gpu_gap_s": 0.0}
                                 for i in range(4)})
    assert _gpu_idle([hidden]) == {"gpu_idle_fraction": 0.0, "gpu_starved_fraction": 0.0}
    mixed = RankData(rank=0, steps=[step(i, 0.010, 0.025, 0.005) for i in range(4)],
                     gpu_steps={(0, i): {"gpu_busy_s": 0.025, "gpu_gap_s": 0.015}
                                for i in range(4)})
    shares = _gpu_idle([mixed])
    assert shares["gpu_idle_fraction"] == pytest.approx(0.015 / 0.040)
    assert shares["gpu_starved_fraction"] == pytest.approx(0.010 / 0.040)
    cpu = RankData(rank=0, steps=[step(i, 0.010, 0.030) for i in range(4)])
    assert _gpu_idle([cpu]) == {"gpu_idle_fraction": None, "gpu_starved_fraction": None}


def test_a_gpu_gap_longer_than_the_host_time_around_it_is_cut_to_that_time():
    """A gap is bounded by the host's time between its two events (the previous step's time
    after its optimizer step, this step's wait): a 1.6 s gap across an epoch's validation and
    checkpoint (recorded so before the rank marked such gaps) is read as the step's 0.2 s."""
    from ddp_profile.profiler.store.probedir import RankData
    from ddp_profile.profiler.sweep.probe import _gpu_idle

    steps = [{"loader_id": 0, "step": i, "measured": True, "data_wait_s": 0.19,
              "compute_s": 0.01, "other_s": 0.0} for i in range(4)]
    gaps = [0.19, 0.19, 1.66, 0.19]
    data = RankData(rank=0, steps=steps, gpu_steps={
        (0, i): {"gpu_busy_s": 0.01, "gpu_gap_s": gap} for i, gap in enumerate(gaps)})
    shares = _gpu_idle([data])
    assert shares["gpu_idle_fraction"] == pytest.approx(0.95)
    assert shares["gpu_starved_fraction"] == pytest.approx(0.95)
