"""A probe's communication from its rank records: the least exposed rank, bandwidth, syncs
per optimizer step, and the script's collectives merged over ranks."""

from __future__ import annotations

import pytest

from ddp_profile.profiler.store.probe_comm import bandwidth, probe_comm
from ddp_profile.profiler.store.probedir import RankData


def rank_data(rank: int, exposed_ms: float, steps: int = 8, syncs: int = 1, opt: int = 1,
              coll_s: float = 0.0) -> RankData:
    records = []
    for step in range(steps):
        record = {"kind": "step", "loader_id": 0, "step": step, "measured": step >= 2,
                  "data_wait_s": 0.0, "compute_s": 0.08, "other_s": 0.02,
                  "ddp_n": [(step + 1) * syncs], "syncs": syncs, "unsynced": 0,
                  "opt_steps": opt}
        if step:  # the figures of the previous step's backward (tagged with its count)
            record["ddp_t"] = [[0, step * syncs, 1, 2, int(30e6), int(30e6 - exposed_ms * 1e6)]]
        if coll_s:
            record["coll_n"], record["coll_s"] = 1, coll_s
        records.append(record)
    data = RankData(rank=rank, steps=records)
    data.events = [{"name": "ddp_config", "data": {
        "total_parameter_size_bytes": 40_000_000, "rebuilt_bucket_sizes": "1, 2, 3",
        "bucket_cap_bytes": 26214400, "backend_name": "gloo", "world_size": 2,
        "has_sync_bn": 0, "env": {"NCCL_IB_DISABLE": "1"}}},
        {"name": "collective_site", "data": {"op": "all_reduce", "file": "/x/train.py",
                                             "line": 42, "function": "main", "calls": 8,
                                             "seconds": 8 * coll_s}}]
    return data


def test_figures_are_those_of_the_rank_that_waits_least():
    comm = probe_comm([rank_data(0, exposed_ms=25.0), rank_data(1, exposed_ms=10.0)])
    assert comm["exposed_s"] == pytest.approx(0.010)
    assert comm["exposed_fraction"] == pytest.approx(0.10)  # 10 ms of a 100 ms step
    assert comm["comm_s"] == pytest.approx(0.030)
    assert [r["exposed_s"] for r in comm["per_rank"]] == pytest.approx([0.025, 0.010])
    assert comm["gradient_bytes"] == 40_000_000 and comm["buckets"] == 3
    assert comm["env"] == {"NCCL_IB_DISABLE": "1"}
    # a ring all-reduce of 40 MB over 2 ranks moves 40 MB in 30 ms
    assert comm["bandwidth_bytes_per_s"] == pytest.approx(40e6 / 0.030)


def test_syncs_per_optimizer_step_and_collectives():
    ranks = [rank_data(r, 5.0, steps=10, opt=0, coll_s=0.004) for r in range(2)]
    for data in ranks:  # 4 micro-batches per optimizer step, each synchronised
        for record in data.steps:
            record["opt_steps"] = 1 if record["step"] % 4 == 3 else 0
    comm = probe_comm(ranks)
    assert comm["syncs_per_optimizer_step"] == 4.0  # measured steps 2-9: 8 syncs, 2 steps
    assert comm["collectives"]["per_step"] == 1.0
    assert comm["collectives"]["fraction"] == pytest.approx(0.04)
    [site] = comm["sites"]
    assert (site["file"], site["line"], site["calls"], site["ranks"]) == ("/x/train.py", 42, 16, 2)


def test_no_ddp_and_no_collectives_is_none():
    data = RankData(rank=0, steps=[{"kind": "step", "loader_id": 0, "step": 0, "measured": True,
                                    "data_wait_s": 0.0, "compute_s": 0.1, "other_s": 0.0}])
    assert probe_comm([data]) is None


def test_bandwidth_needs_two_ranks_and_a_time():
    assert bandwidth(1e6, 0.01, 1) is None and bandwidth(1e6, None, 2) is None
    assert bandwidth(1e6, 0.01, 4) == pytest.approx(1e6 * 1.5 / 0.01)


def test_waiting_for_a_late_rank_is_not_communication():
    """Each step one rank arrives late: the other waits 20 ms on top of the 10 ms transfer.
    Per rank, the means are alike (20 ms); per step, the late rank shows the transfer alone."""
    ranks = [rank_data(0, exposed_ms=10.0), rank_data(1, exposed_ms=10.0)]
    for data in ranks:
        for record in data.steps:
            if "ddp_t" in record and (record["step"] + data.rank) % 2:
                record["ddp_t"][0][5] -= int(20e6)  # 20 ms less overlap: 20 ms more exposed
    comm = probe_comm(ranks)
    assert [r["exposed_s"] for r in comm["per_rank"]] == pytest.approx([0.020, 0.020], rel=0.3)
    assert comm["exposed_s"] == pytest.approx(0.010)


def test_host_syncs_per_step_with_sites_merged_over_ranks():
    ranks = []
    for rank in range(2):
        data = RankData(rank=rank, steps=[
            {"kind": "step", "loader_id": 0, "step": step, "measured": step >= 2,
             "data_wait_s": 0.0, "compute_s": 0.01, "other_s": 0.0,
             **({"hsync_n": 2, "hsync_s": 0.001} if step % 4 else {})} for step in range(10)])
        data.events = [{"name": "host_sync_site", "data": {
            "file": "/x/train.py", "line": 57, "function": "main", "text": "loss.item()",
            "via": None, "calls": 12, "seconds": 0.0}}]
        ranks.append(data)
    syncs = probe_comm(ranks)["host_syncs"]
    # measured steps 2..9 on each rank: 6 of 8 with 2 syncs each
    assert syncs["per_step"] == pytest.approx(1.5)
    assert syncs["steps_with_syncs"] == pytest.approx(0.75)
    assert syncs["timed_seconds_per_step"] == pytest.approx(0.00075)
    [site] = syncs["sites"]
    assert (site["file"], site["line"], site["text"], site["calls"], site["ranks"]) == \
        ("/x/train.py", 57, "loss.item()", 24, 2)


def test_no_host_syncs_is_none():
    comm = probe_comm([rank_data(0, exposed_ms=5.0)])
    assert comm["host_syncs"] is None
