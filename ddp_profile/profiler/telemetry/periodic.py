"""The periodic sampler thread shared by the host and GPU samplers (``profiler.sampler``)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Optional

log = logging.getLogger("ddp_profile.sampler")

Emit = Callable[[dict], None]
Clock = Callable[[], int]
NAN = math.nan

FINAL_SAMPLE_MIN_S = 0.05  # at stop, sample once more if this much time has passed


class _PeriodicSampler:
    """Runs ``prime()`` once, then ``sample_once()`` every ``interval_s`` in a daemon thread."""

    source = "base"

    def __init__(self, emit: Emit, interval_s: float, clock: Clock):
        self._emit = emit
        self.interval_s = float(interval_s)
        self._clock = clock
        self._stop = threading.Event()
        self._warned: set[str] = set()
        self.cpu_time_s = 0.0  # CPU time of the sampler thread, set when it ends
        self.thread = threading.Thread(target=self._run, name=f"ddp-profile-sampler-{self.source}",
                                       daemon=True)

    def prime(self) -> bool:
        """Take baselines; False means there is nothing to sample."""
        return True

    def sample_once(self) -> Optional[dict]:
        """One record, or None to skip this tick."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources after the loop ends."""

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout)

    def _sample_and_send(self) -> None:
        record = self.sample_once()
        if record is not None:
            self._send(record)

    def _record(self) -> dict[str, Any]:
        return {"kind": "sample", "source": self.source, "t_ns": int(self._clock())}

    def _send(self, record: dict) -> None:
        try:
            self._emit(record)
        except Exception as exc:  # a broken sink must not kill telemetry, nor training
            self._warn_once("emit", "emit failed: %r", exc)

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s sampler: " + msg, self.source, *args)

    def _run(self) -> None:
        try:
            if not self.prime():
                return
            last = time.monotonic()
            deadline = last + self.interval_s
            while not self._stop.wait(max(0.0, deadline - time.monotonic())):
                self._sample_and_send()
                last = time.monotonic()
                deadline = max(deadline + self.interval_s, last)
            if time.monotonic() - last >= FINAL_SAMPLE_MIN_S:
                self._sample_and_send()  # a short probe still gets the window since the last
        except Exception as exc:  # never a traceback from a telemetry thread
            self._warn_once("crash", "stopped: %r", exc)
        finally:
            try:
                self.close()
            except Exception as exc:
                self._warn_once("close", "close failed: %r", exc)
            self.cpu_time_s = time.thread_time()
