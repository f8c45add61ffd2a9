"""Every way users start DDP, 2 ranks each on CPU: torchrun, mp.spawn, the legacy launcher's
--local_rank, a simulated SLURM allocation, and two "nodes" joined by a c10d rendezvous."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import pytest

from ddp_profile.errors import ExitCode
from ddp_profile.profiler.allocation import detect
from tests.conftest import (
    DEMO,
    ONE_THREAD,
    REPO,
    SCRIPTS,
    TEST_ID_VAR,
    _current_test_id,
    probe_processes,
)

pytestmark = pytest.mark.e2e

ONE_PROBE = ["--num-workers", "0", "--no-ceiling", "--no-comm", "--steps", "20", "--warmup", "2",
             "--no-report", "--quiet"]


def free_port_pair() -> int:
    """A port P such that P and P + 1 are free (rendezvous / master, and the coordinator)."""
    for _ in range(100):
        port = random.randint(20000, 40000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def _summary(path: str) -> dict:
    with open(os.path.join(path, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_mp_spawn_script_with_launcher_none(cli, run_dir):
    result = cli(["run", os.path.join(SCRIPTS, "spawn_train.py"), "--launcher", "none",
                  "--out", run_dir, *ONE_PROBE, "--", str(free_port_pair())], out=run_dir,
                 env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    summary = result.summary()
    assert summary["world_size"] == 2  # read from the process group the spawned ranks formed
    probe = summary["probes"][0]
    assert probe["status"] == "ok" and [r["rank"] for r in probe["per_rank"]] == [0, 1]
    assert all(r["steps"] == 20 for r in probe["per_rank"])


def test_mp_spawn_script_under_torchrun_is_refused_at_once_with_what_runs_it(cli, run_dir):
    """Without ``--launcher none`` each of torchrun's ranks would spawn a set of its own, every
    set on the script's one rendezvous port: they waited until the probe's timeout (600 s by
    default). The spawn inside a torchrun rank is refused where it is made; 60 s is the
    bound this test waits, not a figure it asserts."""
    result = cli(["run", os.path.join(SCRIPTS, "spawn_train.py"), "--out", run_dir,
                  "--nproc-per-node", "2", *ONE_PROBE, "--", str(free_port_pair())],
                 out=run_dir, env=ONE_THREAD, timeout=60)
    assert result.returncode == ExitCode.SCRIPT_FAILED, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ddp-profile:")]
    assert len(errors) == 1 and "torch.multiprocessing.spawn" in errors[0], result.stderr
    assert "--launcher none" in errors[0]
    (probe,) = _summary(run_dir)["probes"]  # what was measured is kept
    assert probe["status"] == "crash" and "RanksInsideARank" in probe["error"], probe


def test_spawned_ranks_that_run_to_the_scripts_end_report_it_and_its_errors(cli, run_dir):
    """A spawned rank whose function returns ends as a probe does (its records, then out,
    its DDP module never freed: a freed reducer's gloo group can deadlock the rank on the
    GIL); one that raises is recorded with its exception (the spawn patch reaches the
    spawned ranks: it once looked for ``_wrap`` on the function ``spawn``)."""
    whole = ["--steps", "400", *ONE_PROBE[ONE_PROBE.index("--warmup"):]]
    result = cli(["run", os.path.join(SCRIPTS, "spawn_train.py"), "--launcher", "none",
                  "--out", run_dir, *ONE_PROBE[:ONE_PROBE.index("--steps")], *whole, "--",
                  str(free_port_pair()), "1"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    probe = result.summary()["probes"][0]
    assert probe["status"] == "ok" and probe["short"] is True
    ends = [json.loads(line) for rank in (0, 1) for line in open(
        os.path.join(run_dir, "probes", "p000", f"rank-{rank}.jsonl"), encoding="utf-8")
        if '"kind":"end"' in line.replace(" ", "")]
    assert [e["reason"] for e in ends] == ["script_exit"] * 2

    failing = run_dir + "-failing"
    result = cli(["run", os.path.join(SCRIPTS, "spawn_train.py"), "--launcher", "none",
                  "--out", failing, *ONE_PROBE[:ONE_PROBE.index("--steps")], *whole, "--",
                  str(free_port_pair()), "1", "1"], out=failing, env=ONE_THREAD)
    assert result.returncode == 5, result.stderr
    assert "RuntimeError: rank 1 failed after its loop" in result.stderr


def test_legacy_local_rank_script_works_unchanged(cli, run_dir):
    result = cli(["run", os.path.join(SCRIPTS, "legacy_launch_train.py"), "--out", run_dir,
                  *ONE_PROBE], out=run_dir)
    assert result.returncode == 0, result.stderr
    probe = result.summary()["probes"][0]
    assert probe["status"] == "ok" and len(probe["per_rank"]) == 2


def test_cuda_only_script_on_a_cpu_machine_says_so(cli, run_dir):
    result = cli(["run", os.path.join(SCRIPTS, "nccl_train.py"), "--out", run_dir, *ONE_PROBE],
                 out=run_dir)
    assert result.returncode == ExitCode.SCRIPT_FAILED
    assert "needs CUDA" in result.stderr and result.stderr.strip().count("\n") == 0


def _start_members(args_for, envs: list[dict]) -> list[subprocess.Popen]:
    procs = []
    for member, extra in enumerate(envs):
        env = dict(os.environ, **ONE_THREAD, **extra, **{TEST_ID_VAR: _current_test_id[0]})
        procs.append(subprocess.Popen([sys.executable, "-m", "ddp_profile", *args_for(member)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def _finish(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err


def test_inside_a_slurm_allocation_no_nested_launch(tmp_path):
    port = free_port_pair()
    out = str(tmp_path / "slurm")
    envs = [{"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
             "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)} for r in range(2)]
    assert detect(envs[1]).rank == 1 and detect(envs[1]).kind == "slurm"
    procs = _start_members(lambda m: ["run", DEMO, "--out", out, *ONE_PROBE], envs)
    _finish(procs)
    summary = _summary(out)
    probe = summary["probes"][0]
    assert summary["world_size"] == 2 and probe["status"] == "ok"
    assert [r["rank"] for r in probe["per_rank"]] == [0, 1]  # both ranks' records on rank 0
    assert os.path.isdir(out + "-member1")  # the follower kept its own copy
    with open(os.path.join(out, "probes", probe["id"], "launcher.log")) as log:
        assert "torch.distributed.run" not in log.read()  # the script ran in place


def test_two_nodes_joined_by_a_c10d_rendezvous(tmp_path):
    port = free_port_pair()
    out = str(tmp_path / "nodes")
    procs = _start_members(lambda m: [
        "run", DEMO, "--out", out, "--nnodes", "2", "--node-rank", str(m), "--nproc-per-node",
        "1", "--rdzv-endpoint", f"127.0.0.1:{port}", *ONE_PROBE, "--", "--load-ms", "1"],
        [{}, {}])
    _finish(procs)
    summary = _summary(out)
    probe = summary["probes"][0]
    assert summary["world_size"] == 2 and probe["status"] == "ok"
    assert [(r["rank"], r["node"]) for r in probe["per_rank"]] == [(0, 0), (1, 1)]
    assert os.path.exists(os.path.join(out, "probes", probe["id"], "launcher.log.member1"))


def test_allocation_detection():
    assert detect({}) is None
    job = detect({"MASTER_ADDR": "trainer-0", "RANK": "3", "WORLD_SIZE": "4"})
    assert job.kind == "pytorchjob" and job.rank == 3 and job.master_addr == "trainer-0"
    outer = detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2",
                    "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert outer.kind == "torchrun" and outer.master_port == 1234
    slurm = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
                    "SLURM_NODEID": "2", "SLURM_NODELIST": "gpu[03-06]"})
    assert (slurm.rank, slurm.world_size, slurm.node_rank, slurm.master_addr) == \
        (5, 8, 2, "gpu03")
    assert detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # a single task


def test_inside_an_outer_torchrun(cli, tmp_path):
    out = str(tmp_path / "outer")
    port = free_port_pair()
    env = dict(os.environ, **{TEST_ID_VAR: _current_test_id[0]})
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           f"--master-port={port}", "-m", "ddp_profile", "run", DEMO, "--out",
                           out, *ONE_PROBE], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probe = _summary(out)["probes"][0]
    assert probe["status"] == "ok" and [r["rank"] for r in probe["per_rank"]] == [0, 1]
    env_of_rank = detect({"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "2",
                          "MASTER_PORT": "1000"}).rank_env()
    assert env_of_rank["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # a fresh store per probe
    assert env_of_rank["MASTER_PORT"] == "1002"


def test_ranks_that_hang_after_the_scripts_end_are_ended_and_the_probe_kept(cli, run_dir):
    """Rank 0 never exits after destroying its process group (a gloo teardown deadlock,
    made certain). Its records are whole at that call; once every rank recorded its end, the
    launch gets ``END_GRACE_S`` to exit and is then ended: the probe is measured, not a 60 s
    timeout (before: "no result within 60 s; rank 0 stopped recording first")."""
    from ddp_profile.profiler.launch.ranks import END_GRACE_S

    result = cli(["run", os.path.join(SCRIPTS, "teardown_hang_train.py"), "--out", run_dir,
                  "--num-workers", "0", "--no-ceiling", "--no-comm", "--pairs", "0",
                  "--steps", "10", "--warmup", "2", "--timeout", "60", "--no-report",
                  "--quiet"], out=run_dir, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    (probe,) = result.summary()["probes"]
    assert probe["status"] == "ok" and probe["hung_at_exit"] is True, probe
    assert probe["short"] and probe["steps_measured"] == 6  # 8 steps, 2 of them warm-up
    assert probe["script_samples"] == 256  # it ran to the script's end
    assert END_GRACE_S <= probe["wall_s"] < 60 - 10
    assert probe_processes() == []


def test_the_fork_server_ends_without_finalizing_and_what_it_forks_still_does(tmp_path):
    """The launches' fork server skips Python's finalization (it held a run's output open
    while torch finalized); a process forked from it still runs its exit handlers."""
    marker = str(tmp_path / "finalized-")
    code = (f"import atexit, os, sys\n"
            f"atexit.register(lambda: open({marker!r} + str(os.getpid()), 'w').close())\n"
            f"import ddp_profile.profiler.launch.agent_server\n"
            f"child = os.fork()\n"
            f"if child == 0:\n"
            f"    sys.exit(0)\n"
            f"os.waitpid(child, 0)\n"
            f"print(os.getpid(), child)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    server, child = proc.stdout.split()
    assert not os.path.exists(marker + server)
    assert os.path.exists(marker + child)
