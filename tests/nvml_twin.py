"""A scripted twin of the ``pynvml`` interface, for tests and benchmarks without a GPU.

``NvmlTwin`` exposes the same function names, constants and ``NVMLError`` class hierarchy as
``pynvml`` (``NVMLError(code)`` builds the matching subclass, e.g. ``NVMLError_NotSupported``),
over a list of :class:`TwinDevice` whose values and failures a test scripts:

>>> twin = NvmlTwin([TwinDevice(index=0, pci_bus_id="00000000:3B:00.0")])
>>> twin.devices[0].push_util(1_000, 40)          # one driver utilisation sample at t=1 ms
>>> twin.devices[0].errors["nvmlDeviceGetPowerUsage"] = NVML_ERROR_NOT_SUPPORTED
>>> twin.devices[0].lost = True                   # every device call now raises GPU_IS_LOST
>>> twin.missing.add("nvmlGpmSampleAlloc")        # the module lacks the function entirely

``twin.calls`` counts calls by function name, so tests can assert what was (not) called.
"""

from __future__ import annotations

import collections
import string
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_NO_DATA = 21
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

_ERROR_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """``NVMLError(code)`` returns an instance of the code's subclass, as in pynvml."""

    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        suffix = name[len("NVML_ERROR_"):]
        cls_name = "NVMLError_" + string.capwords(suffix, "_").replace("_", "")
        cls = type(cls_name, (NVMLError,), {"__module__": __name__})
        setattr(module, cls_name, cls)
        NVMLError._valClassMapping[getattr(module, name)] = cls


_make_error_classes()


def normalize_bus_id(bus_id: Any) -> str:
    """``"0000:3b:00.0"`` / ``b"00000000:3B:00.0"`` -> ``"00000000:3B:00.0"``."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    parts = text.strip().upper().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-8:].rjust(8, "0")
    elif len(parts) == 2:
        parts.insert(0, "00000000")
    return ":".join(parts)


class _Obj:
    """A plain attribute bag standing in for a ctypes structure."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)


