"""The one way the tool replaces a file: write a temporary file beside it, fsync, rename, fsync
the directory. A reader sees the old file or the new one, never a torn one, and after a crash
(SIGKILL, power loss) the rename itself has reached the disk.
"""

from __future__ import annotations

import os
import tempfile


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_directory(directory: str) -> None:
    """Make a rename or a new file in ``directory`` durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot fsync a directory; the data itself is synced
    finally:
        os.close(fd)


def write_text_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically and durably.

    The file gets the mode a plain ``open(path, "w")`` would (0666 less the umask). Raises
    ``OSError``; the temporary file is removed when anything fails.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_directory(directory)
