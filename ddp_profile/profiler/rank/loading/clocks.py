"""A producing thread's own counters, read around each fetch (``loading.loadcost``): its
garbage collections (:class:`GcClock`), its time runnable without a CPU (:class:`RunQueueClock`,
``/proc/thread-self/schedstat``), the bytes it read and made the kernel fetch from storage
(:class:`IoCounters`, ``/proc/thread-self/io``), and the process's private resident memory
(``private_rss``). Each reads None where its file cannot be read (not Linux).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any, Optional

_perf = time.perf_counter_ns

SCHEDSTAT = "/proc/thread-self/schedstat"
THREAD_IO = "/proc/thread-self/io"
# A record's times are written in seconds with nine decimals, ``"%.9f" % (ns / 1e9)``; where
# ``0 <= (a | b | ...) < SHORT_NS`` (each of them is, then) the encoders write the same text
# from the nanoseconds, ``"0.%09d" % ns``: an integer's digits, no float formatted (``1 << 29``
# ns is about 0.54 s; the float ``ns / 1e9`` is within far less than half a nanosecond of it)
SHORT_NS = 1 << 29
fork_count = 0  # bumped in a forked child: a thread's descriptor kept under another count
# names its parent's thread


def _after_fork() -> None:
    global fork_count
    fork_count += 1


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork)


class GcClock:
    """Nanoseconds of Python's garbage collection so far in the calling thread (``gc.callbacks``,
    installed once per process). A collection runs where an allocation crosses a threshold: a
    full one over a large heap (150 ms) once landed in a 64-sample ``collate_fn`` of 0.1 ms and
    made the collate look like the loader's largest cost; it is timed apart from it."""

    _started: dict[int, int] = {}  # thread ident -> perf_counter_ns at a collection's start
    _total: dict[int, int] = {}  # thread ident -> ns collected so far

    def __init__(self) -> None:
        if GcClock._callback not in gc.callbacks:
            gc.callbacks.append(GcClock._callback)

    @staticmethod
    def _callback(phase: str, info: dict[str, Any]) -> None:
        ident = threading.get_ident()
        if phase == "start":
            GcClock._started[ident] = _perf()
        elif ident in GcClock._started:
            spent = _perf() - GcClock._started.pop(ident)
            GcClock._total[ident] = GcClock._total.get(ident, 0) + spent

    def __call__(self) -> int:
        return GcClock._total.get(threading.get_ident(), 0)


class RunQueueClock:
    """Nanoseconds the calling thread has spent runnable, waiting on a run queue for a CPU:
    the second field of ``/proc/thread-self/schedstat`` (the first is its time on a CPU).

    Calling it returns that counter, or None where the file cannot be read (not Linux) or
    the kernel keeps no scheduler statistics (it reads ``0 0 0``). The file is opened once
    per thread (``/proc/thread-self`` names the thread that opens it) and read with
    ``os.pread`` on the kept descriptor: about a microsecond a read.
    """

    SIZE = 128  # bytes read: the file's whole line

    def __init__(self, path: str = SCHEDSTAT):
        self.path = path
        self._local = threading.local()

    def __call__(self) -> Optional[int]:
        # ``raw`` and ``parse``, inline: a step boundary's reading, read and parsed here
        # (``rank.loaders``), one call a step
        state = getattr(self._local, "state", None)
        fd = (state if state is not None and state[0] == fork_count else self._state())[1]
        if fd is None:
            return None
        try:
            return int(os.pread(fd, self.SIZE, 0).split(b" ", 2)[1])
        except (OSError, ValueError, IndexError):
            return None

    def raw(self) -> Optional[bytes]:
        """The file's bytes as read now, or None: a hot path keeps them and parses them later
        (``parse``), off its own path."""
        state = getattr(self._local, "state", None)  # ``fd``, inline: a read a step
        fd = (state if state is not None and state[0] == fork_count else self._state())[1]
        if fd is None:
            return None
        try:
            return os.pread(fd, self.SIZE, 0)
        except OSError:
            return None

    def fd(self) -> Optional[int]:
        """The calling thread's descriptor of the file (opened at its first use, kept while
        the thread lives), or None where the file is unusable."""
        state = getattr(self._local, "state", None)
        if state is None or state[0] != fork_count:
            state = self._state()
        return state[1]

    def _state(self) -> tuple[int, Optional[int], Optional[_Descriptor]]:
        state = self._local.state = (fork_count, *self._open())
        return state

    @staticmethod
    def parse(raw: Optional[bytes]) -> Optional[int]:
        """The run-queue nanoseconds in ``raw`` (what ``raw`` read), or None."""
        if raw is None:
            return None
        try:
            return int(raw.split(b" ", 2)[1])
        except (ValueError, IndexError):
            return None

    def _open(self) -> tuple[Optional[int], Optional[_Descriptor]]:
        """(descriptor, its owner), or (None, None) when the file is unusable."""
        try:
            owner = _Descriptor(os.open(self.path, os.O_RDONLY))
        except OSError:
            return None, None
        try:
            fields = os.pread(owner.fd, 128, 0).split()
            if len(fields) >= 3 and int(fields[2]) > 0:  # a running thread ran at least once
                return owner.fd, owner
        except (OSError, ValueError):
            pass
        return None, None


