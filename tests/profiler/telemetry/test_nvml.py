"""The NVML wrapper: lazy init, error tolerance, status, and the pynvml twin."""

from __future__ import annotations

import logging
import math
import threading
from types import SimpleNamespace

import pynvml
import pytest

from ddp_profile.profiler.telemetry import nvml as nvml_mod
from ddp_profile.profiler.telemetry.nvml import Nvml, cuda_device_nvml_key, gpu_status
from tests import nvml_twin as T


def _twin(n: int = 2) -> T.NvmlTwin:
    return T.NvmlTwin([T.TwinDevice(index=i) for i in range(n)])


def test_real_pynvml_without_gpu_reports_unavailable_in_one_line(capsys):
    status = gpu_status()
    if status["gpu_available"]:
        pytest.skip("this machine has an NVIDIA GPU")
    reason = status["gpu_unavailable_reason"]
    assert isinstance(reason, str) and reason and "\n" not in reason
    assert status["gpus"] == [] and status["driver_version"] is None
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err


def test_status_through_twin_lists_devices_and_balances_init():
    twin = _twin(3)
    twin.devices[1].memory_total = 40 * 1024**3
    status = gpu_status(twin)
    assert status["gpu_available"] is True and status["gpu_unavailable_reason"] is None
    assert status["driver_version"] == "550.54.15"
    assert [g["index"] for g in status["gpus"]] == [0, 1, 2]
    assert status["gpus"][1] == {"index": 1, "name": "NVIDIA H100 80GB HBM3",
                                 "pci_bus_id": "00000000:28:00.0",
                                 "memory_total_bytes": 40 * 1024**3}
    assert twin.init_count == 0  # a private session is shut down again


