"""Project settings for ``ddp-profile run`` and ``gate``, so a CI job needs no flags.

The settings live in the current directory, in ``ddp-profile.toml`` (top-level keys) or in the
``[tool.ddp-profile]`` table of ``pyproject.toml``; ``ddp-profile.toml`` wins when both exist.
Precedence, per key: the command line, then the file, then the built-in defaults
(:data:`RUN_DEFAULTS`). Relative paths in the file (``script``, ``out``, ``baseline``) are
relative to the file's directory. The keys and their types: docs/ci.md (the table after "The
same in ``pyproject.toml``").

Every problem (unknown key, wrong type, bad value, unreadable TOML) is a ``UsageError`` with a
one-line message naming the file and the key. Pure data in, data out: nothing here runs a probe.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from ddp_profile.errors import UsageError
from ddp_profile.profiler.cache import MODES as CACHE_MODES
from ddp_profile.profiler.cache import CacheMode
from ddp_profile.profiler.settings import AXIS_MINIMUM, parse_bool_list, parse_int_list

if TYPE_CHECKING:
    from ddp_profile.profiler.sweep.space import SearchSpace

DEDICATED_FILE = "ddp-profile.toml"
PYPROJECT_FILE = "pyproject.toml"
TOOL_TABLE = "ddp-profile"

RUN_DEFAULTS: Mapping[str, Any] = {"launcher": "torchrun", "steps": 30, "warmup": 5,
                                   "search": "adaptive", "ceiling": True, "comm": True,
                                   "repeat": 1, "pairs": 3, "cache": CacheMode.AUTO.value}
_CHOICES = {"launcher": ("torchrun", "none"), "search": ("adaptive", "grid"),
            "cache": CACHE_MODES}
_PATH_KEYS = ("script", "out", "baseline")
# Signs of a [tool.ddp-profile] table, for deciding without a TOML parser (Python < 3.11).
_TOOL_TABLE_RE = re.compile(r"""(?m)^\s*\[?\s*tool\s*\.\s*["']?ddp-profile\b""")


@dataclass(frozen=True)
class ProjectConfig:
    """Validated settings from one file; ``values`` holds only the keys the file sets."""

    path: str
    values: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def _load_toml(path: str, text: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - exercised on 3.9/3.10 only
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise UsageError(f"{path}: reading TOML needs Python 3.11+ or the tomli package "
                             f"(pip install tomli)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: invalid TOML: {exc}") from None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot be read: {getattr(exc, 'strerror', None) or exc}") \
            from None


def find_project_config(directory: str = ".") -> Optional[ProjectConfig]:
    """The settings in ``directory`` (``ddp-profile.toml`` first), or ``None`` if there are none."""
    dedicated = os.path.join(directory, DEDICATED_FILE)
    if os.path.isfile(dedicated):
        table = _load_toml(dedicated, _read(dedicated))
        return ProjectConfig(dedicated, validate(table, dedicated, directory))
    pyproject = os.path.join(directory, PYPROJECT_FILE)
    if not os.path.isfile(pyproject):
        return None
    text = _read(pyproject)
    if not _TOOL_TABLE_RE.search(text):
        return None  # no parser needed (nor required) for a pyproject without our table
    tool = _load_toml(pyproject, text).get("tool", {})
    table = tool.get(TOOL_TABLE) if isinstance(tool, dict) else None
    if table is None:
        return None
    where = f"{pyproject} [tool.{TOOL_TABLE}]"
    if not isinstance(table, dict):
        raise UsageError(f"{where}: expected a table")
    return ProjectConfig(pyproject, validate(table, where, directory))


# ---- validation -------------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(minimum: int) -> Callable[[str, Any], int]:
    def check(key: str, value: Any) -> int:
        if not _is_int(value):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"{key}: {value} is below the minimum of {minimum}")
        return value
    return check


def _choice(key: str, value: Any) -> str:
    if value not in _CHOICES[key]:
        raise ValueError(f"{key}: expected {' or '.join(_CHOICES[key])}, got {value!r}")
    return value


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _args(key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key}: expected a list of strings, e.g. [\"--epochs\", \"1\"], "
                         f"got {value!r}")
    return list(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def _timeout(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{key}: expected a number of seconds > 0, got {value!r}")
    return float(value)


def _fraction(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{key}: expected a fraction in [0, 1), e.g. 0.05, got {value!r}")
    return float(value)


DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """Seconds in ``"90s"``, ``"2m"``, ``"1h30m"``, ``"1m30"`` or ``"120"``; ValueError else."""
    match = _DURATION_RE.match(text.strip().lower())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"expected a duration such as 90s, 2m or 1h30m, got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * DURATION_UNITS["h"] + minutes * DURATION_UNITS["m"] + seconds


def duration(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key}: expected a duration such as 90s, 2m or 1h30m, got {value!r}")
    try:
        seconds = float(value) if not isinstance(value, str) else parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None
    if not seconds > 0:
        raise ValueError(f"{key}: expected a duration > 0, got {value!r}")
    return seconds


def _axis_text(key: str, value: Any) -> str:
    """A search axis as the command line's comma list (``[0, 2]`` or ``"0,2"`` -> ``"0,2"``)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise ValueError(f"{key}: no values given")
    parts = []
    for item in items:
        if key == "pin_memory":
            ok = isinstance(item, (bool, str))
        else:
            ok = _is_int(item) or isinstance(item, str)
        if not ok:
            kind = "true/false" if key == "pin_memory" else "integers"
            raise ValueError(f"{key}: expected {kind}, a list of them or a comma string, "
                             f"got {value!r}")
        parts.append(str(item).lower() if isinstance(item, bool) else str(item))
    text = ",".join(parts)
    if key == "pin_memory":
        parse_bool_list(key, text)
    else:
        parse_int_list(key, text, AXIS_MINIMUM[key])
    return text


_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "script": _text, "args": _args, "nproc_per_node": _int(1), "launcher": _choice,
    "num_workers": _axis_text, "pin_memory": _axis_text, "prefetch_factor": _axis_text,
    "batch_size": _axis_text, "steps": _int(1), "warmup": _int(0), "timeout": _timeout,
    "repeat": _int(1), "pairs": _int(0), "cache": _choice,
    "search": _choice, "ceiling": _bool, "comm": _bool, "out": _text, "max_regression": _fraction,
    "baseline": _text, "against": _text, "max_launches": _int(5), "measure_s": _timeout,
    "budget": duration,
}
KNOWN_KEYS = tuple(_CHECKS)


def validate(table: Mapping[str, Any], where: str, directory: str = ".") -> dict[str, Any]:
    """Check every key of ``table``; return the values in command-line form.

    Search axes become comma strings (``"0,2,4"``), paths are joined to ``directory``.
    """
    values: dict[str, Any] = {}
    for key, value in table.items():
        check = _CHECKS.get(key)
        if check is None:
            hint = f" (did you mean {key.replace('-', '_')}?)" \
                if key.replace("-", "_") in _CHECKS else ""
            raise UsageError(f"{where}: unknown key {key!r}{hint}; known keys: "
                             f"{', '.join(KNOWN_KEYS)}")
        try:
            values[key] = check(key, value)
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}") from None
    for key in _PATH_KEYS:
        if key in values and not os.path.isabs(values[key]):
            values[key] = os.path.normpath(os.path.join(directory, values[key]))
    return values


def check_command_line(values: Mapping[str, Any], keys: Sequence[str]) -> None:
    """The file's checks (the one place for ranges and choices) on command-line values.

    ``None`` means not given. Raises ``UsageError`` naming the option: ``--steps: 0 is below
    the minimum of 1``.
    """
    for key in keys:
        if values.get(key) is None:
            continue
        try:
            _CHECKS[key](key, values[key])
        except ValueError as exc:
            message = str(exc)
            if message.startswith(f"{key}:"):
                message = message[len(key) + 1:]
            raise UsageError(f"--{key.replace('_', '-')}:{message}") from None


def search_space(values: Mapping[str, Any]) -> "SearchSpace":
    """The search axes of command-line form ``values`` (comma strings, ``None`` where not
    given), checked: a bad value is a ``UsageError`` naming its option."""
    from ddp_profile.profiler.sweep.space import SearchSpace

    try:
        axes = (parse_int_list("--num-workers", values.get("num_workers"),
                               AXIS_MINIMUM["num_workers"]),
                parse_bool_list("--pin-memory", values.get("pin_memory")),
                parse_int_list("--prefetch-factor", values.get("prefetch_factor"),
                               AXIS_MINIMUM["prefetch_factor"]),
                parse_int_list("--batch-size", values.get("batch_size"),
                               AXIS_MINIMUM["batch_size"]))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return SearchSpace(*(tuple(v) if v is not None else None for v in axes))


# ---- merging ----------------------------------------------------------------------------------

def resolve(cli: Mapping[str, Any], project: Optional[ProjectConfig],
            defaults: Mapping[str, Any] = RUN_DEFAULTS) -> dict[str, Any]:
    """Per key: the command line's value unless ``None``, else the file's, else the default.

    ``args`` goes with the script: the file's ``args`` are used only when the script is the
    file's too (not named on the command line, or named as the same file), and only when the
    command line gives no script arguments of its own.
    """
    file_values = dict(project.values) if project else {}
    cli_script = cli.get("script")
    if cli_script is not None and file_values.get("script") is not None and \
            os.path.abspath(cli_script) != os.path.abspath(file_values["script"]):
        file_values.pop("args", None)
    merged: dict[str, Any] = {}
    for key in {*cli, *file_values, *defaults}:
        value = cli.get(key)
        if value is None:
            value = file_values.get(key, defaults.get(key))
        merged[key] = value
    return merged
