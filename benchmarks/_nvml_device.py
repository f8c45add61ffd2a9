"""One live GPU behind the ``pynvml`` calls the GPU sampler makes: the benchmark's own device.

``sampler_cost.py`` measures the sampler's Python work per tick on a machine without a GPU, so
it needs something answering NVML's calls. This module is that, and no more: the functions the
sampler calls each tick (utilisation samples, memory, power, clocks, temperature, throttle
reasons, PCIe, GPM) over one fixed device whose driver records a utilisation sample every
1/6 s of wall time. Pass the module itself as ``nvml_lib``. The scripted twin with failures,
lost devices and call counts is the tests' (``tests/nvml_twin.py``); benchmarks import nothing
from ``tests/``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = 2, 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL, NVML_GPM_METRIC_DRAM_BW_UTIL = 5, 10
PCI_BUS_ID = "00000000:18:00.0"
UTIL_PERIOD_US = 166_667
_HANDLE = SimpleNamespace(pci_bus_id=PCI_BUS_ID)


class NVMLError(Exception):
    """NVML's error, with the code in ``value`` as pynvml has it."""

    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetHandleByPciBusId(bus_id: Any) -> Any:
    return _HANDLE


def nvmlDeviceGetName(handle: Any) -> str:
    return "benchmark device"


def nvmlDeviceGetMemoryInfo(handle: Any) -> Any:
    return SimpleNamespace(total=80 * 1024**3, used=10 * 1024**3, free=70 * 1024**3)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    return 300_000


def nvmlDeviceGetClockInfo(handle: Any, clock_type: int) -> int:
    return 1980


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    return 55


def nvmlDeviceGetCurrentClocksEventReasons(handle: Any) -> int:
    return 0


def nvmlDeviceGetPcieThroughput(handle: Any, counter: int) -> int:
    return 1_000_000 if counter == NVML_PCIE_UTIL_RX_BYTES else 500_000


def nvmlDeviceGetSamples(handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, list]:
    """The driver's samples newer than ``last_seen_us`` (at most 100 kept, as a driver does)."""
    now_us = time.time_ns() // 1000
    newest = now_us - now_us % UTIL_PERIOD_US
    first = max(last_seen_us - last_seen_us % UTIL_PERIOD_US + UTIL_PERIOD_US,
                newest - 99 * UTIL_PERIOD_US)
    stamps = range(first, newest + 1, UTIL_PERIOD_US)
    if not stamps:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return NVML_VALUE_TYPE_UNSIGNED_INT, [
        SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=(t // 1000) % 101))
        for t in stamps]


def nvmlGpmQueryDeviceSupport(handle: Any) -> Any:
    return SimpleNamespace(isSupportedDevice=1)


def nvmlGpmSampleAlloc() -> Any:
    return SimpleNamespace(taken_ns=None)


def nvmlGpmSampleFree(sample: Any) -> None:
    pass


def nvmlGpmSampleGet(handle: Any, sample: Any) -> Any:
    sample.taken_ns = time.monotonic_ns()
    return sample


def nvmlGpmMetricsGet(request: Any) -> Any:
    for metric in request.metrics[:request.numMetrics]:
        metric.value, metric.nvmlReturn = 50.0, 0
    return request


def c_nvmlGpmMetricsGet_t() -> Any:
    metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(32)]
    return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)