@dataclass
class TwinDevice:
    """One scripted GPU. Values are what the NVML calls return (NVML units: mW, KB/s...)."""

    index: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = ""
    uuid: str = ""
    memory_total: int = 80 * 1024**3
    memory_used: int = 10 * 1024**3
    power_mw: int = 300_000
    sm_clock_mhz: int = 1980
    temp_c: int = 55
    throttle_reasons: int = 0
    pcie_rx_kbps: int = 1_000_000
    pcie_tx_kbps: int = 500_000
    gpm_supported: bool = True
    gpm_values: dict[int, float] = field(default_factory=lambda: {
        NVML_GPM_METRIC_SM_UTIL: 71.0, NVML_GPM_METRIC_SM_OCCUPANCY: 42.0,
        NVML_GPM_METRIC_ANY_TENSOR_UTIL: 33.0, NVML_GPM_METRIC_DRAM_BW_UTIL: 55.0})
    util_samples: list[tuple[int, int]] = field(default_factory=list)
    util_buffer: int = 100
    # When set, utilisation samples are generated from the wall clock at this period,
    # with values from util_fn(t_us) (the benchmark's "live" device).
    util_period_us: Optional[int] = None
    util_fn: Callable[[int], int] = lambda t_us: (t_us // 1000) % 101
    errors: dict[str, int] = field(default_factory=dict)
    lost: bool = False

    def __post_init__(self) -> None:
        default_bus_id = f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"
        self.pci_bus_id = normalize_bus_id(self.pci_bus_id or default_bus_id)
        self.uuid = self.uuid or f"GPU-00000000-0000-0000-0000-{self.index:012d}"

    def push_util(self, t_us: int, value: int) -> None:
        """The driver records one utilisation sample (timestamp in microseconds)."""
        self.util_samples.append((int(t_us), int(value)))
        del self.util_samples[:-self.util_buffer]

    def _generate_util(self) -> None:
        if self.util_period_us is None:
            return
        now_us = time.time_ns() // 1000
        last = self.util_samples[-1][0] if self.util_samples else now_us - self.util_period_us * 10
        t_us = last + self.util_period_us
        while t_us <= now_us:
            self.push_util(t_us, self.util_fn(t_us))
            t_us += self.util_period_us


class NvmlTwin:
    """An object with the pynvml module's interface over scripted :class:`TwinDevice` s."""

    NVMLError = NVMLError

    def __init__(self, devices: Optional[list[TwinDevice]] = None, *,
                 driver_version: str = "550.54.15", init_error: Optional[int] = None):
        self.devices = list(devices or [])
        self.driver_version = driver_version
        self.init_error = init_error
        self.missing: set[str] = set()          # functions the module lacks (AttributeError)
        self.not_found: set[str] = set()        # functions the driver lacks (FUNCTION_NOT_FOUND)
        self.calls: collections.Counter[str] = collections.Counter()
        self.init_count = 0
        self._gpm_serial = 0

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml"):
            if name in object.__getattribute__(self, "missing"):
                raise AttributeError(name)
            object.__getattribute__(self, "calls")[name] += 1
            if name in object.__getattribute__(self, "not_found"):
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:  # constants and error classes of the module
        module = sys.modules[__name__]
        if name.startswith(("NVML_", "NVMLError")) and hasattr(module, name):
            return getattr(module, name)
        raise AttributeError(name)

    def __dir__(self) -> list[str]:
        module = sys.modules[__name__]
        constants = {n for n in dir(module) if n.startswith(("NVML_", "NVMLError"))}
        return sorted(set(super().__dir__()) | constants)

    # -- session and system --------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.devices)

    def _require_init(self) -> None:
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, handle: Any, fn_name: str) -> TwinDevice:
        self._require_init()
        if not isinstance(handle, TwinDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn_name in handle.errors:
            raise NVMLError(handle.errors[fn_name])
        return handle

    # -- handles -------------------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, index: int) -> TwinDevice:
        self._require_init()
        if not 0 <= index < len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._device(self.devices[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: Any) -> TwinDevice:
        self._require_init()
        wanted = normalize_bus_id(bus_id)
        for dev in self.devices:
            if dev.pci_bus_id == wanted:
                return self._device(dev, "nvmlDeviceGetHandleByPciBusId")
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> TwinDevice:
        self._require_init()
        wanted = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for dev in self.devices:
            if dev.uuid == wanted:
                return self._device(dev, "nvmlDeviceGetHandleByUUID")
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    # -- device queries ------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> _Obj:
        dev = self._device(handle, "nvmlDeviceGetPciInfo")
        return _Obj(busId=dev.pci_bus_id.encode(), busIdLegacy=dev.pci_bus_id[4:].encode())

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> _Obj:
        dev = self._device(handle, "nvmlDeviceGetMemoryInfo")
        return _Obj(total=dev.memory_total, used=dev.memory_used,
                    free=dev.memory_total - dev.memory_used)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        dev = self._device(handle, "nvmlDeviceGetClockInfo")
        return dev.sm_clock_mhz if clock_type == NVML_CLOCK_SM else 1593

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._device(handle, "nvmlDeviceGetTemperature").temp_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons").throttle_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._device(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle_reasons

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        dev = self._device(handle, "nvmlDeviceGetPcieThroughput")
        return dev.pcie_rx_kbps if counter == NVML_PCIE_UTIL_RX_BYTES else dev.pcie_tx_kbps

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> _Obj:
        dev = self._device(handle, "nvmlDeviceGetUtilizationRates")
        last = dev.util_samples[-1][1] if dev.util_samples else 0
        return _Obj(gpu=last, memory=0)

    def nvmlDeviceGetSamples(self, handle: Any, sampling_type: int,
                             last_seen_us: int) -> tuple[int, list]:
        """Samples newer than ``last_seen_us``; NOT_FOUND when there are none (as NVML does)."""
        dev = self._device(handle, "nvmlDeviceGetSamples")
        if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        dev._generate_util()
        fresh = [(t, v) for t, v in dev.util_samples if t > last_seen_us]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return NVML_VALUE_TYPE_UNSIGNED_INT, [
            _Obj(timeStamp=t, sampleValue=_Obj(uiVal=v)) for t, v in fresh
        ]

    # Process-list queries exist so tests can assert the sampler never calls them.
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return []

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list:
        self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []

    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list:
        self._device(handle, "nvmlDeviceGetProcessUtilization")
        return []

    # -- GPM (Hopper and newer) ----------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> _Obj:
        dev = self._device(handle, "nvmlGpmQueryDeviceSupport")
        return _Obj(version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(dev.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> _Obj:
        self._require_init()
        return _Obj(device=None, serial=None, freed=False)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        sample.freed = True

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        dev = self._device(handle, "nvmlGpmSampleGet")
        if not dev.gpm_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._gpm_serial += 1
        sample.device, sample.serial = dev, self._gpm_serial
        return sample

    def nvmlGpmMetricsGet(self, metrics_get: Any) -> Any:
        self._require_init()
        s1, s2 = metrics_get.sample1, metrics_get.sample2
        if s1 is None or s2 is None or s1.serial is None or s2.serial is None \
                or s1.serial >= s2.serial:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        dev = self._device(s2.device, "nvmlGpmMetricsGet")
        for metric in metrics_get.metrics[: metrics_get.numMetrics]:
            if metric.metricId in dev.gpm_values:
                metric.value = float(dev.gpm_values[metric.metricId])
                metric.nvmlReturn = NVML_SUCCESS
            else:
                metric.value, metric.nvmlReturn = 0.0, NVML_ERROR_NOT_SUPPORTED
        return metrics_get

    @staticmethod
    def c_nvmlGpmMetricsGet_t() -> _Obj:
        """Stands in for the ctypes structure of the same name."""
        metrics = [_Obj(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0) for _ in range(32)]
        return _Obj(version=0, numMetrics=0, sample1=None, sample2=None, metrics=metrics)
