"""A file's clean pages dropped from the page cache: the one primitive that the harness
(``profiler.cache``: the files the probes read, before a probe in the cold regime) and the
producers in the ranks (``rank.loading.pagecache``: each file after the batch that read it)
share, so it sits below both.
"""

from __future__ import annotations

import os


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
