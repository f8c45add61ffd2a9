"""Start the ranks of one probe, bound it in time, and clean up every process it made.

A probe is one launch: torch's own launcher (``--launcher torchrun``), the script itself when
it starts its own ranks (``--launcher none``), or, inside an allocation that already started
the ranks (SLURM, a PyTorchJob, an outer torchrun), the script in this process's place.

Torch's launcher is ``torch.distributed.run.main``, the function ``python -m
torch.distributed.run`` calls, with the same arguments, in a process forked from a fork server
that imported it once per sweep (``_Agent``): importing torch costs seconds on a small machine,
and every probe would pay it again before its ranks even start. The ranks themselves are
started by that launcher exactly as under torchrun.

Every process of the probe inherits a unique ``DDP_PROFILE_PROBE_TAG``; after the launch ends —
normally, by timeout or by Ctrl-C — any process still carrying the tag is killed, so ranks and
DataLoader workers that escaped into their own sessions are not left behind.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ddp_profile.profiler.rank.hook import HOOK_DIR
from ddp_profile.profiler.settings import (
    ENV_ACTIVE,
    ENV_HARNESS_PID,
    ENV_PLAN,
    ENV_PROBE_TAG,
    ProbePlan,
)
from ddp_profile.profiler.store.record import rank_files

KILL_GRACE_S = 3.0


def ignore_hangup() -> Any:
    """Ignore SIGHUP (a closed terminal must not stop a sweep; Ctrl-C still does, cleanly).

    Returns the previous handler for :func:`restore_hangup` (None where there is no SIGHUP).
    """
    if not hasattr(signal, "SIGHUP"):
        return None
    return signal.signal(signal.SIGHUP, signal.SIG_IGN)


def restore_hangup(previous: Any) -> None:
    """Put back the SIGHUP handler :func:`ignore_hangup` returned."""
    if previous is not None:
        signal.signal(signal.SIGHUP, previous)


@dataclass(frozen=True)
class LaunchSpec:
    """How to start the script's ranks; the same for every probe of a run."""

    script: str
    script_args: tuple[str, ...] = ()
    launcher: str = "torchrun"  # torchrun | none | inplace (one rank of an existing allocation)
    nproc_per_node: int = 2
    torchrun_args: tuple[str, ...] = ()  # --nnodes, --node-rank, --rdzv-* passed through
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def command(self, plan: Optional[ProbePlan] = None) -> list[str]:
        if self.launcher in ("none", "inplace"):
            return [sys.executable, "-u", self.script, *self.script_args]
        return [sys.executable, "-m", "torch.distributed.run", *self.torchrun_argv(plan)]

    def torchrun_argv(self, plan: Optional[ProbePlan] = None) -> list[str]:
        """torchrun's arguments for this launch (after ``-m torch.distributed.run``)."""
        rendezvous = list(self.torchrun_args) or ["--standalone"]
        if self.torchrun_args and plan is not None:
            # a fresh rendezvous per probe; node 0 hosts it (several "nodes" may share a host)
            node_rank = next((a.split("=", 1)[1] for a in self.torchrun_args
                              if a.startswith("--node-rank=")), "0")
            rendezvous += [f"--rdzv-id={plan.rdzv_id or plan.probe_id}",
                           f"--rdzv-conf=is_host={'true' if node_rank == '0' else 'false'}"]
        return [*rendezvous, f"--nproc-per-node={self.nproc_per_node}", "--max-restarts=0",
                "--monitor-interval=0.2", self.script, *self.script_args]


@dataclass
class LaunchOutcome:
    returncode: Optional[int]
    timed_out: bool
    interrupted: bool
    wall_s: float
    log_path: str
    strays_killed: int = 0
    stopped: bool = False  # ended early because ``watch`` said what it measured was enough
    hung_at_exit: bool = False  # ended by the harness END_GRACE_S after every rank recorded
    # its end: read as finished


def probe_env(spec: LaunchSpec, plan: ProbePlan, tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(dict(spec.extra_env))
    python_path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = HOOK_DIR + (os.pathsep + python_path if python_path else "")
    env[ENV_ACTIVE] = "1"
    env[ENV_PLAN] = plan.to_json()
    env[ENV_PROBE_TAG] = tag
    env["DDP_PROFILE_SCRIPT"] = os.path.abspath(spec.script)
    env[ENV_HARNESS_PID] = str(os.getpid())
    env.setdefault("PYTHONUNBUFFERED", "1")
    if plan.threads:  # the threads counterfactual: OpenMP/MKL read these at start-up
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = str(plan.threads)
    return env


def new_tag() -> str:
    return uuid.uuid4().hex


WATCH_EVERY_S = 1.0  # how often a watched launch asks its watch
END_GRACE_S = 10.0  # how long ranks that all recorded their script's end may take to exit


def all_ended(out_dir: str, ranks: int) -> Callable[[], bool]:
    """Whether ``ranks`` rank record files in ``out_dir`` each end with the rank's ``end``
    record: the script is done and its records are whole (``rank.instrument.finish``)."""
    def ended() -> bool:
        files = rank_files(out_dir)
        return len(files) >= ranks and all(_ends(path) for path in files)
    return ended


def _ends(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 4096))
            last = handle.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
        return json.loads(last).get("kind") == "end"
    except (OSError, ValueError, AttributeError):
        return False


