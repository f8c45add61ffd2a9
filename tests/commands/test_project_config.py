"""Project settings (ddp-profile.toml / [tool.ddp-profile]): finding, validation, precedence.

No probe is launched here: the CLI is driven in-process up to the point where it would start
the run, or into an error that comes before any launch.
"""

from __future__ import annotations

import os

import pytest

from ddp_profile import cli
from ddp_profile.commands.project_config import (
    KNOWN_KEYS,
    RUN_DEFAULTS,
    ProjectConfig,
    find_project_config,
    resolve,
    validate,
)
from ddp_profile.errors import ExitCode, UsageError

FULL = """
script = "train.py"
args = ["--epochs", "1", "--data", "/d x"]
nproc_per_node = 4
launcher = "none"
num_workers = [0, 2, 4]
pin_memory = [true, false]
prefetch_factor = "2,4"
batch_size = 64
steps = 40
warmup = 3
timeout = 90
search = "grid"
pairs = 0
ceiling = false
comm = false
repeat = 3
cache = "cold"
out = "runs/current"
max_regression = 0.1
baseline = "ci/baseline.json"
against = "origin/main"
max_launches = 11
measure_s = 5
budget = "1m30s"
"""


def test_dedicated_file_gives_every_key_in_command_line_form(tmp_path):
    (tmp_path / "ddp-profile.toml").write_text(FULL)
    config = find_project_config(str(tmp_path))
    assert config is not None and config.path == str(tmp_path / "ddp-profile.toml")
    assert set(config.values) == set(KNOWN_KEYS)
    assert config.values["script"] == str(tmp_path / "train.py")
    assert config.values["out"] == str(tmp_path / "runs" / "current")
    assert config.values["baseline"] == str(tmp_path / "ci" / "baseline.json")
    assert config.values["args"] == ["--epochs", "1", "--data", "/d x"]
    assert config.values["num_workers"] == "0,2,4"
    assert config.values["budget"] == 90.0
    assert config.values["pin_memory"] == "true,false"
    assert config.values["prefetch_factor"] == "2,4"
    assert config.values["batch_size"] == "64"
    assert config.values["against"] == "origin/main" and config.values["max_launches"] == 11
    assert config.values["timeout"] == 90.0 and config.values["max_regression"] == 0.1
    assert config.values["ceiling"] is False and config.values["launcher"] == "none"
    assert config.values["comm"] is False
    assert config.values["repeat"] == 3 and config.values["cache"] == "cold"
    assert config.values["pairs"] == 0


def test_relative_paths_stay_relative_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text('script = "./train.py"\nout = "/abs/run"\n')
    config = find_project_config()
    assert config.values == {"script": "train.py", "out": "/abs/run"}


def test_pyproject_tool_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.ddp-profile]\nscript = "t.py"\nsteps = 12\n'
        'num_workers = "0, 2"\n\n[tool.other]\nsteps = "ignored"\n')
    config = find_project_config(str(tmp_path))
    assert config.path == str(tmp_path / "pyproject.toml")
    assert config.values == {"script": str(tmp_path / "t.py"), "steps": 12,
                             "num_workers": "0, 2"}


def test_pyproject_quoted_table_name(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool."ddp-profile"]\nwarmup = 0\n')
    assert find_project_config(str(tmp_path)).values == {"warmup": 0}


@pytest.mark.parametrize("text", ['[project]\nname = "x"\n', '[tool.ruff]\nline-length = 99\n',
                                  'dependencies = ["ddp-profile"]\n'])
def test_pyproject_without_the_table_is_no_config(tmp_path, text):
    (tmp_path / "pyproject.toml").write_text(text)
    assert find_project_config(str(tmp_path)) is None


def test_no_file_is_no_config(tmp_path):
    assert find_project_config(str(tmp_path)) is None


def test_dedicated_file_wins_over_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.ddp-profile]\nsteps = 99\n')
    (tmp_path / "ddp-profile.toml").write_text("steps = 7\n")
    config = find_project_config(str(tmp_path))
    assert config.path.endswith("ddp-profile.toml") and config.values == {"steps": 7}


