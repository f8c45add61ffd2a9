"""Keep the ``ddp-profile`` processes of a multi-node job (or of an allocation) in lockstep.

One ``ddp-profile run`` runs per node (``--nnodes``) or per rank (inside SLURM/PyTorchJob). The
leader (node 0 / rank 0) decides every probe and publishes it through a ``TCPStore`` it hosts;
the followers launch their part of the same probe, then upload their per-rank records, so the
leader's run directory receives the measurements of every node without a shared filesystem.

Keys: ``plan/<i>`` (JSON: the probe's plan and timeout, or ``{"done": true}``),
``manifest/<i>/<member>`` (JSON: file names and the launch outcome), ``file/<i>/<member>/<name>``.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import timedelta
from typing import Any, Optional

from ddp_profile.profiler.launch.ranks import LaunchOutcome, LaunchSpec, launch
from ddp_profile.profiler.settings import ProbePlan
from ddp_profile.profiler.store.rundir import RunDir

COORD_PORT_OFFSET = 1  # the coordinator listens on the rendezvous / master port + 1
WAIT_FOR_PLAN_S = 6 * 3600.0


class Coordinator:
    def __init__(self, host: str, port: int, member: int, members: int,
                 connect_timeout_s: float = 300.0):
        from torch.distributed import TCPStore

        self.member, self.members = member, members
        self.is_leader = member == 0
        self.store = TCPStore(host, port, world_size=None, is_master=self.is_leader,
                              timeout=timedelta(seconds=connect_timeout_s),
                              wait_for_workers=False)

    # ---- leader ---------------------------------------------------------------------------
    def publish(self, index: int, message: dict[str, Any]) -> None:
        self.store.set(f"plan/{index}", json.dumps(message))

    def finish(self, index: int) -> None:
        self.publish(index, {"done": True})

    def gather(self, index: int, probe_dir: str, timeout_s: float) -> list[dict[str, Any]]:
        """Write every follower's files of probe ``index`` into ``probe_dir``; their outcomes."""
        outcomes = []
        for member in range(1, self.members):
            key = f"manifest/{index}/{member}"
            try:
                self.store.wait([key], timedelta(seconds=timeout_s))
            except Exception:  # noqa: BLE001 - a follower that never reports
                outcomes.append({"member": member, "missing": True})
                continue
            manifest = json.loads(self.store.get(key))
            for name in manifest["files"]:
                data = self.store.get(f"file/{index}/{member}/{name}")
                with open(os.path.join(probe_dir, name), "wb") as handle:
                    handle.write(data)
            outcomes.append({"member": member, **manifest["outcome"]})
        return outcomes

    # ---- follower -------------------------------------------------------------------------
    def next_plan(self, index: int) -> dict[str, Any]:
        key = f"plan/{index}"
        self.store.wait([key], timedelta(seconds=WAIT_FOR_PLAN_S))
        return json.loads(self.store.get(key))

    def upload(self, index: int, probe_dir: str, outcome: dict[str, Any]) -> None:
        names = []
        for name in sorted(os.listdir(probe_dir)):
            path = os.path.join(probe_dir, name)
            if not os.path.isfile(path):
                continue
            target = name if name.endswith(".jsonl") else f"{name}.member{self.member}"
            with open(path, "rb") as handle:
                self.store.set(f"file/{index}/{self.member}/{target}", handle.read())
            names.append(target)
        self.store.set(f"manifest/{index}/{self.member}",
                       json.dumps({"files": names, "outcome": outcome}))


def coordinator_address(torchrun_args: tuple[str, ...], allocation: Any
                        ) -> Optional[tuple[str, int, int, int]]:
    """(host, port, member, members) for a coordinated run, or None for a single harness."""
    if allocation is not None:
        return (allocation.master_addr, allocation.master_port + COORD_PORT_OFFSET,
                allocation.rank, allocation.world_size)
    options = dict(a.split("=", 1) for a in torchrun_args if "=" in a)
    endpoint = options.get("--rdzv-endpoint")
    nnodes = options.get("--nnodes", "1")
    if not endpoint or nnodes == "1":
        return None
    host, _, port = endpoint.rpartition(":")
    members = int(nnodes.split(":")[-1])
    return host or "127.0.0.1", int(port or 29400) + COORD_PORT_OFFSET, \
        int(options.get("--node-rank", "0")), members


def merge_outcomes(leader: LaunchOutcome, followers: list[dict[str, Any]]) -> LaunchOutcome:
    """One outcome for a probe that ran on several nodes: any timeout, the first failure."""
    returncode = leader.returncode
    timed_out = leader.timed_out
    for follower in followers:
        if follower.get("missing"):
            returncode = returncode or 1
            continue
        timed_out = timed_out or bool(follower.get("timed_out"))
        if not returncode and follower.get("returncode"):
            returncode = follower["returncode"]
    return replace(leader, returncode=returncode, timed_out=timed_out)


def follow(coordinator: Coordinator, spec: LaunchSpec, run_dir: RunDir,
           local_rank_flag: Optional[str] = None) -> int:
    """A follower's whole sweep: launch what the leader publishes, upload the records."""
    index = 0
    while True:
        message = coordinator.next_plan(index)
        if message.get("done"):
            return index
        plan = ProbePlan.from_json(message["plan"])
        plan = replace(plan, out_dir=run_dir.probe_dir(plan.probe_id),
                       inject_local_rank=local_rank_flag)
        run_dir.discard_partial_probe(plan.probe_id)
        outcome = launch(spec, plan, float(message["timeout_s"]))
        coordinator.upload(index, plan.out_dir, {"returncode": outcome.returncode,
                                                 "timed_out": outcome.timed_out,
                                                 "wall_s": outcome.wall_s})
        index += 1
