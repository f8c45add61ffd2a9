"""The files a producer reads, and the cold regime: each dropped from the page cache after use.

A producer (a DataLoader worker, or a rank fetching its own batches) opens its samples' files
inside the dataset fetch. :class:`FileReads` sees the files opened for reading through
Python's ``open`` (``builtins.open``: ``open()``, PIL's ``Image.open``, ``numpy.load``,
``torch.load`` on a path) while a fetch runs in the producing thread, and after that fetch:

* records each file once (``files`` records, ``paths``: the harness reads the files back
  into the page cache before a probe in the warm regime, ``profiler.cache``);
* in the **cold** regime, drops each from the page cache (``profiler.drop_pages``), so its
  next read, in this probe or the next, comes from storage like a first epoch's.

Files a library opens in C (``cv2.imread``, ``h5py``, ``torchvision.io.read_file``) are not
seen; nor are pages of a file still mapped (``mmap``) when it is dropped: those reads stay as
they are, and the storage share measured per batch (``loadcost``) says what they were.
"""

from __future__ import annotations

import builtins
import os
import threading
from typing import Any, Optional

from ddp_profile.profiler.drop_pages import drop

SKIPPED = ("/proc/", "/sys/", "/dev/")
MAX_FILES = 200_000  # files a producer records; past it, it counts them only


def _reading(mode: Any) -> bool:
    return isinstance(mode, str) and not any(c in mode for c in "wax+")


class FileReads:
    """The files one producing thread opens for reading during its fetches (see the module
    docstring); ``cold``: drop each after the fetch that read it.

    The watch on ``open`` lies on every sample's read, so it only notes what was opened (a
    lookup and an append) and ``end`` handles, once per fetch, what it has not handled
    before: normalising and checking every path at the open made each fetch markedly slower
    (``benchmarks/overhead_micro.py`` measures both). A file seen for the first time costs
    more (its path made absolute only where it is not, recorded, written out); a short
    probe's first epoch sees every file for the first time."""

    def __init__(self, cold: bool):
        self.cold = cold
        self.opens: list[tuple[Any, Any]] = []  # (file, mode) opened during this fetch
        self.known: set[Any] = set()  # (file, mode) as opened, handled before (warm regime)
        self.seen: set[str] = set()
        self.new: list[str] = []
        self.unrecorded = 0  # files past MAX_FILES
        self.dropped = 0

    def begin(self, ident: Optional[int] = None) -> None:
        """A fetch begins in the calling thread (``ident``: its ``threading.get_ident()``)."""
        if self.opens:
            self.opens = []
        _fetching[threading.get_ident() if ident is None else ident] = self

    def end(self, ident: Optional[int] = None) -> None:
        """The fetch ended: record its new files; in the cold regime, drop them all."""
        _fetching.pop(threading.get_ident() if ident is None else ident, None)
        opens = self.opens
        if not opens:  # nothing opened (an in-memory dataset): nothing to handle
            return
        self.opens = []
        paths: dict[str, None] = {}
        for opened in opens:
            if not self.cold and _known(opened, self.known):
                continue
            path = _path(*opened)
            if path is not None:
                paths[path] = None
        for path in paths:
            if self.cold and drop(path):
                self.dropped += 1
            if path in self.seen:
                continue
            if len(self.seen) < MAX_FILES:
                self.seen.add(path)
                self.new.append(path)
            else:
                self.unrecorded += 1

    def take_new(self) -> list[str]:
        new, self.new = self.new, []
        return new


def _known(opened: tuple[Any, Any], known: set[Any]) -> bool:
    """Whether this (file, mode) was handled before; if not, it is from now on."""
    try:
        if opened in known:
            return True
        if len(known) < MAX_FILES:
            known.add(opened)
    except TypeError:  # an unhashable file object: handled every time
        pass
    return False


def _path(file: Any, mode: Any) -> Optional[str]:
    """The absolute path of a file opened for reading, or None (written, or not a path)."""
    reading = _READING.get(mode) if isinstance(mode, str) else False
    if reading is None:
        reading = _READING[mode] = _reading(mode)
    if not reading:
        return None
    if isinstance(file, bytes):
        file = os.fsdecode(file)
    elif isinstance(file, os.PathLike):
        file = os.fspath(file)
    if not isinstance(file, str) or file.startswith(SKIPPED):
        return None
    return file if file.startswith("/") and "/." not in file else os.path.abspath(file)


_READING: dict[str, bool] = {}  # open's mode -> whether it opens for reading only
_fetching: dict[int, FileReads] = {}  # thread ident -> the producer fetching in that thread
FETCHING = _fetching  # what ``begin`` and ``end`` do, for a fetch's hot path to do inline
_original_open = builtins.open


def _open(file: Any, mode: Any = "r", *args: Any, **kwargs: Any) -> Any:
    if _fetching:
        reads = _fetching.get(threading.get_ident())
        if reads is not None:
            reads.opens.append((file, mode))
    return _original_open(file, mode, *args, **kwargs)


def _forked() -> None:
    _fetching.clear()  # a forked child's threads fetch nothing yet


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forked)


def watch(reads: FileReads) -> FileReads:
    """Have ``reads`` see the files its thread opens between ``begin`` and ``end`` (the
    watch on ``open`` is installed once per process)."""
    if builtins.open is not _open:
        builtins.open = _open
    return reads
