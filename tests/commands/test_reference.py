"""The paired gate's reference (``commands.reference.checked_out``) in a real git repository:
a revision checked out outside the working tree and removed afterwards, however the job ends;
bad references refused before anything is checked out."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from ddp_profile.commands.reference import checked_out
from ddp_profile.errors import ScriptNotFound, UsageError


def git(repo, *args: str) -> str:
    done = subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    """Two commits of ``train.py``: ``OLD = 1`` at HEAD~1, ``OLD = 2`` at HEAD; the working
    tree changes it again, uncommitted."""
    git(tmp_path, "init", "-q")
    for value in (1, 2):
        (tmp_path / "train.py").write_text(f"OLD = {value}\n")
        git(tmp_path, "add", "train.py")
        git(tmp_path, "commit", "-qm", f"train {value}")
    (tmp_path / "train.py").write_text("OLD = 3\n")
    return tmp_path


def worktrees(repo) -> int:
    return git(repo, "worktree", "list").count("\n") + 1


def test_a_revision_is_checked_out_beside_the_tree_and_removed_after(repo):
    script = str(repo / "train.py")
    with checked_out("HEAD~1", script) as reference:
        assert open(reference.script).read() == "OLD = 1\n"
        assert not reference.script.startswith(str(repo))  # outside the working tree
        assert reference.label.startswith("HEAD~1 (") and reference.revision
        assert reference.python_path.split(os.pathsep)[0] == os.path.dirname(reference.script)
        assert worktrees(repo) == 2
        tree = os.path.dirname(reference.script)
    assert not os.path.exists(tree) and worktrees(repo) == 1
    assert open(script).read() == "OLD = 3\n"  # the working tree as it was
    assert git(repo, "status", "--porcelain") == "M train.py"


def test_the_checkout_is_removed_when_the_job_fails_inside_it(repo):
    with pytest.raises(RuntimeError):
        with checked_out("HEAD", str(repo / "train.py")) as reference:
            tree = os.path.dirname(reference.script)
            raise RuntimeError("the reference crashed")
    assert not os.path.exists(tree) and worktrees(repo) == 1


def test_a_script_as_the_reference_is_launched_as_it_is(repo):
    other = repo / "old_train.py"
    other.write_text("OLD = 0\n")
    with checked_out(str(other), str(repo / "train.py")) as reference:
        assert reference.script == str(other) and reference.python_path is None
    assert other.exists() and worktrees(repo) == 1


def scratch() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("ddp-profile-reference-")}


def test_bad_references_are_refused_before_anything_is_checked_out(repo, tmp_path_factory):
    script = str(repo / "train.py")
    before = scratch()
    with pytest.raises(UsageError, match="no such revision"):
        with checked_out("no-such-branch", script):
            pass
    (repo / "sub").mkdir()
    (repo / "sub" / "new.py").write_text("")
    with pytest.raises(ScriptNotFound, match="the reference has no sub/new.py"):
        with checked_out("HEAD", str(repo / "sub" / "new.py")):
            pass
    bare = tmp_path_factory.mktemp("not_a_repo")
    (bare / "train.py").write_text("")
    with pytest.raises(UsageError, match="not in a git repository"):
        with checked_out("HEAD", str(bare / "train.py")):
            pass
    assert worktrees(repo) == 1 and scratch() == before
