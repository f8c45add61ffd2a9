"""PinMeter: the time of pinning each batch, in the pin-memory thread or the loop's thread.

Pinning only runs where an accelerator is present; here torch's own ``pin_memory`` function
(the one its pin-memory thread and single-process iterator call, recursing into containers
through its module name) runs over objects whose ``pin_memory()`` costs a known time.
"""

from __future__ import annotations

import json
import threading
import time

from torch.utils.data._utils import pin_memory as pin_module

from ddp_profile.profiler.rank.loading.loadcost import PinMeter


class Slow:
    """A batch part whose pinning takes ``seconds`` asleep and reports a leading dimension."""

    def __init__(self, rows: int, seconds: float):
        self.shape = (rows, 3)
        self.seconds = seconds

    def pin_memory(self) -> "Slow":
        time.sleep(self.seconds)
        return self


class Iterator:
    def __init__(self, thread: threading.Thread):
        self._pin_memory_thread = thread


def test_each_batch_is_timed_once_in_the_thread_that_pins_it(monkeypatch):
    lines: list[str] = []
    meter = PinMeter(lines.append, lambda: 1)
    monkeypatch.setattr(pin_module, "pin_memory", meter.wrap(pin_module.pin_memory))
    batch = (Slow(8, 0.01), [Slow(8, 0.01), {"y": Slow(8, 0.0)}])  # torch recurses 4 times

    def pin_thread() -> None:
        started.wait()
        pin_module.pin_memory(batch, None)

    started = threading.Event()
    thread = threading.Thread(target=pin_thread)
    thread.start()
    meter.track(Iterator(thread), loader_id=3)
    started.set()
    thread.join()
    meter.fetching = 5  # the loop's own thread, taking a batch from loader 5
    pin_module.pin_memory(batch, None)

    records = [json.loads(line) for line in lines]
    assert [(r["loader_id"], r["thread"]) for r in records] == [(3, "pin"), (5, "main")]
    for record in records:
        assert record["kind"] == "pin_cost" and record["rank"] == 1
        assert record["samples"] == 8
        assert 0.02 <= record["wall_s"] < 0.2  # the two sleeps, once: nested calls not again
        assert record["cpu_s"] < record["wall_s"] / 2  # asleep, not on the CPU


def test_a_failing_pin_passes_its_error_through(monkeypatch):
    lines: list[str] = []
    meter = PinMeter(lines.append, lambda: 0)

    def broken(data, device=None):
        raise RuntimeError("no accelerator")

    wrapped = meter.wrap(broken)
    try:
        wrapped(Slow(4, 0.0))
    except RuntimeError as exc:
        assert "no accelerator" in str(exc)
    else:
        raise AssertionError("the error was swallowed")
    assert len(lines) == 1 and json.loads(lines[0])["loader_id"] is None
    assert wrapped.__wrapped__ is broken  # the original stays reachable
