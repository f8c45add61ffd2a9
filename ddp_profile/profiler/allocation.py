"""Detect an existing allocation that already started one process per rank.

Inside SLURM ``srun``, a Kubernetes PyTorchJob or an outer ``torchrun``, every rank's process
runs ``ddp-profile run`` itself; ddp-profile must not launch ranks again. Each such process runs
the script in its own place (one rank), and the processes coordinate their probes through the
rank-0 process (``profiler.launch.coordinate``). Read by the launch and by the ranks' spawn
patch (``rank.patches``: ranks spawned inside a torchrun rank), so it sits below both.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class Allocation:
    kind: str  # slurm | pytorchjob | torchrun
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    master_addr: str
    master_port: int

    def rank_env(self) -> dict[str, str]:
        """The environment the script's rank process needs (torchrun-style variables).

        Under an outer torchrun the script must not use the agent's store: it outlives the
        probes and would hand each new process group the keys of the last. The probes' rank 0
        hosts its own store two ports up (one up is ddp-profile's coordinator).
        """
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
               "LOCAL_RANK": str(self.local_rank), "GROUP_RANK": str(self.node_rank),
               "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}
        if self.kind == "torchrun":
            env.update(TORCHELASTIC_USE_AGENT_STORE="False",
                       MASTER_PORT=str(self.master_port + 2))
        return env


def _first_slurm_host(nodelist: str) -> Optional[str]:
    """``node[01-04,07],gpu5`` -> ``node01``."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return None
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _int(environ: Mapping[str, str], key: str, default: Optional[int] = None) -> Optional[int]:
    value = environ.get(key, "")
    return int(value) if value.strip().lstrip("-").isdigit() else default


def detect(environ: Optional[Mapping[str, str]] = None) -> Optional[Allocation]:
    """The allocation this process is a rank of, or None for a plain shell."""
    env = os.environ if environ is None else environ
    port = _int(env, "MASTER_PORT", 29500) or 29500
    if env.get("TORCHELASTIC_RUN_ID") and _int(env, "RANK") is not None:
        return Allocation("torchrun", _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1),
                          _int(env, "LOCAL_RANK", 0), _int(env, "GROUP_RANK", 0),
                          env.get("MASTER_ADDR", "127.0.0.1"), port)
    if _int(env, "SLURM_PROCID") is not None and (_int(env, "SLURM_NTASKS", 1) or 1) > 1:
        master = env.get("MASTER_ADDR") or _first_slurm_host(
            env.get("SLURM_STEP_NODELIST", env.get("SLURM_NODELIST", ""))) or "127.0.0.1"
        return Allocation("slurm", _int(env, "SLURM_PROCID", 0), _int(env, "SLURM_NTASKS", 1),
                          _int(env, "SLURM_LOCALID", 0), _int(env, "SLURM_NODEID", 0),
                          master, port)
    if env.get("MASTER_ADDR") and _int(env, "RANK") is not None and \
            (_int(env, "WORLD_SIZE", 1) or 1) > 1:
        return Allocation("pytorchjob", _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1),
                          _int(env, "LOCAL_RANK", 0), _int(env, "NODE_RANK",
                                                           _int(env, "RANK", 0)),
                          env["MASTER_ADDR"], port)
    return None
