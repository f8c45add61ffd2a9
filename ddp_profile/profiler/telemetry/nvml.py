"""A small, forgiving wrapper around NVML (``pynvml`` from nvidia-ml-py).

A machine without a GPU, without the NVIDIA driver or without ``libnvidia-ml.so`` is a normal
case here, not an error. Everything goes through one :class:`Nvml` object:

* ``nvmlInit`` runs lazily, once, under a lock, and an ``atexit`` hook calls ``nvmlShutdown``;
* :meth:`Nvml.query` turns any ``NVMLError`` (or a function the installed ``pynvml`` lacks)
  into a default (NaN, so pandas columns stay float), and logs each missing or unsupported
  function once;
* :meth:`Nvml.call` is the raising variant, for callers that must tell errors apart
  (``nvmlDeviceGetSamples`` answers "no new samples" with ``NVML_ERROR_NOT_FOUND``);
* a device that falls off the bus (``GPU_IS_LOST``) is remembered in :attr:`Nvml.lost_reason`.

The NVML module is injectable (``Nvml(lib)``, ``gpu_status(lib)``) so tests and benchmarks can
pass :mod:`tests.nvml_twin` instead of the real ``pynvml``.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
from typing import Any, Optional

log = logging.getLogger("ddp_profile.nvml")

# Error names (the pynvml constant suffixes) that mean the device itself is gone.
_LOST_ERRORS = ("GPU_IS_LOST", "RESET_REQUIRED")
# Errors after which calling the same function again is pointless.
_STICKY_ERRORS = ("FUNCTION_NOT_FOUND", "NOT_SUPPORTED")


def _text(value: Any) -> str:
    """NVML strings arrive as ``bytes`` or ``str`` depending on the pynvml version."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


class Nvml:
    """One NVML session: lazy locked init, atexit shutdown, error-tolerant queries.

    ``lib`` is the ``pynvml`` module or a twin with the same interface; ``None`` imports
    ``pynvml`` on first use. One instance is meant to serve one device at a time (the
    "unsupported" memo is keyed by function name and non-handle arguments).
    """

    def __init__(self, lib: Any = None):
        self._lib = lib
        self._lock = threading.RLock()
        self._initialized = False
        self._init_error: Optional[str] = None
        self._atexit_registered = False
        self._logged: set[str] = set()
        self._sticky: set[tuple] = set()
        self._error_names: Optional[dict[int, str]] = None
        self.lost_reason: Optional[str] = None

    # -- session -------------------------------------------------------------------------
    @property
    def lib(self) -> Any:
        """The NVML module; imported on first use. Raises ImportError if absent."""
        if self._lib is None:
            import pynvml  # noqa: PLC0415 - optional at import time of this module

            self._lib = pynvml
        return self._lib

    def init(self) -> Optional[str]:
        """Initialise NVML once. Returns None on success, else a one-line reason."""
        with self._lock:
            if self._initialized:
                return None
            if self._init_error is not None:
                return self._init_error
            try:
                lib = self.lib
                lib.nvmlInit()
            except ImportError as exc:
                self._init_error = _one_line(f"pynvml (nvidia-ml-py) is not installed: {exc}")
                return self._init_error
            except Exception as exc:  # NVMLError, OSError from ctypes, ...
                self._init_error = _one_line(f"NVML unavailable: {self.describe(exc)}")
                return self._init_error
            self._initialized = True
            if not self._atexit_registered:
                atexit.register(self.shutdown)
                self._atexit_registered = True
            return None

    def shutdown(self) -> None:
        """Balance a successful init with ``nvmlShutdown``; safe to call more than once."""
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            try:
                self.lib.nvmlShutdown()
            except Exception as exc:  # shutting down must never raise
                log.debug("nvmlShutdown failed: %s", self.describe(exc))

    @property
    def initialized(self) -> bool:
        return self._initialized

    # -- calls ---------------------------------------------------------------------------
    def error_name(self, exc: BaseException) -> Optional[str]:
        """The ``NVML_ERROR_*`` suffix of an NVMLError (e.g. ``"NOT_SUPPORTED"``), else None."""
        value = getattr(exc, "value", None)
        if value is None:
            return None
        if self._error_names is None:
            lib = self.lib
            self._error_names = {
                getattr(lib, n): n[len("NVML_ERROR_"):]
                for n in dir(lib) if n.startswith("NVML_ERROR_")
            }
        return self._error_names.get(value, f"CODE_{value}")

    def describe(self, exc: BaseException) -> str:
        """A short, one-line description of an exception."""
        name = self.error_name(exc) if hasattr(exc, "value") else None
        text = _one_line(str(exc) or type(exc).__name__)
        return f"{text} ({name})" if name else text

    def is_error(self, exc: BaseException, name: str) -> bool:
        """True if ``exc`` is the NVMLError ``NVML_ERROR_<name>``."""
        err_cls = getattr(self.lib, "NVMLError", None)
        if err_cls is None or not isinstance(exc, err_cls):
            return False
        return getattr(exc, "value", None) == getattr(self.lib, "NVML_ERROR_" + name, object())

    def call(self, fn_name: str, *args: Any) -> Any:
        """Call ``lib.<fn_name>(*args)``; NVMLErrors propagate.

        A function the installed module lacks raises ``NVMLError(FUNCTION_NOT_FOUND)``.
        """
        fn = getattr(self.lib, fn_name, None)
        if fn is None:
            raise self.lib.NVMLError(self.lib.NVML_ERROR_FUNCTION_NOT_FOUND)
        return fn(*args)

    def query(self, fn_name: str, *args: Any, default: Any = math.nan,
              quiet: tuple[str, ...] = ()) -> Any:
        """``lib.<fn_name>(*args)``, or ``default`` on any NVMLError; never raises NVMLError.

        Missing and unsupported functions are logged once and not called again;
        ``GPU_IS_LOST`` sets :attr:`lost_reason`. Errors named in ``quiet`` (e.g.
        ``("NOT_FOUND",)``) are expected answers: default, no log.
        """
        key = (fn_name,) + tuple(a for a in args[1:] if isinstance(a, (int, str)))
        if key in self._sticky:
            return default
        try:
            return self.call(fn_name, *args)
        except self.lib.NVMLError as exc:
            if not quiet or self.error_name(exc) not in quiet:
                self._note_error(fn_name, key, exc)
            return default

    def _note_error(self, fn_name: str, key: tuple, exc: BaseException) -> None:
        name = self.error_name(exc)
        if name in _LOST_ERRORS and self.lost_reason is None:
            self.lost_reason = _one_line(f"{fn_name}: {self.describe(exc)}")
            log.warning("GPU lost: %s", self.lost_reason)
        if name in _STICKY_ERRORS:
            self._sticky.add(key)
            self.log_once(f"{fn_name}:{name}", "%s unavailable (%s); skipped from now on",
                          fn_name, name)
        else:
            self.log_once(f"{fn_name}:{name}", "%s failed: %s", fn_name, self.describe(exc))

    def log_once(self, key: str, msg: str, *args: Any) -> None:
        """Log ``msg`` at INFO the first time ``key`` is seen by this instance."""
        if key in self._logged:
            return
        self._logged.add(key)
        log.info(msg, *args)


