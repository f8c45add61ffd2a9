"""One exception hierarchy for the whole tool; each class carries its exit code.

The CLI is the only place these become exit codes (see ``ddp_profile.cli``). The codes are
part of the public surface and documented in the README.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of ``ddp-profile``; stable, documented in the README."""

    OK = 0
    REGRESSION = 1  # gate: the current run is slower than the baseline
    USAGE = 2  # bad option or value (also typer's own code for unknown options)
    SCRIPT_NOT_FOUND = 3
    SCRIPT_INVALID = 4  # the script does not compile (syntax error)
    SCRIPT_FAILED = 5  # every probe crashed or ran out of memory
    NO_DATALOADER = 6  # the script finished without iterating a DataLoader
    PROBE_TIMEOUT = 7  # every probe timed out
    BAD_RUN_DIR = 8  # missing, unreadable or corrupt run directory / baseline file
    INCONCLUSIVE = 9  # gate: too few samples to decide
    INCOMPARABLE = 10  # gate: different hardware, world size or torch version
    INTERNAL = 70
    INTERRUPTED = 130


class DdpProfileError(Exception):
    """Base class: an error the user can act on, reported as one line."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UsageError(DdpProfileError):
    exit_code = ExitCode.USAGE


class ScriptNotFound(DdpProfileError):
    exit_code = ExitCode.SCRIPT_NOT_FOUND


class ScriptInvalid(DdpProfileError):
    exit_code = ExitCode.SCRIPT_INVALID


class ScriptFailed(DdpProfileError):
    exit_code = ExitCode.SCRIPT_FAILED


class NoDataLoader(DdpProfileError):
    exit_code = ExitCode.NO_DATALOADER


class ProbeTimeout(DdpProfileError):
    exit_code = ExitCode.PROBE_TIMEOUT


class BadRunDir(DdpProfileError):
    exit_code = ExitCode.BAD_RUN_DIR


class Incomparable(DdpProfileError):
    exit_code = ExitCode.INCOMPARABLE


class Interrupted(DdpProfileError):
    exit_code = ExitCode.INTERRUPTED