@pytest.mark.parametrize("text, fragment", [
    ("stepz = 3\n", "unknown key 'stepz'"),
    ("num-workers = [0]\n", "did you mean num_workers?"),
    ('steps = "30"\n', "steps: expected an integer"),
    ("steps = 0\n", "steps: 0 is below the minimum of 1"),
    ("repeat = 0\n", "repeat: 0 is below the minimum of 1"),
    ("warmup = true\n", "warmup: expected an integer"),
    ("nproc_per_node = 2.5\n", "nproc_per_node: expected an integer"),
    ('args = "--epochs 1"\n', "args: expected a list of strings"),
    ("args = [1, 2]\n", "args: expected a list of strings"),
    ('launcher = "srun"\n', "launcher: expected torchrun or none"),
    ('search = "random"\n', "search: expected adaptive or grid"),
    ("num_workers = [-1]\n", "num_workers: -1 is below the minimum of 0"),
    ("num_workers = [true]\n", "num_workers: expected integers"),
    ('num_workers = "two"\n', "num_workers: 'two' is not an integer"),
    ("num_workers = []\n", "num_workers: no values given"),
    ("batch_size = [0]\n", "batch_size: 0 is below the minimum of 1"),
    ("prefetch_factor = 1.5\n", "prefetch_factor: expected integers"),
    ('pin_memory = "maybe"\n', "pin_memory: expected true or false"),
    ("pin_memory = [1]\n", "pin_memory: expected true/false"),
    ("timeout = 0\n", "timeout: expected a number of seconds > 0"),
    ('budget = "soon"\n', "budget: expected a duration such as 90s, 2m or 1h30m"),
    ("budget = 0\n", "budget: expected a duration > 0"),
    ("ceiling = 1\n", "ceiling: expected true or false"),
    ("max_regression = 5\n", "max_regression: expected a fraction in [0, 1)"),
    ('script = ""\n', "script: expected a non-empty string"),
    ("out = 3\n", "out: expected a non-empty string"),
    ("[gate]\nmax_regression = 0.1\n", "unknown key 'gate'"),
    ("steps = \n", "invalid TOML"),
])
def test_bad_files_are_one_line_usage_errors(tmp_path, text, fragment):
    (tmp_path / "ddp-profile.toml").write_text(text)
    with pytest.raises(UsageError) as caught:
        find_project_config(str(tmp_path))
    message = str(caught.value)
    assert fragment in message and "ddp-profile.toml" in message, message
    assert "\n" not in message


def test_bad_pyproject_table_names_the_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.ddp-profile]\nsteps = -1\n")
    with pytest.raises(UsageError, match=r"pyproject.toml \[tool.ddp-profile\]: steps"):
        find_project_config(str(tmp_path))


def test_validate_takes_plain_tables():
    assert validate({"num_workers": 4, "pin_memory": False}, "x") == {
        "num_workers": "4", "pin_memory": "false"}


# ---- precedence -------------------------------------------------------------------------------

def _project(**values) -> ProjectConfig:
    return ProjectConfig("ddp-profile.toml", values)


def test_command_line_wins_then_file_then_defaults():
    merged = resolve({"steps": 12, "warmup": None, "search": None, "num_workers": None},
                     _project(steps=40, warmup=2, num_workers="0,2"))
    assert merged["steps"] == 12 and merged["warmup"] == 2 and merged["num_workers"] == "0,2"
    assert merged["search"] == "adaptive" and merged["launcher"] == RUN_DEFAULTS["launcher"]
    assert merged["ceiling"] is True


def test_false_on_the_command_line_still_wins():
    assert resolve({"ceiling": False}, _project(ceiling=True))["ceiling"] is False
    assert resolve({"ceiling": None}, _project(ceiling=False))["ceiling"] is False


def test_file_args_follow_the_file_script_only():
    project = _project(script="train.py", args=["--epochs", "1"])
    assert resolve({"script": None, "args": None}, project)["args"] == ["--epochs", "1"]
    assert resolve({"script": "./train.py", "args": None}, project)["args"] == ["--epochs", "1"]
    other = resolve({"script": "other.py", "args": None}, project)
    assert other["script"] == "other.py" and other["args"] is None
    assert resolve({"script": None, "args": ["--x"]}, project)["args"] == ["--x"]


def test_no_file_gives_the_defaults():
    merged = resolve({"steps": None}, None)
    assert merged["steps"] == 30 and merged["warmup"] == 5


# ---- the CLI, stopped before any launch -------------------------------------------------------

@pytest.fixture
def captured_run(monkeypatch):
    """Replace start_run/execute: record the request instead of launching probes."""
    from ddp_profile.commands import run as run_module

    seen = {}

    def fake_start(request):
        seen["request"] = request
        return request.out or "unused"

    monkeypatch.setattr(run_module, "start_run", fake_start)
    monkeypatch.setattr(run_module, "execute",
                        lambda out, report=True, quiet=False, verbose=False:
                        {"probes": [{"status": "ok"}]})
    return seen


def test_run_with_no_flags_takes_everything_from_the_file(tmp_path, monkeypatch, captured_run):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text(FULL)
    assert cli._dispatch(["run", "--quiet"]) == ExitCode.OK
    request = captured_run["request"]
    assert request.script == "train.py" and request.out == os.path.join("runs", "current")
    assert request.script_args == ("--epochs", "1", "--data", "/d x")
    assert request.launcher == "none" and request.nproc_per_node == 4
    assert request.space.num_workers == (0, 2, 4) and request.space.batch_size == (64,)
    assert request.space.pin_memory == (False, True)
    options = request.options
    assert (options.steps, options.warmup, options.timeout_s, options.search,
            options.ceiling) == (40, 3, 90.0, "grid", False)


