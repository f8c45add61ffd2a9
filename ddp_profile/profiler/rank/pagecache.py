"""The files a producer reads, and the cold regime: each dropped from the page cache after use.

A producer (a DataLoader worker, or a rank fetching its own batches) opens its samples' files
inside the dataset fetch. :class:`FileReads` sees the files opened for reading through
Python's ``open`` (``builtins.open``: ``open()``, PIL's ``Image.open``, ``numpy.load``,
``torch.load`` on a path) while a fetch runs in the producing thread, and after that fetch:

* records each file once (``files`` records, ``paths``: the harness reads the files back
  into the page cache before a probe in the warm regime, ``profiler.cache``);
* in the **cold** regime, drops each from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``:
  clean pages of a file opened read-only, no privileges needed), so its next read, in this probe
  or the next, comes from storage like a first epoch's.

Files a library opens in C (``cv2.imread``, ``h5py``, ``torchvision.io.read_file``) are not
seen; nor are pages of a file still mapped (``mmap``) when it is dropped: those reads stay as
they are, and the storage share measured per batch (``loadcost``) says what they were.
"""

from __future__ import annotations

import builtins
import os
import threading
from typing import Any, Optional

SKIPPED = ("/proc/", "/sys/", "/dev/")
MAX_FILES = 200_000  # files a producer records; past it, it counts them only


def drop(path: str) -> bool:
    """Drop ``path``'s clean pages from the page cache; False where that failed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)


def _reading(mode: Any) -> bool:
    return isinstance(mode, str) and not any(c in mode for c in "wax+")


class FileReads:
    """The files one producing thread opens for reading during its fetches (see the module
    docstring); ``cold``: drop each after the fetch that read it."""

    def __init__(self, cold: bool):
        self.cold = cold
        self.thread: Optional[int] = None  # the producing thread, while it fetches
        self.batch: list[str] = []
        self.seen: set[str] = set()
        self.new: list[str] = []
        self.unrecorded = 0  # files past MAX_FILES
        self.dropped = 0

    def opened(self, file: Any, mode: Any) -> None:
        if self.thread != threading.get_ident() or not _reading(mode):
            return
        if isinstance(file, bytes):
            file = os.fsdecode(file)
        elif isinstance(file, os.PathLike):
            file = os.fspath(file)
        if isinstance(file, str) and not file.startswith(SKIPPED):
            self.batch.append(os.path.abspath(file))

    def begin(self) -> None:
        self.batch = []
        self.thread = threading.get_ident()

    def end(self) -> None:
        """The fetch ended: record its files; in the cold regime, drop them."""
        self.thread = None
        for path in dict.fromkeys(self.batch):
            if self.cold and drop(path):
                self.dropped += 1
            if path in self.seen:
                continue
            if len(self.seen) < MAX_FILES:
                self.seen.add(path)
                self.new.append(path)
            else:
                self.unrecorded += 1
        self.batch = []

    def take_new(self) -> list[str]:
        new, self.new = self.new, []
        return new


_active: list[FileReads] = []  # the producers of this process that watch ``open``
_original_open = builtins.open


def _open(file: Any, mode: Any = "r", *args: Any, **kwargs: Any) -> Any:
    for reads in _active:
        reads.opened(file, mode)
    return _original_open(file, mode, *args, **kwargs)


def watch(reads: FileReads) -> FileReads:
    """Have ``reads`` see this process's ``open`` calls (installed once per process)."""
    if builtins.open is not _open:
        builtins.open = _open
    _active.append(reads)
    return reads