_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}


class UtilisationReader:
    """GPU utilisation from ``nvmlDeviceGetSamples`` at the driver's own sampling rate.

    Each :meth:`read` asks only for samples newer than the newest one already seen
    (``lastSeenTimeStamp``), so every driver sample is read exactly once; the samples the
    driver took before the reader existed are skipped. Not ``nvmlDeviceGetUtilizationRates``,
    whose cached value would be read many times over when polled faster than it updates.
    """

    def __init__(self, nvml: Nvml, handle: Any):
        self._nvml, self._handle = nvml, handle
        self._kind = nvml.lib.NVML_GPU_UTILIZATION_SAMPLES
        got = nvml.query("nvmlDeviceGetSamples", handle, self._kind, 0, default=None,
                         quiet=("NOT_FOUND",))
        self.last_seen_us = max((int(s.timeStamp) for s in got[1]), default=0) if got else 0

    def read(self) -> dict[str, float]:
        """``gpu_util_percent`` (mean of the new samples, NaN if none) and ``gpu_util_samples``."""
        got = self._nvml.query("nvmlDeviceGetSamples", self._handle, self._kind, self.last_seen_us,
                               default=None, quiet=("NOT_FOUND",))
        fresh = [s for s in got[1] if int(s.timeStamp) > self.last_seen_us] if got else []
        if not fresh:
            return {"gpu_util_percent": math.nan, "gpu_util_samples": 0.0}
        field = _VALUE_FIELDS.get(got[0], "uiVal")
        values = [float(getattr(s.sampleValue, field)) for s in fresh]
        self.last_seen_us = max(int(s.timeStamp) for s in fresh)
        return {"gpu_util_percent": sum(values) / len(values),
                "gpu_util_samples": float(len(values))}


