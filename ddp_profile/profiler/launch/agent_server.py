"""What the launches' fork server (``launch.ranks._fork_server``) imports once a run: torch's
launcher and ``launch.ranks`` (each launch's entry), and an exit that skips Python's
finalization.

The fork server outlives the run by its finalization: with torch imported, that takes about
half a second, and the server holds the run's standard output and error open until it ends, so
a caller reading them (a pipe, a CI step) waits that long after the run has ended. The server
holds no data of its own (each launcher it forks ends with ``os._exit``), so it ends at once.
"""

from __future__ import annotations

import atexit
import os

import torch.distributed.run  # noqa: F401 - imported once here, for every launcher forked

from ddp_profile.profiler.launch import ranks  # noqa: F401 - each fork's entry, _run_agent

_SERVER_PID = os.getpid()


def _end_at_once() -> None:
    if os.getpid() == _SERVER_PID:  # never a process forked from the server
        os._exit(0)


atexit.register(_end_at_once)