def launch(spec: LaunchSpec, plan: ProbePlan, timeout_s: float, tag: Optional[str] = None,
           watch: Optional[Callable[[], bool]] = None) -> LaunchOutcome:
    """Run one probe to completion, timeout or interruption, or until ``watch()`` (asked
    every ``WATCH_EVERY_S``) says to stop; never leave a process behind. Ranks under torch's
    launcher that all recorded their script's end get ``END_GRACE_S`` to exit; then they are
    ended, and the launch is read as finished (``hung_at_exit``: a gloo teardown can
    deadlock, ``rank.patches.comm_calls.process_group_destroy``)."""
    os.makedirs(plan.out_dir, exist_ok=True)
    log_path = os.path.join(plan.out_dir, "launcher.log")
    tag = tag or new_tag()
    started = time.monotonic()
    timed_out = interrupted = stopped = hung = False
    ended = all_ended(plan.out_dir, spec.nproc_per_node) if spec.launcher == "torchrun" \
        else None
    env = probe_env(spec, plan, tag)
    with open(log_path, "ab") as log:
        process: Any = _Agent(spec.torchrun_argv(plan), env, log_path) \
            if spec.launcher == "torchrun" else subprocess.Popen(
                spec.command(plan), env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            stopped, hung = _wait(process, started + timeout_s, watch, ended)
        except subprocess.TimeoutExpired:
            timed_out = True
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if process.poll() is None:
                _terminate_group(process)
            strays = kill_tagged(tag)
    outcome = LaunchOutcome(returncode=0 if hung else process.returncode,
                            timed_out=timed_out, interrupted=interrupted,
                            wall_s=time.monotonic() - started, log_path=log_path,
                            strays_killed=strays, stopped=stopped, hung_at_exit=hung)
    if interrupted:
        raise KeyboardInterrupt
    return outcome


def _wait(process: Any, deadline: float, watch: Optional[Callable[[], bool]],
          ended: Optional[Callable[[], bool]] = None) -> tuple[bool, bool]:
    """Wait for ``process`` until ``deadline`` (``TimeoutExpired`` past it); (stopped, hung):
    stopped where ``watch`` asked to stop it first, hung where ``ended`` held ``END_GRACE_S``
    and the process had not exited."""
    ended_at: Optional[float] = None
    while True:
        left = deadline - time.monotonic()
        if (watch is None and ended is None) or left <= WATCH_EVERY_S:
            process.wait(timeout=max(left, 0.0))
            return False, False
        try:
            process.wait(timeout=WATCH_EVERY_S)
            return False, False
        except subprocess.TimeoutExpired:
            if watch is not None and watch():
                return True, False
            if ended is not None and ended():
                ended_at = ended_at if ended_at is not None else time.monotonic()
                if time.monotonic() - ended_at >= END_GRACE_S:
                    return False, True
            else:
                ended_at = None


_FORK_SERVER: Optional[Any] = None


def _fork_server() -> Any:
    """The multiprocessing context whose fork server imported torch's launcher (once,
    ``launch.agent_server``)."""
    global _FORK_SERVER
    if _FORK_SERVER is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch.distributed.run",
                                        "ddp_profile.profiler.launch.agent_server"])
        _FORK_SERVER = context
    return _FORK_SERVER


def _run_agent(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """In the forked process: its own session (the probe's process group), the log as its
    output, the probe's environment, then torch's launcher as ``python -m
    torch.distributed.run ARGV`` runs it; exits with its status (1 where a rank failed)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["torchrun", *argv]
    code = 0
    try:
        from torch.distributed.run import main

        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a failed rank (ChildFailedError), a bad argument
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    os._exit(code)


class _Agent:
    """Torch's launcher in a process forked from the fork server, behind ``Popen``'s
    ``wait`` / ``poll`` / ``returncode`` / ``pid``."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: str):
        self._process = _fork_server().Process(target=_run_agent, args=(argv, env, log_path),
                                               daemon=False)
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> Optional[int]:
        return self._process.exitcode

    def poll(self) -> Optional[int]:
        return self._process.exitcode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("torch.distributed.run", timeout or 0.0)
        return self._process.exitcode


def _terminate_group(process: Any) -> None:
    """SIGTERM the launcher's process group (torchrun forwards it), then SIGKILL."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def tagged_pids(tag: str) -> list[int]:
    """PIDs of live processes whose environment carries ``DDP_PROFILE_PROBE_TAG=tag``."""
    needle = f"{ENV_PROBE_TAG}={tag}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def kill_tagged(tag: str, rounds: int = 5) -> int:
    """SIGKILL every process of the probe still alive; return how many there were."""
    killed = 0
    for _ in range(rounds):
        pids = tagged_pids(tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return killed