_GPM_METRICS = (  # (record key, pynvml constant name)
    ("gpm_sm_activity", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpm_sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("gpm_tensor_activity", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("gpm_dram_bw_util", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)


class GpmReader:
    """GPM metrics (Hopper and newer) between consecutive :meth:`read` calls, in percent."""

    KEYS = tuple(key for key, _ in _GPM_METRICS)

    def __init__(self, nvml: Nvml, handle: Any, samples: list, request: Any):
        self._nvml, self._handle, self._samples, self._request = nvml, handle, samples, request

    @classmethod
    def open(cls, nvml: Nvml, handle: Any) -> Optional["GpmReader"]:
        """Two GPM samples and a reusable metrics request, or None where GPM is unsupported."""
        lib = nvml.lib
        support = nvml.query("nvmlGpmQueryDeviceSupport", handle, default=None)
        if support is None or not getattr(support, "isSupportedDevice", 0):
            nvml.log_once("gpm", "GPM metrics unavailable on this device")
            return None
        try:
            samples = [nvml.call("nvmlGpmSampleAlloc"), nvml.call("nvmlGpmSampleAlloc")]
            nvml.call("nvmlGpmSampleGet", handle, samples[0])
            request = lib.c_nvmlGpmMetricsGet_t()
            request.version = lib.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_GPM_METRICS)
            for slot, (_, const) in enumerate(_GPM_METRICS):
                request.metrics[slot].metricId = getattr(lib, const)
        except (lib.NVMLError, AttributeError) as exc:
            nvml.log_once("gpm", "GPM metrics unavailable: %s", nvml.describe(exc))
            return None
        return cls(nvml, handle, samples, request)

    def read(self) -> dict[str, float]:
        """Take a new GPM sample; the metrics over the interval since the previous one."""
        previous, current = self._samples
        if self._nvml.query("nvmlGpmSampleGet", self._handle, current, default=None) is None:
            return dict.fromkeys(self.KEYS, math.nan)
        request = self._request
        request.sample1, request.sample2 = previous, current
        self._samples = [current, previous]
        if self._nvml.query("nvmlGpmMetricsGet", request, default=None) is None:
            return dict.fromkeys(self.KEYS, math.nan)
        metrics = request.metrics
        return {key: float(metrics[slot].value) if metrics[slot].nvmlReturn == 0 else math.nan
                for slot, key in enumerate(self.KEYS)}

    def close(self) -> None:
        for sample in self._samples:
            self._nvml.query("nvmlGpmSampleFree", sample, default=None)
        self._samples = []


def _cuda_device_properties(index: int) -> Any:
    import torch  # noqa: PLC0415 - only ranks that use CUDA get here

    return torch.cuda.get_device_properties(index)


def cuda_device_nvml_key(index: int) -> tuple[str, str]:
    """How NVML names CUDA device ``index``: ``("pci", "00000000:3B:00.0")`` or
    ``("uuid", "GPU-...")``.

    CUDA indices follow ``CUDA_VISIBLE_DEVICES`` and NVML indices do not, so the mapping
    goes through the PCI bus id (or the UUID when this torch build does not expose it).
    """
    props = _cuda_device_properties(index)
    domain, bus, device = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    if all(isinstance(v, int) for v in (domain, bus, device)):
        return "pci", f"{domain:08X}:{bus:02X}:{device:02X}.0"
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        return "uuid", uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    raise LookupError(f"torch gives neither PCI bus id nor UUID for CUDA device {index}")


_default: Optional[Nvml] = None
_default_lock = threading.Lock()


def default_nvml() -> Nvml:
    """The process-wide :class:`Nvml` over the real ``pynvml``."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Nvml()
        return _default


def _device_info(nvml: Nvml, index: int) -> dict[str, Any]:
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    pci = nvml.query("nvmlDeviceGetPciInfo", handle, default=None)
    memory = nvml.query("nvmlDeviceGetMemoryInfo", handle, default=None)
    return {
        "index": index,
        "name": _text(nvml.query("nvmlDeviceGetName", handle, default="unknown")),
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "memory_total_bytes": int(memory.total) if memory is not None else None,
    }


def gpu_status(lib: Any = None) -> dict[str, Any]:
    """What NVML sees on this machine; never raises.

    Returns ``{"gpu_available": bool, "gpu_unavailable_reason": str | None,
    "driver_version": str | None, "gpus": [{index, name, pci_bus_id, memory_total_bytes}]}``.
    """
    status: dict[str, Any] = {
        "gpu_available": False,
        "gpu_unavailable_reason": None,
        "driver_version": None,
        "gpus": [],
    }
    nvml = default_nvml() if lib is None else Nvml(lib)
    try:
        reason = nvml.init()
        if reason is not None:
            status["gpu_unavailable_reason"] = reason
            return status
        driver = nvml.query("nvmlSystemGetDriverVersion", default=None)
        status["driver_version"] = _text(driver) if driver is not None else None
        count = int(nvml.call("nvmlDeviceGetCount"))
        status["gpus"] = [_device_info(nvml, i) for i in range(count)]
    except Exception as exc:  # a status probe must never raise
        status["gpus"] = []
        status["gpu_unavailable_reason"] = _one_line(f"NVML query failed: {exc}")
        return status
    finally:
        if lib is not None:  # a private session: balance its init now
            nvml.shutdown()
    if not status["gpus"]:
        status["gpu_unavailable_reason"] = "NVML found no GPU"
    else:
        status["gpu_available"] = True
    return status