@pytest.mark.parametrize("code, words", [(T.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
                                         (T.NVML_ERROR_LIBRARY_NOT_FOUND, "Library Not Found")])
def test_status_when_init_fails(code, words):
    status = gpu_status(T.NvmlTwin([T.TwinDevice()], init_error=code))
    assert status["gpu_available"] is False
    reason = status["gpu_unavailable_reason"]
    assert words in reason and "\n" not in reason


def test_status_with_no_device():
    status = gpu_status(T.NvmlTwin([]))
    assert status == {"gpu_available": False, "gpu_unavailable_reason": "NVML found no GPU",
                      "driver_version": "550.54.15", "gpus": []}


def test_status_when_enumeration_raises_gives_a_reason_not_an_exception():
    twin = _twin(2)
    twin.devices[1].lost = True
    status = gpu_status(twin)
    assert status["gpu_available"] is False and "GPU is lost" in status["gpu_unavailable_reason"]


def test_init_is_lazy_locked_and_once():
    twin = _twin(1)
    nvml = Nvml(twin)
    assert twin.init_count == 0 and not nvml.initialized
    threads = [threading.Thread(target=nvml.init) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert twin.calls["nvmlInit"] == 1 and twin.init_count == 1
    nvml.shutdown()
    nvml.shutdown()
    assert twin.init_count == 0 and twin.calls["nvmlShutdown"] == 1


def test_init_failure_is_remembered_not_retried():
    twin = T.NvmlTwin([], init_error=T.NVML_ERROR_DRIVER_NOT_LOADED)
    nvml = Nvml(twin)
    assert "Driver Not Loaded" in nvml.init()
    assert nvml.init() == nvml.init()
    assert twin.calls["nvmlInit"] == 1


def test_query_not_supported_gives_nan_logs_once_and_stops_calling(caplog):
    twin = _twin(1)
    twin.devices[0].errors["nvmlDeviceGetPowerUsage"] = T.NVML_ERROR_NOT_SUPPORTED
    nvml = Nvml(twin)
    nvml.init()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    with caplog.at_level(logging.INFO, logger="ddp_profile.nvml"):
        values = [nvml.query("nvmlDeviceGetPowerUsage", handle) for _ in range(3)]
    assert all(math.isnan(v) for v in values)
    assert twin.calls["nvmlDeviceGetPowerUsage"] == 1
    assert len([r for r in caplog.records if "nvmlDeviceGetPowerUsage" in r.getMessage()]) == 1
    assert nvml.query("nvmlDeviceGetTemperature", handle, 0) == 55  # others unaffected


@pytest.mark.parametrize("how", ["missing", "not_found"])
def test_query_missing_function_gives_default_and_logs_once(caplog, how):
    twin = _twin(1)
    getattr(twin, how).add("nvmlDeviceGetCurrentClocksEventReasons")
    nvml = Nvml(twin)
    nvml.init()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    with caplog.at_level(logging.INFO, logger="ddp_profile.nvml"):
        assert nvml.query("nvmlDeviceGetCurrentClocksEventReasons", handle, default=None) is None
        assert math.isnan(nvml.query("nvmlDeviceGetCurrentClocksEventReasons", handle))
    assert len(caplog.records) == 1 and "FUNCTION_NOT_FOUND" in caplog.records[0].getMessage()
    with pytest.raises(twin.NVMLError) as info:
        nvml.call("nvmlDeviceGetCurrentClocksEventReasons", handle)
    assert nvml.is_error(info.value, "FUNCTION_NOT_FOUND")


def test_query_quiet_errors_and_lost_device():
    twin = _twin(1)
    nvml = Nvml(twin)
    nvml.init()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    args = (handle, T.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert nvml.query("nvmlDeviceGetSamples", *args, default=None, quiet=("NOT_FOUND",)) is None
    twin.devices[0].push_util(10, 5)
    assert nvml.query("nvmlDeviceGetSamples", *args, default=None)[1][0].sampleValue.uiVal == 5
    assert nvml.lost_reason is None
    twin.devices[0].lost = True
    assert math.isnan(nvml.query("nvmlDeviceGetTemperature", handle, 0))
    assert "GPU is lost" in nvml.lost_reason


def test_twin_error_hierarchy_matches_pynvml():
    for code in (T.NVML_ERROR_NOT_SUPPORTED, T.NVML_ERROR_FUNCTION_NOT_FOUND,
                 T.NVML_ERROR_GPU_IS_LOST, T.NVML_ERROR_NOT_FOUND, T.NVML_ERROR_UNINITIALIZED):
        twin_err, real_err = T.NVMLError(code), pynvml.NVMLError(code)
        assert type(twin_err).__name__ == type(real_err).__name__
        assert isinstance(twin_err, T.NVMLError) and twin_err.value == real_err.value == code
    assert issubclass(T.NVMLError_GpuIsLost, T.NVMLError)
    names = [n for n in dir(T) if n.startswith("NVML_") and not n.startswith("NVML_ERROR_")]
    for name in names:  # same constants as the real module, same values
        assert getattr(pynvml, name) == getattr(T, name), name
    for fn in [n for n in dir(T.NvmlTwin) if n.startswith("nvml")]:
        assert hasattr(pynvml, fn), fn


def test_twin_requires_init():
    twin = _twin(1)
    with pytest.raises(T.NVMLError_Uninitialized):
        twin.nvmlDeviceGetCount()


def _props(**fields):
    return SimpleNamespace(**fields)


def test_cuda_device_key_by_pci_then_uuid(monkeypatch):
    monkeypatch.setattr(nvml_mod, "_cuda_device_properties",
                        lambda i: _props(pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0,
                                         uuid="abc"))
    assert cuda_device_nvml_key(0) == ("pci", "00000000:3B:00.0")
    monkeypatch.setattr(nvml_mod, "_cuda_device_properties", lambda i: _props(uuid="1234-5678"))
    assert cuda_device_nvml_key(0) == ("uuid", "GPU-1234-5678")
    monkeypatch.setattr(nvml_mod, "_cuda_device_properties", lambda i: _props())
    with pytest.raises(LookupError):
        cuda_device_nvml_key(0)


def test_bus_id_normalisation():
    assert T.normalize_bus_id("0000:3b:00.0") == "00000000:3B:00.0"
    assert T.normalize_bus_id(b"00000000:3B:00.0") == "00000000:3B:00.0"
