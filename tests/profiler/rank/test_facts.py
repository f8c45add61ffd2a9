"""What a rank records about itself: CPUs (cgroup quotas), threads, batch fingerprints, and
which children are its DataLoader workers."""

from __future__ import annotations

import multiprocessing
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

from ddp_profile.profiler.cpus import cgroup_cpu_quota, cpus_available
from ddp_profile.profiler.rank.facts import batch_fingerprint, thread_facts, worker_pids
from ddp_profile.profiler.telemetry.sampler import start_samplers


def _cgroup(tmp_path, lines: str, files: dict[str, str]) -> tuple[str, str]:
    proc = tmp_path / "cgroup"
    proc.write_text(lines)
    root = tmp_path / "fs"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(proc), str(root)


def test_cgroup_v2_quota_caps_the_cpus(tmp_path):
    proc, root = _cgroup(tmp_path, "0::/kubepods/pod1\n",
                         {"kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/cpu.max": "max"})
    assert cgroup_cpu_quota(proc, root) == 1.5
    assert cpus_available(0, proc, root) == min(2, len(os.sched_getaffinity(0)))


def test_cgroup_quota_on_an_ancestor_and_v1(tmp_path):
    proc, root = _cgroup(tmp_path, "0::/a/b\n",
                         {"a/cpu.max": "100000 100000", "a/b/cpu.max": "max"})
    assert cpus_available(0, proc, root) == 1
    proc, root = _cgroup(tmp_path, "3:cpu,cpuacct:/job\n",
                         {"cpu,cpuacct/job/cpu.cfs_quota_us": "50000",
                          "cpu,cpuacct/job/cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_quota(proc, root) == 0.5 and cpus_available(0, proc, root) == 1


def test_no_quota_means_the_affinity_mask(tmp_path):
    proc, root = _cgroup(tmp_path, "0::/\n", {"cpu.max": "max 100000"})
    assert cgroup_cpu_quota(proc, root) is None
    assert cpus_available(0, proc, root) == len(os.sched_getaffinity(0))
    assert cgroup_cpu_quota(str(tmp_path / "absent"), root) is None


def test_thread_facts_name_torch_threads_and_the_environment(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    facts = thread_facts()
    assert facts["intra_op"] == torch.get_num_threads() and facts["interop"] >= 1
    assert facts["env"]["OMP_NUM_THREADS"] == "3"


def test_fingerprints_tell_batches_apart_and_match_equal_ones():
    x = torch.arange(64.0).reshape(8, 8)
    first = batch_fingerprint((x, torch.arange(8)))
    assert first == batch_fingerprint((x.clone(), torch.arange(8)))
    assert first != batch_fingerprint((x + 1, torch.arange(8)))
    assert first != batch_fingerprint((x, torch.arange(1, 9)))
    assert batch_fingerprint({"ids": torch.ones(2, 3, dtype=torch.bfloat16)}) is not None
    assert batch_fingerprint(["a.jpg", "b.jpg"]) != batch_fingerprint(["c.jpg", "d.jpg"])
    assert batch_fingerprint(object()) is None
    big = torch.zeros(1 << 22)
    started = time.perf_counter()
    batch_fingerprint(big)
    assert time.perf_counter() - started < 0.5  # a strided sample, not every value


class _Burn(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        end = time.process_time() + 0.04
        while time.process_time() < end:
            pass
        return torch.tensor(index)


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_only_the_dataloaders_workers_count_never_another_child():
    """A busy child that is not a worker (e.g. Lightning's child rank) adds no worker CPU."""
    child = multiprocessing.get_context("fork").Process(target=_spin, args=(2.0,))
    child.start()
    records: list = []
    known: tuple[int, ...] = ()
    group = start_samplers(records.append, pid=os.getpid(), interval_s=0.25,
                           worker_pids=lambda: known)
    try:
        time.sleep(0.8)
        before = [r for r in records if r.get("source") == "host"]
        iterator = iter(DataLoader(_Burn(), batch_size=2, num_workers=1))
        known = tuple(worker_pids(iterator))
        assert len(known) == 1
        for _ in iterator:
            pass
        time.sleep(0.3)
    finally:
        group.stop()
        child.join()
    assert before and all(r["worker_count"] == 0.0 for r in before)
    assert all(r["worker_cpu_percent"] < 5.0 for r in before)  # the busy child is not counted
    host = [r for r in records if r.get("source") == "host"]
    assert max(r["worker_cpu_percent"] for r in host) >= 25.0  # the real worker is