def runq_ns(reading: Any) -> Optional[int]:
    """The run-queue nanoseconds of a reading (what ``RunQueueClock.raw`` read, or already
    a number), or None."""
    if reading is None or reading.__class__ is int:
        return reading
    return RunQueueClock.parse(reading)


def runq_delta(before: Any, after: Any) -> Optional[int]:
    """Nanoseconds on a run queue between two readings (``runq_ns``: raw, or numbers already),
    or None where either is unknown. A record's encoder calls it once for its two readings,
    a raw one parsed inline, at the flush."""
    try:
        if before.__class__ is not int:
            before = int(before.split(b" ", 2)[1])
        if after.__class__ is not int:
            after = int(after.split(b" ", 2)[1])
        return after - before
    except (AttributeError, ValueError, IndexError):  # unread (None), or unparsable
        return None


class IoCounters(RunQueueClock):
    """(bytes read, bytes fetched from storage) so far by the calling thread: ``rchar`` and
    ``read_bytes`` of ``/proc/thread-self/io``, read like ``RunQueueClock`` reads its file;
    None where unreadable."""

    def __init__(self, path: str = THREAD_IO):
        super().__init__(path)

    SIZE = 512

    def __call__(self) -> Optional[tuple[int, int]]:  # type: ignore[override]
        return self.parse(self.raw())

    @staticmethod
    def parse(raw: Optional[bytes]) -> Optional[tuple[int, int]]:  # type: ignore[override]
        if raw is None:
            return None
        try:
            lines = raw.split(b"\n", 5)  # rchar: N, ..., the fifth read_bytes: N
            return int(lines[0][7:]), int(lines[4][12:])
        except (ValueError, IndexError):
            return None

    def _open(self) -> tuple[Optional[int], Optional[_Descriptor]]:
        try:
            owner = _Descriptor(os.open(self.path, os.O_RDONLY))
            fields = os.pread(owner.fd, 512, 0).split()
            if fields[0] == b"rchar:" and fields[8] == b"read_bytes:":
                return owner.fd, owner
        except (OSError, IndexError):
            pass
        return None, None


class _Descriptor:
    """Owns a file descriptor: closed when no thread holds it any more."""

    def __init__(self, fd: int):
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def private_rss() -> Optional[int]:
    """This process's resident memory shared with no other process (bytes): what one more
    worker adds. Pages a forked worker still shares with its rank are not counted."""
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as handle:
            total = sum(int(line.split()[1]) for line in handle
                        if line.startswith(("Private_Clean:", "Private_Dirty:")))
        return total * 1024
    except (OSError, ValueError, IndexError):
        return None
