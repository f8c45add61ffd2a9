"""``ddp-profile gate --against REF`` refuses bad input with one line and its exit code before
anything launches or is checked out (the real CLI, in a subprocess, in a real git
repository)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddp_profile.errors import ExitCode

PROJECT = 'script = "train.py"\nnum_workers = [0]\n'


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def cli(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddp_profile", "gate", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def repo(tmp_path):
    """HEAD~1 holds only a README; HEAD adds train.py and the project file."""
    git(tmp_path, "init", "-q")
    (tmp_path / "README").write_text("x\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "readme")
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "ddp-profile.toml").write_text(PROJECT)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "train")
    return tmp_path


def one_line(done: subprocess.CompletedProcess, code: int, *words: str) -> str:
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp-profile: error: "), done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("args, project, code, words", [
    (["--against", "no-such-branch"], PROJECT, ExitCode.USAGE, ["no such revision"]),
    (["--against", "HEAD~1"], PROJECT, ExitCode.SCRIPT_NOT_FOUND,
     ["the reference has no train.py"]),
    (["--against", "HEAD", "--max-launches", "3"], PROJECT, ExitCode.USAGE,
     ["--max-launches", "below"]),
    (["--against", "HEAD"], PROJECT.replace("[0]", "[0, 2]"), ExitCode.USAGE,
     ["one configuration"]),
    (["--against", "HEAD"], PROJECT + "max_launches = 2\n", ExitCode.USAGE, ["max_launches"]),
    ([], PROJECT + 'against = "HEAD~1"\n', ExitCode.SCRIPT_NOT_FOUND,
     ["the reference has no train.py"]),
])
def test_bad_references_and_settings_are_one_line_and_leave_nothing(repo, args, project, code,
                                                                     words):
    (repo / "ddp-profile.toml").write_text(project)
    one_line(cli(repo, *args), code, *words)
    assert git(repo, "worktree", "list").count("\n") == 0
    assert not os.path.exists(repo / "ddp-profile-gate")


def test_no_repository_no_project_file_and_a_used_out_directory(repo, tmp_path_factory):
    bare = tmp_path_factory.mktemp("bare")
    (bare / "train.py").write_text("")
    (bare / "ddp-profile.toml").write_text(PROJECT)
    one_line(cli(bare, "--against", "HEAD"), ExitCode.USAGE, "not in a git repository")
    empty = tmp_path_factory.mktemp("empty")
    one_line(cli(empty, "--against", "HEAD"), ExitCode.USAGE, "needs a project file")
    (repo / "used").mkdir()
    (repo / "used" / "gate.json").write_text("{}")
    one_line(cli(repo, "--against", "HEAD", "--out", "used"), ExitCode.USAGE,
             "exists and is not empty")
    assert (repo / "used" / "gate.json").read_text() == "{}"  # nothing lost


def test_the_first_launch_sizes_every_launch_to_the_measure_time_within_the_cap():
    """At 43 steps a second the default 20 s window is 860 steps (the on/off load moves a
    10 s window by 4.7 % a launch, a 20 s one by 2 %); a slow first launch is not stretched
    past the cap, and a fast one never measures fewer than the file's steps."""
    from types import SimpleNamespace

    from ddp_profile.commands.against import MAX_STEPS_FACTOR, MEASURE_S, PairedRequest, launch_plan

    def first(steps_per_s: float) -> SimpleNamespace:
        return SimpleNamespace(ranks=[SimpleNamespace(step_time_median_s=1 / steps_per_s),
                                      SimpleNamespace(step_time_median_s=0.5 / steps_per_s)])

    request = PairedRequest(against="HEAD~1", script="train.py", script_args=(), out="out")
    assert MEASURE_S == 20.0
    warmup, steps = launch_plan(request, first(43.0))
    assert steps == 860 and warmup >= request.warmup
    assert launch_plan(request, first(1000.0))[1] == MAX_STEPS_FACTOR * request.steps
    assert launch_plan(request, first(0.5))[1] == request.steps  # slower than 1 step in 2 s


def test_only_a_previous_gates_own_output_is_replaceable(tmp_path):
    """What ``gate --against`` replaces in its ``--out``: a paired job's sides and gate.json
    (and the files this job's own --junit/--markdown/--json name), never anything else."""
    import json

    from ddp_profile.commands.against import clear_previous, not_gate_output

    out = tmp_path / "out"
    assert not_gate_output(str(out)) is None
    out.mkdir()
    assert not_gate_output(str(out)) is None
    for side in ("reference", "current"):
        (out / side / "probes").mkdir(parents=True)
        (out / side / "run.json").write_text(json.dumps({"gate": {"side": side}}))
    (out / "gate.json").write_text(json.dumps({"mode": "paired", "status": "pass"}))
    assert not_gate_output(str(out)) is None
    (out / "gate.xml").write_text("<testsuite/>")
    assert "gate.xml" in not_gate_output(str(out))
    written = (str(out / "gate.xml"),)
    assert not_gate_output(str(out), written) is None
    clear_previous(str(out), written)
    assert sorted(os.listdir(out)) == ["gate.xml"]  # overwritten by the job, not removed

    (out / "current").mkdir()
    (out / "current" / "run.json").write_text(json.dumps({"script": "train.py"}))  # a plain run
    assert "current" in not_gate_output(str(out), written)
    clear_previous(str(out), written)
    assert (out / "current" / "run.json").exists()  # refused, so nothing is removed
    (out / "current" / "run.json").unlink()
    (out / "current").rmdir()
    (out / "gate.json").write_text("{}")
    assert "gate.json" in not_gate_output(str(out), written)
    (out / "gate.json").unlink()
    (tmp_path / "file").write_text("x")
    assert not_gate_output(str(tmp_path / "file")) == "not a directory"
    (tmp_path / "link").symlink_to(out)  # a link to a gate's directory is that directory
    assert not_gate_output(str(tmp_path / "link"), written) is None
