"""The paired gate's reference side: a git revision checked out beside the working tree, or a
second script.

``checked_out(REF, script)`` yields the :class:`Reference` to launch and removes what it made
when the job ends, however it ends: a revision is checked out as a detached git worktree in a
temporary directory (``git worktree add``), outside the repository, so ``git status`` of the
working tree never shows it, and removed with ``git worktree remove`` afterwards. The current
side is the working tree as it is, uncommitted changes included.

The reference runs its own script (the same path in its tree) with the same arguments, from the
same directory: data paths in the arguments read the same files on both sides. Its modules come
from its tree: the script's own directory is first on ``sys.path`` as always, and the tree's
root (and its ``src/``, where there is one) are put on ``PYTHONPATH`` before the current
side's, so a package the project installs in editable mode is imported from the reference too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Iterator, Optional

from ddp_profile.errors import ScriptNotFound, UsageError


@dataclass(frozen=True)
class Reference:
    """What the gate launches as the reference (``A``)."""

    label: str  # as the reports name it: "origin/main (1a2b3c4d5)" or the script's path
    script: str  # its script, absolute
    python_path: Optional[str] = None  # put before the current side's modules (a revision)
    revision: Optional[str] = None  # the commit, where it is one


def _git(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=120, check=False)
    except FileNotFoundError:
        raise UsageError("--against REF: git is not installed (REF is no file either)") \
            from None


def _top_level(directory: str, ref: str) -> str:
    done = _git(["rev-parse", "--show-toplevel"], directory)
    if done.returncode != 0:
        raise UsageError(f"--against {ref}: {directory} is not in a git repository, and {ref} "
                         f"is no file")
    return done.stdout.strip()


def _commit(top: str, ref: str) -> str:
    done = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], top)
    if done.returncode != 0 or not done.stdout.strip():
        raise UsageError(f"--against {ref}: no such revision in {top} (a shallow clone may "
                         f"lack it: fetch it first, e.g. actions/checkout with fetch-depth: 0)")
    return done.stdout.strip()


def _python_path(tree: str) -> str:
    """The tree's root, and its ``src/`` where it has one, before anything already there."""
    paths = [tree] + ([os.path.join(tree, "src")] if os.path.isdir(os.path.join(tree, "src"))
                      else [])
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join(paths + ([inherited] if inherited else []))


@contextlib.contextmanager
def checked_out(ref: str, script: str) -> Iterator[Reference]:
    """The reference ``ref`` for the current side's ``script`` (see the module docstring).
    Raises ``UsageError`` (not a repository, no such revision) or ``ScriptNotFound`` (the
    revision has no such script) before anything is checked out."""
    if os.path.isfile(ref):
        yield Reference(label=ref, script=os.path.abspath(ref))
        return
    script = os.path.realpath(script)
    top = os.path.realpath(_top_level(os.path.dirname(script), ref))
    commit = _commit(top, ref)
    relative = os.path.relpath(script, top)
    if relative.startswith(os.pardir):
        raise UsageError(f"--against {ref}: the script {script} is outside the repository {top}")
    if _git(["cat-file", "-e", f"{commit}:{relative}"], top).returncode != 0:
        raise ScriptNotFound(f"--against {ref}: the reference has no {relative}")
    scratch = tempfile.mkdtemp(prefix="ddp-profile-reference-")
    tree = os.path.join(scratch, "tree")
    try:
        added = _git(["worktree", "add", "--detach", "--quiet", tree, commit], top)
        if added.returncode != 0:
            detail = (added.stderr or added.stdout).strip().splitlines()
            raise UsageError(f"--against {ref}: git worktree add failed: "
                             f"{detail[-1] if detail else added.returncode}")
        yield Reference(label=f"{ref} ({commit[:9]})", script=os.path.join(tree, relative),
                        python_path=_python_path(tree), revision=commit)
    finally:
        _git(["worktree", "remove", "--force", tree], top)
        shutil.rmtree(scratch, ignore_errors=True)
        _git(["worktree", "prune"], top)