def test_run_flags_override_the_file(tmp_path, monkeypatch, captured_run):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text(FULL)
    assert cli._dispatch(["run", "other.py", "--steps", "5", "--num-workers", "1",
                          "--ceiling", "--launcher", "torchrun", "--quiet"]) == ExitCode.OK
    request = captured_run["request"]
    assert request.script == "other.py" and request.script_args == ()
    assert request.options.steps == 5 and request.options.ceiling is True
    assert request.space.num_workers == (1,) and request.launcher == "torchrun"
    assert request.options.warmup == 3  # still from the file


def test_arguments_after_double_dash_go_to_the_file_script(tmp_path, monkeypatch,
                                                           captured_run):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text(FULL)
    assert cli._dispatch(["run", "--quiet", "--", "--epochs", "3"]) == ExitCode.OK
    request = captured_run["request"]
    assert request.script == "train.py" and request.script_args == ("--epochs", "3")


def test_run_without_script_or_file_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli._dispatch(["run", "--quiet"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "no SCRIPT given" in err and err.count("\n") == 1


def test_run_with_a_bad_file_exits_2_before_launching(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text('script = "t.py"\nsteps = "many"\n')
    assert cli._dispatch(["run", "--quiet"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "ddp-profile.toml: steps: expected an integer" in err and err.count("\n") == 1


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "--steps: 0 is below the minimum of 1"),
    (["--warmup", "-1"], "--warmup: -1 is below the minimum of 0"),
    (["--repeat", "0"], "--repeat: 0 is below the minimum of 1"),
    (["--timeout", "0"], "--timeout: expected a number of seconds > 0"),
    (["--nproc-per-node", "0"], "--nproc-per-node: 0 is below the minimum of 1"),
    (["--search", "random"], "--search: expected adaptive or grid"),
    (["--launcher", "srun"], "--launcher: expected torchrun or none"),
    (["--budget", "2 min"], "--budget: expected a duration such as 90s, 2m or 1h30m"),
])
def test_command_line_values_get_the_file_checks(tmp_path, monkeypatch, capsys, captured_run,
                                                 flags, message):
    monkeypatch.chdir(tmp_path)
    assert cli._dispatch(["run", "train.py", "--quiet", *flags]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "request" not in captured_run


def test_run_names_the_file_script_when_it_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text('script = "nope.py"\n')
    assert cli._dispatch(["run", "--quiet"]) == ExitCode.SCRIPT_NOT_FOUND
    assert "nope.py" in capsys.readouterr().err


def test_gate_reads_paths_and_tolerance_from_the_file(tmp_path, monkeypatch):
    from ddp_profile.commands import baseline_gate as gate_module

    seen = {}

    def fake_gate(baseline, current, **kwargs):
        seen.update(kwargs, baseline=baseline, current=current)
        return ExitCode.OK

    monkeypatch.setattr(gate_module, "run_gate", fake_gate)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text(FULL.replace('against = "origin/main"\n', ""))
    assert cli._dispatch(["gate"]) == ExitCode.OK
    assert (seen["baseline"], seen["current"], seen["max_regression"]) == (
        os.path.join("ci", "baseline.json"), os.path.join("runs", "current"), 0.1)
    assert cli._dispatch(["gate", "b.json", "cur", "--max-regression", "0.02"]) == ExitCode.OK
    assert (seen["baseline"], seen["current"], seen["max_regression"]) == ("b.json", "cur", 0.02)


def test_against_in_the_file_makes_a_bare_gate_the_paired_one(tmp_path, monkeypatch):
    from ddp_profile.commands import against as against_module

    seen = []
    monkeypatch.setattr(against_module, "run_paired_gate",
                        lambda request, **kwargs: seen.append(request) or ExitCode.OK)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp-profile.toml").write_text(FULL.replace("[0, 2, 4]", "[2]").replace(
        "[true, false]", "true").replace('"2,4"', "4"))
    assert cli._dispatch(["gate"]) == ExitCode.OK
    request = seen[-1]
    assert (request.against, request.max_launches, request.max_regression) == (
        "origin/main", 11, 0.1)
    assert request.config.label() == "w=2 pin=true pf=4 bs=64"
    assert os.path.abspath(request.script) == str(tmp_path / "train.py") and request.steps == 40
    assert cli._dispatch(["gate", "--against", "v1.0", "--max-launches", "7",
                          "--config", "w=4"]) == ExitCode.OK
    assert (seen[-1].against, seen[-1].max_launches, seen[-1].config.num_workers) == (
        "v1.0", 7, 4)


def test_gate_without_paths_or_file_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli._dispatch(["gate"]) == ExitCode.USAGE
    assert "gate needs BASELINE and CURRENT" in capsys.readouterr().err
