"""The start-up hook's guards: launcher processes, --local_rank injection, a shadowed
sitecustomize."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ddp_profile.profiler.rank.hook import HOOK_DIR, is_launcher_process
from ddp_profile.profiler.settings import ProbePlan


def test_launcher_process_is_recognised():
    assert is_launcher_process(["python", "-m", "torch.distributed.run", "--standalone", "x.py"])
    assert is_launcher_process(["/usr/bin/python3", "/venv/bin/torchrun", "x.py"])
    assert is_launcher_process(["python3", "-u", "-m", "torch.distributed.launch", "x.py"])
    assert not is_launcher_process(["python", "-u", "train.py", "-m", "torch.distributed.run"])
    assert not is_launcher_process(["python", "-m", "my_trainer"])


def test_hook_injects_local_rank_and_runs_the_shadowed_sitecustomize(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    script = tmp_path / "show.py"
    script.write_text("import os, sys, json\n"
                      "print(json.dumps([sys.argv[1:], os.environ.get('SHADOWED_RAN')]))\n")
    plan = ProbePlan(probe_id="p", out_dir=str(tmp_path / "out"), inject_local_rank="--local_rank")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HOOK_DIR, str(other)]), DDP_PROFILE="1",
               DDP_PROFILE_PLAN=plan.to_json(), DDP_PROFILE_SCRIPT=str(script), LOCAL_RANK="1")
    proc = subprocess.run([sys.executable, str(script), "--epochs", "2"], env=env,
                          capture_output=True, text=True, timeout=60)
    argv, shadowed = json.loads(proc.stdout)
    assert argv == ["--local_rank=1", "--epochs", "2"] and shadowed == "1"


def test_ranks_spawned_inside_a_torchrun_rank_are_refused_and_nowhere_else():
    from ddp_profile.profiler.rank.patches.spawn import (
        RanksInsideARank,
        refuse_ranks_inside_a_rank,
    )

    # the script run as `python train.py` (--launcher none), or by an allocation's own ranks
    refuse_ranks_inside_a_rank(2, {})
    refuse_ranks_inside_a_rank(2, {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "0"})
    with pytest.raises(RanksInsideARank, match="--launcher none") as raised:
        refuse_ranks_inside_a_rank(4, {"TORCHELASTIC_RUN_ID": "none", "RANK": "1",
                                       "WORLD_SIZE": "2"})
    assert "nprocs=4" in str(raised.value) and "each of the 2 ranks" in str(raised.value)
