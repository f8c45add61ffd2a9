"""``ddp-profile gate --against REF`` in a temporary git repository, end to end: the real CLI,
a git worktree of the reference, real torchrun launches of both sides alternated.

The repository's ``train.py`` runs the built-in workload with a step dominated by one known
sleep (as tests/e2e/test_gate.py's, steady on a busy 2-core machine): 50 ms at HEAD~1 and HEAD;
the working tree makes it 75 ms (a third slower). HEAD~2 is a script that fails to start. The
project file pins one configuration and a 20 % tolerance (a 2-core CI box shared with other
tests: unchanged code must pass there in a few launches; at 15 % it took all 9 beside another
test, its interval's low end at 0.874). One rank with one intra-op thread
(``ONE_THREAD``): with torch's default threads, one rank beside other tests read 81 and 94
samples/s in its first two launches, then 127, and ended inconclusive; a second rank doubles
each launch's start-up (the suite is CPU-bound) and adds nothing the gate reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest

from ddp_profile.errors import ExitCode
from tests.conftest import DEMO, ONE_THREAD, probe_processes, run_cli

pytestmark = pytest.mark.e2e

WRAPPER = """import runpy
import sys

STEP_SLEEP_MS = "{ms}"
sys.argv = [{demo!r}, *sys.argv[1:], "--step-sleep-ms", STEP_SLEEP_MS]
runpy.run_path({demo!r}, run_name="__main__")
"""
PROJECT = """script = "train.py"
args = ["--hidden", "32", "--layers", "1", "--batch-size", "8"]
num_workers = [0]
nproc_per_node = 1
steps = 20
warmup = 20
max_regression = 0.2
max_launches = 9
measure_s = 1.0
"""


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("paired")
    git(root, "init", "-q")
    (root / "ddp-profile.toml").write_text(PROJECT)
    for text, message in (("raise SystemExit('cannot start: no such dataset')\n", "broken"),
                          (WRAPPER.format(ms=50, demo=DEMO), "50 ms"),
                          (WRAPPER.format(ms=50, demo=DEMO) + "# unchanged speed\n", "comment")):
        (root / "train.py").write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-qm", message)
    return root


DEFAULT_OUT = "ddp-profile-gate"


def gate(repo, name: str, *args: str, default_out: bool = False):
    """The gate's job, its outputs named ``name``; its run directory ``name`` too, or where
    ``default_out`` none given (``DEFAULT_OUT``)."""
    out = str(repo / (DEFAULT_OUT if default_out else name))
    result = run_cli(["gate", *([] if default_out else ["--out", out]),
                      "--json", str(repo / f"{name}.json"), "--junit", str(repo / f"{name}.xml"),
                      "--markdown", str(repo / f"{name}.md"), *args], out=out, timeout=600,
                     env=ONE_THREAD)
    document = None
    if os.path.exists(repo / f"{name}.json"):
        document = json.loads((repo / f"{name}.json").read_text())
    return result, document


def current_launches(out) -> int:
    return len([line for line in open(out / "current" / "ledger.jsonl") if line.strip()])


@pytest.fixture(scope="module")
def same(repo):
    """The gate against HEAD~1 on unchanged code, in the default ``ddp-profile-gate``: what it
    printed and wrote as it ended, before a later job replaces that directory (the first of
    the two jobs of the twice-in-one-directory test)."""
    out = repo / DEFAULT_OUT
    result, document = gate(repo, "same", "--against", "HEAD~1", default_out=True)
    return {"result": result, "document": document, "current": current_launches(out),
            "gate.json": json.loads((out / "gate.json").read_text())}


@pytest.fixture(scope="module")
def slow(repo, same):
    """The gate against HEAD~1 with the working tree made slower (uncommitted), in the same
    default ``ddp-profile-gate`` as ``same``'s job: a developer's second job there, after a
    change. What it printed and wrote, the launches each side's directory held, and the
    repository's state, each read as the job ended."""
    out = repo / DEFAULT_OUT
    (repo / "train.py").write_text(WRAPPER.format(ms=75, demo=DEMO))  # uncommitted
    try:
        result, document = gate(repo, "slow", "--against", "HEAD~1", default_out=True)
        worktrees = git(repo, "worktree", "list")
    finally:
        git(repo, "checkout", "--", "train.py")
    return {"result": result, "document": document, "current": current_launches(out),
            "gate.json": json.loads((out / "gate.json").read_text()),
            "ledgers": [len(open(out / side / "ledger.jsonl").readlines())
                        for side in ("reference", "current")],
            "worktrees": worktrees, "processes": probe_processes()}


