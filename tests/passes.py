"""Run the suite's two passes at once (``make test``): the tests that assert measured rates
alone at the machine's normal priority, and beside them the others (marker ``concurrent``,
``tests/conftest.py``), two at a time at idle priority (``SCHED_IDLE``, else the lowest nice),
so that they take only the CPU time the first pass leaves: its ranks sleep, wait for
rendezvous and start up on one core while the other is free. Each pass prints whole, the
rate-asserting one first; the exit status is the first failing pass's.

    python tests/passes.py [pytest arguments for both passes]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

PASSES = (["-m", "not concurrent", "--durations=15"],
          ["-m", "concurrent", "-n", "2", "-p", "no:cacheprovider", "--durations=10"])


def _lowest_priority() -> None:
    """Idle scheduling for this process and all it starts (kept across fork and exec)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed: the lowest nice
        os.nice(19)


def main(extra: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-q", *extra]
    with tempfile.TemporaryFile("w+") as log:
        beside = subprocess.Popen([*pytest, *PASSES[1]], stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=_lowest_priority)
        try:
            alone = subprocess.call([*pytest, *PASSES[0]])
        except KeyboardInterrupt:
            beside.terminate()
            raise
        beside_code = beside.wait()
        log.seek(0)
        sys.stdout.write(log.read())
    return alone or beside_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
