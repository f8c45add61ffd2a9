"""The real-scripts benchmark's parts: a configuration as the script's own arguments, how a
run's recommendation is scored against the plain grid, and a plain launch that hangs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import real_scripts  # noqa: E402


def test_a_configuration_launches_as_the_scripts_own_flags():
    timm = real_scripts.timm(argparse.Namespace(timm_script="train.py", images="/imgs",
                                                epochs=4))
    args = timm.args({"num_workers": 2, "batch_size": 64})
    assert args[args.index("-j") + 1] == "2" and args[args.index("-b") + 1] == "64"
    assert timm.idle[timm.idle.index("--epochs") + 1] == "0"
    assert real_scripts.key(timm.own) in {real_scripts.key(c) for c in timm.grid}
    assert {c["batch_size"] for c in timm.grid} == {32, 64}  # the search moves the batch too
    mlp = real_scripts.short_mlp(argparse.Namespace())
    assert mlp.args({"num_workers": 0, "batch_size": 256}) == ["--num-workers", "0",
                                                               "--batch-size", "256"]


def test_a_run_is_scored_against_the_grids_best_and_its_own_interval():
    mlp = real_scripts.short_mlp(argparse.Namespace())
    speeds = {(2, 64): 1.0, (0, 64): 1.2, (0, 256): 2.0}
    run = {"recommended": {"num_workers": 0, "batch_size": 64}, "interval": [1.1, 1.4]}
    scored = real_scripts.score(run, speeds, mlp)
    assert scored["of_best"] == 0.6 and scored["inside"] is True
    missed = real_scripts.score({**run, "interval": [1.3, 1.5]}, speeds, mlp)
    assert missed["inside"] is False


def test_a_setting_the_command_line_cannot_change_is_reported_not_scored():
    lightning = real_scripts.Script("bbc.py", 2, lambda c: ["--data.batch_size",
                                                            str(c["batch_size"])],
                                    {"num_workers": 0, "batch_size": 32},
                                    [{"num_workers": 0, "batch_size": b} for b in (32, 64)],
                                    None, fixed=(("num_workers", 0),))
    assert real_scripts.settable(lightning, {"num_workers": 0, "batch_size": 64})
    assert not real_scripts.settable(lightning, {"num_workers": 2, "batch_size": 32})
    run = {"recommended": {"num_workers": 2, "batch_size": 32}, "interval": [1.1, 1.4]}
    scored = real_scripts.score(run, {(0, 32): 1.0, (0, 64): 1.3}, lightning)
    assert scored["plain_speed"] is None and "not settable" in scored["note"]
    assert "of_best" not in scored


def test_settings_written_in_the_source_are_launched_from_an_edited_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(real_scripts.tempfile, "tempdir", str(tmp_path))  # the copies' folder
    source = tmp_path / "cv_example.py"
    source.write_text('config = {"lr": 3e-2, "batch_size": 64}\n'
                      'train = DataLoader(a, batch_size=64, num_workers=4)\n'
                      'val = DataLoader(b, batch_size=64, num_workers=4)\n')
    cache = tmp_path / "hub"
    script = real_scripts.accelerate(argparse.Namespace(
        accelerate_script=str(source), pets=str(tmp_path), hf_cache=str(cache)))
    assert not script.fixed and {(2, 128), (4, 64)} <= {real_scripts.key(c) for c in script.grid}
    argv = real_scripts.command(script, script.args(script.own),
                                {"num_workers": 2, "batch_size": 128})
    copy = argv[argv.index("--data_dir") - 1]
    text = open(copy).read()
    assert text.count("num_workers=2") == 2 and '"batch_size": 128' in text
    assert "num_workers=4" not in text and source.read_text().count("num_workers=4") == 2
    # the script's own settings launch a copy too: every launch of the grid alike
    assert real_scripts.command(script, [], script.own)[5] != str(source)
    source.write_text("loader = DataLoader(a, num_workers=8)\n")
    try:
        real_scripts.accelerate(argparse.Namespace(accelerate_script=str(source),
                                                   pets=str(tmp_path), hf_cache=str(cache)))
    except SystemExit as stop:
        assert "the script changed" in str(stop)
    else:
        raise AssertionError("a script without the text to edit was accepted")


def test_the_grid_also_launches_what_the_runs_recommended_and_named_unsettled():
    w1 = {"num_workers": 1, "batch_size": 32}
    w2_64 = {"num_workers": 2, "batch_size": 64}
    runs = [{"recommended": w1, "unsettled": [(w2_64, 1.48)]}, {"exit": 1, "error": ["x"]},
            {"recommended": w1, "unsettled": []}]
    assert real_scripts.seen(runs) == [w1, w1, w2_64]


def test_a_workload_that_times_its_loop_is_scored_by_it_too():
    """The short MLP prints its training loop's seconds: a plain launch reads them, and a run
    is scored by that grid beside the whole-process one."""
    mlp = real_scripts.short_mlp(argparse.Namespace())
    printed = [sys.executable, "-c", "print('epoch 1'); print('training loop: 1.2500 s')"]
    seconds, loop = real_scripts.wall(printed, dict(os.environ), ".", mlp.loop)
    assert seconds is not None and seconds > 0 and loop == 1.25
    assert real_scripts.wall([sys.executable, "-c", "pass"], dict(os.environ), ".",
                             mlp.loop)[1] is None
    assert real_scripts.wall([sys.executable, "-c", "raise SystemExit(3)"],
                             dict(os.environ), ".") == (None, None)
    grid = real_scripts.speeds({(2, 64): [3.6, 3.5, 3.4], (0, 256): [1.4, 1.3]}, mlp)
    assert grid == {(2, 64): 1.0, (0, 256): 3.5 / 1.35}
    run = {"recommended": {"num_workers": 0, "batch_size": 256}, "interval": [2.5, 3.0]}
    scored = real_scripts.score(real_scripts.score(run, {(2, 64): 1.0, (0, 256): 1.8}, mlp),
                                grid, mlp, "_loop")
    assert scored["inside"] is False and scored["inside_loop"] is True
    assert scored["of_best"] == scored["of_best_loop"] == 1.0
    assert real_scripts.score(run, {}, mlp, "_loop") == run  # no loop printed: not scored


def test_a_run_below_the_grids_best_is_checked_against_it_head_to_head(monkeypatch):
    """The recommendation and the grid's best, alternated in plain launches (the best first),
    whole process less a launch of no epoch: the median of the pairs' ratios, measured once
    per recommendation; a run at the best is not checked."""
    mlp = real_scripts.short_mlp(argparse.Namespace())
    seconds = {"256": iter([3.0, 3.2, 2.9]), "128": iter([3.1, 3.4, 3.0])}
    launched = []

    def wall(argv, env, cwd, loop=None, timeout_s=1800.0):
        size = argv[argv.index("--batch-size") + 1] if "--batch-size" in argv else None
        launched.append(size)
        return (1.0 if size is None else next(seconds[size])), None

    monkeypatch.setattr(real_scripts, "wall", wall)
    grid = {(2, 64): 1.0, (0, 128): 2.2, (0, 256): 2.5}
    mine = {"num_workers": 0, "batch_size": 128}
    runs = [real_scripts.score({"recommended": mine, "interval": [2.0, 2.4]}, grid, mlp)
            for _ in range(2)]
    runs.append(real_scripts.score({"recommended": {"num_workers": 0, "batch_size": 256},
                                    "interval": [2.0, 2.8]}, grid, mlp))
    checked = real_scripts.checked(runs, mlp, 3, ".", grid, mlp.grid)
    assert launched == [None, "256", "128", "256", "128", "256", "128"]  # once, best first
    # pairs 2/2.1, 2.2/2.4, 1.9/2: the median
    assert checked[0]["of_best_paired"] == checked[1]["of_best_paired"] == 0.95
    assert "of_best_paired" not in checked[2] and checked[2]["of_best"] == 1.0
    assert real_scripts.checked(runs, mlp, 0, ".", grid, mlp.grid) == runs  # --check-pairs 0


def test_a_kept_run_is_read_again_without_launching(tmp_path, monkeypatch):
    monkeypatch.setattr(real_scripts.subprocess, "run", None)  # nothing may be launched
    (tmp_path / "run-0").mkdir()
    (tmp_path / "run-0" / "summary.json").write_text(json.dumps({
        "recommended": {"num_workers": 1, "batch_size": 32}, "expected_speedup": 1.2,
        "expected_speedup_interval": [1.0, 1.4], "recommendation": {"unsettled": []},
        "probes": [{"status": "ok"}, {"status": "crash"}]}))
    mlp = real_scripts.short_mlp(argparse.Namespace())
    run = real_scripts.tool_run(mlp, 0, str(tmp_path), reuse=True)
    assert run["recommended"] == {"num_workers": 1, "batch_size": 32}
    assert run["interval"] == [1.0, 1.4] and (run["probes_ok"], run["probes"]) == (1, 2)
    assert run["reused"] == str(tmp_path / "run-0")


def test_a_plain_launch_that_hangs_is_killed_with_its_children_and_counts_as_failed(tmp_path):
    pid_file = tmp_path / "child.pid"
    hangs = ("import subprocess, sys, time\n"
             "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
             f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
             "time.sleep(120)\n")
    started = time.monotonic()
    assert real_scripts.wall([sys.executable, "-c", hangs], dict(os.environ), str(tmp_path),
                             timeout_s=3.0) == (None, None)
    assert time.monotonic() - started < 60
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)  # the launcher's own children go with it, as a rank's workers
    seconds, _loop = real_scripts.wall([sys.executable, "-c", "pass"], dict(os.environ),
                                       str(tmp_path), timeout_s=60.0)
    assert seconds is not None and seconds > 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:  # a zombie: gone too
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
