"""Host and GPU samplers: the GPU side through the pynvml twin, the host side for real."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from ddp_profile.profiler.telemetry import nvml as nvml_mod
from ddp_profile.profiler.telemetry.sampler import GpuSampler, HostSampler, start_samplers
from tests import nvml_twin as T

HOST_KEYS = {"cpu_percent", "cpu_max_core_percent", "cpu_per_core", "iowait_percent", "rss_bytes",
             "worker_count", "worker_cpu_percent", "disk_read_bps"}
GPU_KEYS = {"gpu_util_percent", "gpu_mem_used_bytes", "gpu_mem_total_bytes", "gpu_power_w",
            "gpu_sm_clock_mhz", "gpu_temp_c", "gpu_throttle_reasons", "gpu_pcie_rx_bps",
            "gpu_pcie_tx_bps"}
GPM_KEYS = {"gpm_sm_activity", "gpm_sm_occupancy", "gpm_tensor_activity", "gpm_dram_bw_util"}
PROCESS_LIST_CALLS = ("nvmlDeviceGetComputeRunningProcesses",
                      "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetProcessUtilization")


@pytest.fixture(autouse=True)
def nothing_leaked():
    """No sampler thread nor child process survives a test."""
    yield
    alive = [t.name for t in threading.enumerate() if t.name.startswith("ddp-profile-sampler-")]
    assert alive == []
    deadline = time.monotonic() + 5
    while psutil.Process().children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert psutil.Process().children() == []


def _twin(n: int = 4) -> T.NvmlTwin:
    return T.NvmlTwin([T.TwinDevice(index=i, memory_used=(i + 1) * 2**30) for i in range(n)])


def _gpu(twin: T.NvmlTwin, records: list, **kw) -> GpuSampler:
    kw.setdefault("pci_bus_id", twin.devices[0].pci_bus_id)
    return GpuSampler(records.append, nvml_lib=twin, clock=lambda: 123, **kw)


def _samples(records: list, source: str) -> list[dict]:
    return [r for r in records if r["kind"] == "sample" and r["source"] == source]


# -- GPU through the twin -------------------------------------------------------------------

def test_cuda_device_maps_to_nvml_by_pci_bus_id_under_cuda_visible_devices(monkeypatch):
    twin = _twin(4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")

    def cuda_props(index):  # what CUDA reports: index i is the i-th *visible* physical GPU
        physical = int(os.environ["CUDA_VISIBLE_DEVICES"].split(",")[index])
        bus = int(twin.devices[physical].pci_bus_id.split(":")[1], 16)
        return SimpleNamespace(pci_domain_id=0, pci_bus_id=bus, pci_device_id=0, uuid="")

    monkeypatch.setattr(nvml_mod, "_cuda_device_properties", cuda_props)
    records: list = []
    sampler = _gpu(twin, records, pci_bus_id=None, cuda_device_index=0)
    assert sampler.prime()
    record = sampler.sample_once()
    sampler.close()
    assert record["gpu_mem_used_bytes"] == 3 * 2**30  # NVML index 2, not 0
    assert sampler.status["pci_bus_id"] == twin.devices[2].pci_bus_id
    assert twin.calls["nvmlDeviceGetHandleByIndex"] == 0
    assert records[0]["name"] == "gpu_status" and records[0]["data"]["gpu_available"] is True


def test_record_shape_and_units():
    twin = _twin(1)
    records: list = []
    sampler = _gpu(twin, records)
    assert sampler.prime()
    record = sampler.sample_once()
    sampler.close()
    assert record["kind"] == "sample" and record["source"] == "gpu" and record["t_ns"] == 123
    assert GPU_KEYS | GPM_KEYS <= set(record)
    assert all(isinstance(record[k], float) for k in GPU_KEYS | GPM_KEYS)
    assert record["gpu_power_w"] == 300.0 and record["gpu_pcie_rx_bps"] == 1_000_000 * 1024.0
    assert record["gpu_mem_total_bytes"] == 80 * 2**30 and record["gpu_sm_clock_mhz"] == 1980.0
    assert record["gpm_sm_activity"] == 71.0 and record["gpm_dram_bw_util"] == 55.0
    assert twin.init_count == 0 and twin.calls["nvmlGpmSampleFree"] == 2  # released on close


def test_utilisation_reads_each_driver_sample_once():
    twin = _twin(1)
    dev = twin.devices[0]
    for t_us, value in [(1_000, 99), (2_000, 99)]:  # before the sampler started: ignored
        dev.push_util(t_us, value)
    seen_args: list[int] = []
    real = twin.nvmlDeviceGetSamples

    def spy(handle, kind, last_seen):
        seen_args.append(last_seen)
        return real(handle, kind, last_seen)

    twin.nvmlDeviceGetSamples = spy
    sampler = _gpu(twin, [])
    assert sampler.prime()
    dev.push_util(3_000, 10)
    dev.push_util(4_000, 30)
    first = sampler.sample_once()
    second = sampler.sample_once()
    dev.push_util(5_000, 50)
    third = sampler.sample_once()
    sampler.close()
    assert (first["gpu_util_percent"], first["gpu_util_samples"]) == (20.0, 2.0)
    assert math.isnan(second["gpu_util_percent"]) and second["gpu_util_samples"] == 0.0
    assert (third["gpu_util_percent"], third["gpu_util_samples"]) == (50.0, 1.0)
    assert seen_args == [0, 2_000, 4_000, 4_000]  # lastSeenTimeStamp advances
    assert twin.calls["nvmlDeviceGetUtilizationRates"] == 0
    assert all(twin.calls[name] == 0 for name in PROCESS_LIST_CALLS)


def test_gpm_not_supported_is_skipped_cleanly():
    twin = _twin(1)
    twin.devices[0].gpm_supported = False
    sampler = _gpu(twin, [])
    assert sampler.prime()
    record = sampler.sample_once()
    sampler.close()
    assert GPU_KEYS <= set(record) and not (GPM_KEYS & set(record))
    assert twin.calls["nvmlGpmSampleAlloc"] == 0


def test_gpm_function_missing_and_metric_not_supported():
    twin = _twin(1)
    twin.missing.add("nvmlGpmSampleAlloc")
    sampler = _gpu(twin, [])
    assert sampler.prime()
    assert not (GPM_KEYS & set(sampler.sample_once()))
    sampler.close()
    twin = _twin(1)
    del twin.devices[0].gpm_values[T.NVML_GPM_METRIC_SM_OCCUPANCY]
    sampler = _gpu(twin, [])
    assert sampler.prime()
    record = sampler.sample_once()
    sampler.close()
    assert math.isnan(record["gpm_sm_occupancy"]) and record["gpm_tensor_activity"] == 33.0


def test_function_not_found_falls_back_and_not_supported_gives_nan():
    twin = _twin(1)
    twin.devices[0].throttle_reasons = 4
    twin.not_found.add("nvmlDeviceGetCurrentClocksEventReasons")  # a driver before the rename
    twin.devices[0].errors["nvmlDeviceGetPowerUsage"] = T.NVML_ERROR_NOT_SUPPORTED
    sampler = _gpu(twin, [])
    assert sampler.prime()
    records = [sampler.sample_once(), sampler.sample_once()]
    sampler.close()
    assert all(r["gpu_throttle_reasons"] == 4.0 for r in records)
    assert all(math.isnan(r["gpu_power_w"]) for r in records)
    assert twin.calls["nvmlDeviceGetPowerUsage"] == 1  # not retried every tick
    assert all(r["gpu_temp_c"] == 55.0 for r in records)


def test_unknown_pci_bus_id_gives_status_not_exception():
    records: list = []
    sampler = _gpu(_twin(1), records, pci_bus_id="0000:99:00.0")
    assert sampler.prime() is False
    assert sampler.status["gpu_available"] is False
    assert "00:99:00.0" in sampler.status["gpu_unavailable_reason"]
    assert records[0]["data"]["gpu_available"] is False


def test_lost_device_mid_probe_keeps_host_metrics_and_records_loss_once(caplog):
    twin = _twin(1)
    records: list = []
    lock = threading.Lock()

    def emit(record):
        with lock:
            records.append(record)

    with caplog.at_level(logging.WARNING):
        group = start_samplers(emit, pci_bus_id=twin.devices[0].pci_bus_id, nvml_lib=twin,
                               interval_s=0.05)
        try:
            _wait_for(lambda: len(_samples(records, "gpu")) >= 2)
            twin.devices[0].lost = True
            _wait_for(lambda: any(r.get("name") == "gpu_lost" for r in records))
            with lock:
                host_before = len(_samples(records, "host"))
            _wait_for(lambda: len(_samples(records, "host")) >= host_before + 3)
        finally:
            group.stop()
    lost_at = next(i for i, r in enumerate(records) if r.get("name") == "gpu_lost")
    lost = [r for r in records if r.get("name") == "gpu_lost"]
    assert lost[0]["data"]["pci_bus_id"] == twin.devices[0].pci_bus_id
    assert sum(r.get("name") == "gpu_lost" for r in records) == 1
    assert _samples(records[lost_at:], "gpu") == []
    assert group.gpu_status["gpu_available"] is False
    assert "lost" in group.gpu_status["gpu_unavailable_reason"]
    assert not any("stopped" in r.getMessage() for r in caplog.records)  # no crash in a thread


def test_no_gpu_on_this_machine_still_records_host(monkeypatch):
    records: list = []
    group = start_samplers(records.append, pid=os.getpid(), cuda_device_index=0, interval_s=0.05)
    try:
        _wait_for(lambda: len(_samples(records, "host")) >= 2)
    finally:
        group.stop()
    status = group.gpu_status
    if status["gpu_available"]:
        pytest.skip("this machine has a GPU")
    assert status["gpu_unavailable_reason"] and "\n" not in status["gpu_unavailable_reason"]
    assert _samples(records, "gpu") == []
    assert [r["name"] for r in records if r["kind"] == "event"] == ["gpu_status"]


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- host, for real -------------------------------------------------------------------------

def test_host_record_for_real():
    sampler = HostSampler(lambda r: None, clock=lambda: 7)
    assert sampler.prime()
    time.sleep(0.1)
    record = sampler.sample_once()
    assert record["kind"] == "sample" and record["source"] == "host" and record["t_ns"] == 7
    assert HOST_KEYS <= set(record)
    assert len(record["cpu_per_core"]) == len(os.sched_getaffinity(0))
    assert all(0.0 <= v <= 100.0 for v in record["cpu_per_core"])
    assert record["cpu_max_core_percent"] == max(record["cpu_per_core"])
    assert abs(record["rss_bytes"] - psutil.Process().memory_info().rss) < 64 * 2**20
    assert record["worker_count"] == 0.0 and record["worker_cpu_percent"] == 0.0
    assert record["disk_read_bps"] >= 0.0 or math.isnan(record["disk_read_bps"])


def test_cpu_and_iowait_from_deltas_over_available_cpus(monkeypatch):
    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    zero = Times(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    later = [Times(3, 0, 1, 4, 0, 0, 0, 0, 2, 0),   # 4 busy of 8 (guest counted in user) -> 50 %
             Times(0, 0, 0, 6, 2, 0, 0, 0, 0, 0),   # idle + iowait -> 0 % busy, 2/8 iowait
             Times(9, 0, 0, 1, 0, 0, 0, 0, 0, 0)]   # not available to the process
    sampler = HostSampler(lambda r: None)
    sampler._cpus, sampler._cpu_times = [0, 1], [zero] * 3
    monkeypatch.setattr("ddp_profile.profiler.telemetry.sampler.psutil.cpu_times",
                        lambda percpu: later)
    cpu = sampler._cpu()
    assert cpu["cpu_per_core"] == [50.0, 0.0]
    assert cpu["cpu_percent"] == 25.0 and cpu["cpu_max_core_percent"] == 50.0
    assert cpu["iowait_percent"] == 12.5


class _BurnDataset(Dataset):
    """Each item burns ~40 ms of CPU in the worker process."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        end = time.process_time() + 0.04
        while time.process_time() < end:
            pass
        return torch.tensor(index)