def test_gate_against_head_1_passes_unchanged_code_and_fails_a_slower_working_tree(
        repo, same, slow):
    result, written, same = same["result"], same["gate.json"], same["document"]
    assert result.returncode == ExitCode.OK, result.stdout + result.stderr
    assert same["status"] == "pass" and same["mode"] == "paired"
    sides = [launch["side"] for launch in same["launches"]]
    assert len(sides) >= 5 and len(sides) % 2 == 1
    assert sides == ["reference", "current"] * (len(sides) // 2) + ["reference"]
    assert 0.8 < same["verdict"]["low"] <= same["verdict"]["ratio"] <= same["verdict"]["high"]
    assert same["against"].startswith("HEAD~1 (")
    assert written["status"] == "pass"

    result, document = slow["result"], slow["document"]
    assert result.returncode == ExitCode.REGRESSION, result.stdout + result.stderr
    assert document["status"] == "regression" and document["verdict"]["high"] < 0.8
    assert 0.55 < document["verdict"]["ratio"] < 0.8  # 50 ms against 75 ms (and the rest)
    failure = ET.parse(repo / "slow.xml").getroot().find(".//failure")
    assert failure is not None and "slower beyond the 20 % tolerance" in failure.get("message")
    markdown = (repo / "slow.md").read_text()
    assert "REGRESSION" in markdown and "| 2 | B current |" in markdown
    assert "REGRESSION" in result.stdout and "B current" in result.stdout
    # both sides' launches are real probes, in their own run directories
    assert slow["ledgers"][0] == slow["ledgers"][1] + 1
    assert slow["worktrees"].count("\n") == 0  # the checkouts are gone
    tracked = [line for line in git(repo, "status", "--porcelain").splitlines()
               if not line.startswith("??")]
    assert tracked == []  # the working tree as it was
    assert slow["processes"] == []


def test_a_reference_that_fails_to_start_is_one_line_and_keeps_what_ran(repo):
    result, document = gate(repo, "broken", "--against", "HEAD~2")
    assert result.returncode == ExitCode.SCRIPT_FAILED, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ddp-profile:")]
    assert len(errors) == 1 and "the reference side (HEAD~2" in errors[0]
    assert document is None
    assert os.path.exists(repo / "broken" / "reference" / "ledger.jsonl")
    assert git(repo, "worktree", "list").count("\n") == 0
    assert not probe_processes()


def test_the_gate_run_twice_in_one_directory_gives_a_verdict_both_times(repo, same, slow):
    """A developer re-running the gate after a change: the second job (``slow``'s) replaces
    the first's (``same``'s) output in the default ``ddp-profile-gate``; a directory holding
    anything else is refused."""
    out = repo / DEFAULT_OUT
    documents = [same["gate.json"], slow["gate.json"]]
    assert [document["status"] for document in documents] == ["pass", "regression"]
    # the directory held each job's launches alone, not the previous job's as well
    for job, document in zip((same, slow), documents):
        assert job["current"] == sum(launch["side"] == "current"
                                     for launch in document["launches"])
    assert documents[0]["launches"][0]["probe_id"] == documents[1]["launches"][0]["probe_id"]
    (out / "notes.txt").write_text("mine\n")
    refused = run_cli(["gate", "--against", "HEAD~1", "--quiet"], out=str(out), env=ONE_THREAD)
    errors = refused.stderr.strip().splitlines()
    assert refused.returncode == ExitCode.USAGE and len(errors) == 1, refused.stderr
    assert "not a previous gate's output" in errors[0] and "notes.txt" in errors[0]
    assert (out / "notes.txt").read_text() == "mine\n"
    assert json.loads((out / "gate.json").read_text()) == documents[1]  # nothing lost
    assert git(repo, "worktree", "list").count("\n") == 0
    assert not probe_processes()
