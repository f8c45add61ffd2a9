"""The files a producer reads during its fetches, and dropping them from the page cache."""

from __future__ import annotations

import os
import threading

from ddp_profile.profiler.drop_pages import drop
from ddp_profile.profiler.rank.loading.pagecache import FileReads, watch


def storage_bytes() -> int:
    with open("/proc/thread-self/io", encoding="ascii") as handle:
        fields = dict(line.split(": ") for line in handle.read().splitlines())
    return int(fields["read_bytes"])


def written(path, size=1 << 20) -> str:
    with open(path, "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())  # clean pages: only those can be dropped
    return str(path)


def test_only_files_read_during_a_fetch_in_the_producing_thread_are_seen(tmp_path):
    sample, other, log = (written(tmp_path / n, 64) for n in ("sample", "other", "log"))
    reads = watch(FileReads(cold=False))
    with open(other, "rb"):
        pass  # before any fetch: not a sample
    reads.begin()
    with open(sample, "rb") as handle:
        handle.read()
    with open(log, "a"):
        pass  # written, not read
    thread = threading.Thread(target=lambda: open(other, "rb").close())
    thread.start()
    thread.join()  # another thread's open while the fetch runs
    reads.end()
    assert reads.take_new() == [sample] and reads.take_new() == []
    reads.begin()
    with open(sample, "rb"):
        pass
    reads.end()
    assert reads.take_new() == []  # each file recorded once


def test_the_cold_regime_drops_each_file_after_the_fetch_that_read_it(tmp_path):
    path = written(tmp_path / "sample.bin")
    reads = watch(FileReads(cold=True))
    assert drop(path)  # as after a reboot
    for _ in range(2):
        before = storage_bytes()
        reads.begin()
        with open(path, "rb") as handle:
            handle.read()
        reads.end()
        read_from_storage = storage_bytes() - before
        # dropped after every read: the next read comes from storage again
        assert read_from_storage >= (1 << 20) * 0.9, read_from_storage
    assert reads.dropped == 2
    warm = watch(FileReads(cold=False))
    warm.begin()
    open(path, "rb").read()
    warm.end()
    before = storage_bytes()
    open(path, "rb").read()
    assert storage_bytes() - before < (1 << 20) * 0.1  # kept: read from the page cache


def test_a_file_is_recorded_when_first_read_however_it_was_opened_before(tmp_path,
                                                                         monkeypatch):
    path = written(tmp_path / "sample", 64)
    reads = watch(FileReads(cold=False))
    reads.begin()
    open(path, "ab").close()  # appended to, not read
    reads.end()
    assert reads.take_new() == []
    monkeypatch.chdir(tmp_path)
    reads.begin()
    open("sample", "rb").close()  # relative and absolute: one file
    open(path, "rb").close()
    reads.end()
    assert reads.take_new() == [path]