def test_busy_dataloader_worker_shows_in_worker_cpu_percent():
    records: list = []
    group = start_samplers(records.append, pid=os.getpid(), interval_s=0.25)
    try:
        _wait_for(lambda: len(_samples(records, "host")) >= 1)
        idle = _samples(records, "host")[0]
        for _ in DataLoader(_BurnDataset(), batch_size=2, num_workers=1):
            pass
        time.sleep(0.3)
    finally:
        group.stop()
    host = _samples(records, "host")
    assert idle["worker_count"] == 0.0 and idle["worker_cpu_percent"] < 5.0
    assert max(r["worker_count"] for r in host) == 1.0
    assert max(r["worker_cpu_percent"] for r in host) >= 25.0  # 0 if workers are not seen


# -- lifecycle ------------------------------------------------------------------------------

def test_threads_are_named_daemons_and_stop_is_idempotent():
    twin = _twin(1)
    group = start_samplers(lambda r: None, pci_bus_id=twin.devices[0].pci_bus_id, nvml_lib=twin,
                           interval_s=0.05)
    names = sorted(s.thread.name for s in group.samplers)
    assert names == ["ddp-profile-sampler-gpu", "ddp-profile-sampler-host"]
    assert all(s.thread.daemon for s in group.samplers)
    group.stop()
    group.stop()
    assert not any(s.thread.is_alive() for s in group.samplers)
    assert twin.init_count == 0


def test_a_failing_emit_does_not_stop_sampling(caplog):
    calls: list = []

    def emit(record):
        calls.append(record)
        raise RuntimeError("sink broken")

    with caplog.at_level(logging.WARNING):
        group = start_samplers(emit, interval_s=0.02)
        try:
            _wait_for(lambda: len(calls) >= 3)
        finally:
            group.stop()
    assert sum("emit failed" in r.getMessage() for r in caplog.records) == 1


def test_a_window_shorter_than_the_interval_still_gets_a_sample():
    import time as _time

    from ddp_profile.profiler.telemetry.sampler import start_samplers

    records: list[dict] = []
    group = start_samplers(records.append, pid=os.getpid(), interval_s=5.0)
    _time.sleep(0.3)  # a short probe: stopped long before the first tick
    group.stop()
    host = [r for r in records if r.get("kind") == "sample" and r.get("source") == "host"]
    assert len(host) == 1 and host[0]["cpu_percent"] >= 0
