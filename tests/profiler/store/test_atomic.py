"""The one atomic writer: whole file or old file, the usual mode, nothing left behind."""

from __future__ import annotations

import os
import stat

import pytest

from ddp_profile.profiler.store import atomic
from ddp_profile.profiler.store.atomic import write_text_atomic


def test_replaces_the_file_with_the_usual_mode_and_no_temporary_left(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text("old")
    old_umask = os.umask(0o022)
    try:
        write_text_atomic(str(path), "new \u2705")
    finally:
        os.umask(old_umask)
    assert path.read_text(encoding="utf-8") == "new \u2705"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["summary.json"]


def test_file_and_directory_are_fsynced_before_and_after_the_rename(tmp_path, monkeypatch):
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    def replace(src, dst):
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    write_text_atomic(str(tmp_path / "run.json"), "{}")
    assert calls == ["file", "rename", "dir"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.html"
    path.write_text("old")

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", broken)
    with pytest.raises(OSError):
        write_text_atomic(str(path), "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.html"]
