"""NVML telemetry of one rank's GPU in a background thread (see ``profiler.sampler``)."""

from __future__ import annotations

import time
from typing import Any, Optional

from ddp_profile.profiler.telemetry.nvml import (
    GpmReader,
    Nvml,
    UtilisationReader,
    _text,
    cuda_device_nvml_key,
    gpu_status,
)
from ddp_profile.profiler.telemetry.periodic import NAN, Clock, Emit, _PeriodicSampler, log

__all__ = ["GpuSampler", "gpu_status"]


class GpuSampler(_PeriodicSampler):
    """NVML telemetry of one device, found by PCI bus id (or by CUDA index, mapped through it)."""

    source = "gpu"

    def __init__(self, emit: Emit, *, pci_bus_id: Optional[str] = None,
                 cuda_device_index: Optional[int] = None, interval_s: float = 0.5,
                 nvml_lib: Any = None, clock: Clock = time.time_ns):
        super().__init__(emit, interval_s, clock)
        self.nvml = Nvml(nvml_lib)
        self._key: Optional[tuple[str, str]] = ("pci", pci_bus_id) if pci_bus_id else None
        self._cuda_index = cuda_device_index
        self._handle: Any = None
        self._util: Optional[UtilisationReader] = None
        self._throttle_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        self._gpm: Optional[GpmReader] = None
        self.lost = False
        self.status: dict[str, Any] = {"gpu_available": False,
                                       "gpu_unavailable_reason": "not started yet"}

    # -- set-up --------------------------------------------------------------------------
    def prime(self) -> bool:
        reason = self._open()
        self.status = {"gpu_available": reason is None, "gpu_unavailable_reason": reason,
                       "pci_bus_id": self._key[1] if self._key else None,
                       "name": None if reason is not None else
                       _text(self.nvml.query("nvmlDeviceGetName", self._handle, default="?"))}
        self._send({"kind": "event", "name": "gpu_status", "t_ns": int(self._clock()),
                    "data": dict(self.status)})
        if reason is not None:
            log.info("GPU telemetry off: %s", reason)
            return False
        self._util = UtilisationReader(self.nvml, self._handle)
        self._pick_throttle_fn()
        self._gpm = GpmReader.open(self.nvml, self._handle)
        return True

    def _open(self) -> Optional[str]:
        """Init NVML and find the handle; a one-line reason on failure."""
        if self._key is None:
            if self._cuda_index is None:
                return "rank uses no CUDA device"
            try:
                self._key = cuda_device_nvml_key(self._cuda_index)
            except Exception as exc:
                detail = " ".join(str(exc).split())
                return f"cannot map CUDA device {self._cuda_index} to NVML: {detail}"[:300]
        reason = self.nvml.init()
        if reason is not None:
            return reason
        kind, key = self._key
        fn_name = "nvmlDeviceGetHandleByPciBusId" if kind == "pci" else "nvmlDeviceGetHandleByUUID"
        try:
            self._handle = self.nvml.call(fn_name, key)
        except self.nvml.lib.NVMLError as exc:
            return f"no NVML device with {kind} {key}: {self.nvml.describe(exc)}"
        return None

    def _pick_throttle_fn(self) -> None:
        try:
            self.nvml.call(self._throttle_fn, self._handle)
        except self.nvml.lib.NVMLError as exc:
            if self.nvml.is_error(exc, "FUNCTION_NOT_FOUND"):  # drivers before the rename
                self._throttle_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"

    # -- sampling ------------------------------------------------------------------------
    def sample_once(self) -> Optional[dict]:
        if self.lost or self._handle is None:
            return None
        record = self._record()
        record.update(self._util.read())
        record.update(self._device_metrics())
        if self._gpm is not None:
            record.update(self._gpm.read())
        if self.nvml.lost_reason is not None:
            self._on_lost()
            return None
        return record

    def _device_metrics(self) -> dict[str, float]:
        q, lib, h = self.nvml.query, self.nvml.lib, self._handle
        memory = q("nvmlDeviceGetMemoryInfo", h, default=None)
        return {
            "gpu_mem_used_bytes": float(memory.used) if memory is not None else NAN,
            "gpu_mem_total_bytes": float(memory.total) if memory is not None else NAN,
            "gpu_power_w": float(q("nvmlDeviceGetPowerUsage", h)) / 1000.0,
            "gpu_sm_clock_mhz": float(q("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_SM)),
            "gpu_temp_c": float(q("nvmlDeviceGetTemperature", h, lib.NVML_TEMPERATURE_GPU)),
            "gpu_throttle_reasons": float(q(self._throttle_fn, h)),
            # NVML reports PCIe throughput in KB/s over a 20 ms window.
            "gpu_pcie_rx_bps": float(q("nvmlDeviceGetPcieThroughput", h,
                                       lib.NVML_PCIE_UTIL_RX_BYTES)) * 1024.0,
            "gpu_pcie_tx_bps": float(q("nvmlDeviceGetPcieThroughput", h,
                                       lib.NVML_PCIE_UTIL_TX_BYTES)) * 1024.0,
        }

    def _on_lost(self) -> None:
        self.lost = True
        reason = f"GPU lost during sampling: {self.nvml.lost_reason}"
        self.status = dict(self.status, gpu_available=False, gpu_unavailable_reason=reason)
        self._send({"kind": "event", "name": "gpu_lost", "t_ns": int(self._clock()),
                    "data": {"pci_bus_id": self.status.get("pci_bus_id"), "reason": reason}})
        self._stop.set()

    def close(self) -> None:
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None
        self.nvml.shutdown()
