"""The environment-activated start-up hook.

The harness puts ``profiler/rank/hookdir`` first on ``PYTHONPATH`` and sets ``DDP_PROFILE=1`` and
``DDP_PROFILE_PLAN``; its ``sitecustomize`` calls ``activate()`` in every Python process of the
probe — the launcher, each rank however it was started (torchrun, ``mp.spawn``, ``srun``), and
spawned DataLoader workers. Nothing is patched until the process imports torch, and the patches
pass straight through inside DataLoader workers. Without ``DDP_PROFILE=1`` this module does
nothing, and importing ``ddp_profile`` never activates it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any, Optional, Sequence

from ddp_profile.profiler.settings import ENV_HARNESS_PID, ProbePlan

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hookdir")


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Finds ``torch`` with the normal finders and installs the instrumentation after it loads."""

    def __init__(self, plan: ProbePlan):
        self.plan = plan

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original_exec = loader.exec_module
        plan = self.plan

        def exec_module(module: Any) -> None:
            original_exec(module)
            _install(plan)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install(plan: ProbePlan) -> None:
    try:
        from ddp_profile.profiler.rank import instrument

        instrument.install(plan)
    except Exception as exc:  # noqa: BLE001 - never break the user's script
        print(f"ddp-profile: instrumentation not installed: {type(exc).__name__}: {exc}",
              file=sys.stderr)


def _inject_local_rank(flag: str) -> None:
    """Legacy ``torch.distributed.launch`` scripts expect ``--local_rank=N`` in argv."""
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None or len(sys.argv) < 1 or any(a.startswith(flag) for a in sys.argv[1:]):
        return
    sys.argv.insert(1, f"{flag}={local_rank}")


def _watch_harness(pid: int, interval_s: float = 1.0) -> None:
    """Exit this probe process if the ddp-profile process that launched it is gone.

    A harness killed with SIGKILL cannot clean up; its probe's processes, started in their own
    sessions, end themselves instead. The check is a signal-0 ``kill`` once a second.
    """
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(137)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="ddp-profile-harness-watch", daemon=True).start()


LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _command_line() -> list[str]:
    orig = getattr(sys, "orig_argv", None)
    if orig:
        return list(orig)
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            return [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return list(sys.argv)


def is_launcher_process(argv: Optional[Sequence[str]] = None) -> bool:
    """True in torch's launcher (``python -m torch.distributed.run``): it runs no training."""
    argv = list(argv) if argv is not None else _command_line()
    if len(argv) > 1 and os.path.basename(argv[1]) == "torchrun":
        return True
    for index in range(1, len(argv)):  # interpreter options come before the script
        if argv[index] == "-m":
            return index + 1 < len(argv) and argv[index + 1] in LAUNCHER_MODULES
        if not argv[index].startswith("-"):
            return False
    return False


def activate(environ: Optional[dict[str, str]] = None) -> bool:
    """Install the instrumentation if this process belongs to a probe; return whether it does."""
    plan = ProbePlan.from_env(environ)
    if plan is None:
        return False
    harness = (environ or os.environ).get(ENV_HARNESS_PID, "")
    if harness.isdigit():
        _watch_harness(int(harness))
    if is_launcher_process():
        return False
    if plan.inject_local_rank and os.environ.get("DDP_PROFILE_SCRIPT") and sys.argv and \
            os.path.abspath(sys.argv[0]) == os.environ["DDP_PROFILE_SCRIPT"]:
        _inject_local_rank(plan.inject_local_rank)
    if "torch" in sys.modules:
        _install(plan)
    else:
        sys.meta_path.insert(0, _TorchImportWatcher(plan))
    return True
