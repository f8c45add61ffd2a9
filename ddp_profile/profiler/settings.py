"""Configuration values shared by the harness and the rank processes.

``LoaderSettings`` is the tuple the sweep varies. ``ProbePlan`` is what one probe asks of every
rank; the harness serialises it into the ``DDP_PROFILE_PLAN`` environment variable and the
start-up hook reads it back, so rank processes need no command-line changes.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Mapping, Optional

ENV_ACTIVE = "DDP_PROFILE"  # "1" in every process of a probe; the hook does nothing without it
ENV_PLAN = "DDP_PROFILE_PLAN"  # JSON ProbePlan
ENV_PROBE_TAG = "DDP_PROFILE_PROBE_TAG"  # unique per probe launch: finds strays to kill
ENV_HARNESS_PID = "DDP_PROFILE_HARNESS_PID"  # probe processes exit if this process dies

SETTING_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "batch_size")
AXIS_MINIMUM = {"num_workers": 0, "prefetch_factor": 1, "batch_size": 1}  # the integer settings


class CacheMode(str, Enum):
    """The page cache's state asked for (``--cache``) and the run's regime decided from it
    (``profiler.cache``); here, where the harness and the ranks both read it
    (``ProbePlan.cache``)."""

    AUTO = "auto"  # asked for only: decided from the baseline (``profiler.cache.decide``)
    COLD = "cold"
    WARM = "warm"
    AS_IS = "as-is"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class LoaderSettings:
    """DataLoader settings a probe applies (``None`` = keep the script's own value)."""

    num_workers: Optional[int] = None
    pin_memory: Optional[bool] = None
    prefetch_factor: Optional[int] = None
    batch_size: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "LoaderSettings":
        data = data or {}
        return cls(**{k: data.get(k) for k in SETTING_KEYS})

    def merged_over(self, base: "LoaderSettings") -> "LoaderSettings":
        """These settings with every ``None`` filled from ``base``."""
        return replace(base, **{k: v for k, v in self.to_dict().items() if v is not None})

    def label(self) -> str:
        parts = []
        for key, short in (("num_workers", "w"), ("pin_memory", "pin"),
                           ("prefetch_factor", "pf"), ("batch_size", "bs")):
            value = getattr(self, key)
            if value is None:
                continue
            parts.append(f"{short}={str(value).lower() if isinstance(value, bool) else value}")
        return " ".join(parts) or "script defaults"


def config_label(config: Optional[Mapping[str, Any]]) -> str:
    """``w=4 pin=true pf=2 bs=64``: the tool's one short label of a configuration.

    Keys beyond the loader settings follow as ``key=value``; no settings at all read
    ``script defaults``.
    """
    config = dict(config or {})
    label = LoaderSettings.from_dict(config).label()
    extra = [f"{k}={v}" for k, v in config.items() if k not in SETTING_KEYS]
    return " ".join([label] + extra) if extra else label


GRADIENT_SYNC = "gradient_sync"  # a probe's DDP option: False runs every forward as under
# no_sync(), the gradients never all-reduced: the step without communication (a measurement only)


def constructor_options(ddp: Optional[dict[str, Any]]) -> dict[str, Any]:
    """A probe's DDP options that are DDP constructor arguments (all but ``GRADIENT_SYNC``)."""
    return {k: v for k, v in (ddp or {}).items() if k != GRADIENT_SYNC}


class Mode(str, Enum):
    """How a probe's ranks serve their batches (``ProbePlan.mode``, a window's ``"mode"``)."""

    NORMAL = "normal"  # load data as configured
    SCREEN = "screen"  # a launch of several windows, each in a mode of its own (``windows``)
    CEILING = "ceiling"  # after the warm-up, cached batches replayed: compute-only throughput

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ProbePlan:
    """What every rank of one probe does: which settings, how many steps, which mode.

    ``mode`` is ``Mode.NORMAL`` (load data as configured) or ``Mode.CEILING`` (after the
    warm-up, replay a few cached batches so the loop never waits for data: compute-only
    throughput); a screen launch's is ``Mode.SCREEN``, its windows' their own.

    ``windows`` turns the probe into a *screen*: one launch that measures several loader
    configurations one after another, each for ``warmup + steps`` training steps. Each window
    is ``{"overrides": LoaderSettings dict, "mode": Mode.NORMAL | Mode.CEILING}`` (and ``"ddp":
    {GRADIENT_SYNC: False}`` for a window without gradient synchronisation, ``"threads": n``
    for one whose ranks run ``n`` intra-op threads, ``window_threads``); the DataLoader is
    built with the first window's overrides and rebuilt for each later one (see
    ``profiler.instrument``).
    """

    probe_id: str
    out_dir: str
    overrides: LoaderSettings = field(default_factory=LoaderSettings)
    warmup: int = 5
    steps: int = 30
    mode: Mode = Mode.NORMAL
    inject_local_rank: Optional[str] = None  # "--local_rank" / "--local-rank" for legacy scripts
    rdzv_id: Optional[str] = None  # multi-node: the rendezvous id shared by every node
    windows: tuple[dict[str, Any], ...] = ()
    threads: Optional[int] = None  # torch intra-op threads per rank (None: the script's own)
    ddp: Optional[dict[str, Any]] = None  # DDP constructor options applied to every DDP the
    # script builds, e.g. {"bucket_cap_mb": 100} (None: the script's own)
    steps_per_s: Optional[float] = None  # predicted steps/s of a rank (``burst_steps``)
    cache: Optional[str] = None  # ``CacheMode.COLD``: producers drop the files
    # they read from the page cache after each batch (``profiler.rank.loading.pagecache``);
    # None: the page cache as it is
    persistent_workers: Optional[bool] = None  # True: every loader with workers keeps them
    # across epochs (``DataLoader(persistent_workers=True)``); None: the script's own
    warmup_cap: Optional[int] = None  # the most warm-up steps, the drain of the start-up
    # prefetch included (``warmup_room``: a short script's run); None: no cap

    def window_warmup(self, index: int) -> int:
        return int(self.windows[index].get("warmup", self.warmup))

    def window_steps(self, index: int) -> int:
        return int(self.windows[index].get("steps", self.steps))

    def window_starts(self) -> list[int]:
        """The training step at which each window begins."""
        starts = [0]
        for index in range(len(self.windows) - 1):
            starts.append(starts[-1] + self.window_warmup(index) + self.window_steps(index))
        return starts

    def window_lengths(self) -> list[int]:
        return [self.window_warmup(i) + self.window_steps(i) for i in range(len(self.windows))]

    def window_of(self, step: int) -> int:
        return window_index(self.window_starts(), step)

    @property
    def total_steps(self) -> int:
        if not self.windows:
            return self.warmup + self.steps
        return self.window_starts()[-1] + self.window_lengths()[-1]

    def window_settings(self, index: int) -> LoaderSettings:
        return LoaderSettings.from_dict(self.windows[index].get("overrides"))

    def window_mode(self, index: int) -> Mode:
        return Mode(self.windows[index].get("mode") or Mode.NORMAL) if self.windows else self.mode

    def gradient_sync(self, window: int) -> bool:
        """Whether DDP synchronises gradients in ``window`` (the probe's step where it is no
        screen): False where the probe's or the window's DDP options turn it off."""
        ddp = self.windows[window].get("ddp") if self.windows else None
        return (ddp or self.ddp or {}).get(GRADIENT_SYNC, True) is not False

    def window_threads(self, window: int) -> Optional[int]:
        """Torch's intra-op threads in every rank during ``window`` (None: the script's own,
        as it had them before the first switch)."""
        threads = self.windows[window].get("threads") if self.windows else None
        return int(threads) if threads else None

    @property
    def switches_threads(self) -> bool:
        """Whether a window of this screen runs other threads than the script's own."""
        return any(w.get("threads") for w in self.windows)

    def to_json(self) -> str:
        data = asdict(self)
        data["overrides"] = self.overrides.to_dict()
        for key in ("threads", "steps_per_s", "ddp", "cache", "persistent_workers",
                    "warmup_cap"):
            if data.get(key) is None:
                data.pop(key)  # what every reader of a plan without it understands
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> "ProbePlan":
        data = json.loads(text)
        data["overrides"] = LoaderSettings.from_dict(data.get("overrides"))
        data["windows"] = tuple(data.get("windows") or ())
        data["mode"] = Mode(data.get("mode") or Mode.NORMAL)
        return cls(**data)

    @classmethod
    def from_env(cls, environ: Optional[dict[str, str]] = None) -> Optional["ProbePlan"]:
        environ = os.environ if environ is None else environ
        if environ.get(ENV_ACTIVE) != "1" or not environ.get(ENV_PLAN):
            return None
        return cls.from_json(environ[ENV_PLAN])


def window_index(starts: list[int], step: int) -> int:
    """The window a training step falls in, given each window's first step."""
    return max(0, bisect.bisect_right(starts, step) - 1)


CEILING_CACHE_BATCHES = 4  # a ceiling probe loads this many real batches, then replays them


def mode_warmup(warmup: int, mode: Mode) -> int:
    """A ceiling probe's warm-up covers its cache fill and the step after it, in which the
    workers are shut down: no real load, nor the end of loading, is ever measured."""
    return max(warmup, CEILING_CACHE_BATCHES + 1) if mode == Mode.CEILING else warmup


def backlog_warmup(warmup: int, num_workers: Optional[int],
                   prefetch_factor: Optional[int]) -> int:
    """Warm-up steps that also drain the batches prefetched while the workers started.

    ``num_workers * prefetch_factor`` batches queue up while the main process waits for its
    first one, and the loop consumes them without waiting: measured before they are gone, a
    loader with many workers or a deep prefetch looks faster than it runs.
    """
    if not num_workers:
        return warmup
    return max(warmup, num_workers * (prefetch_factor or 2))


def warmup_room(run_steps: Optional[int], steps: int) -> Optional[int]:
    """The most warm-up steps a launch may take where the script's whole run is ``run_steps``
    training steps a rank (a launch ran it to its end): what leaves half of them, ``steps`` at
    most, to measure. A drain of the start-up prefetch longer than the run (15 workers at
    prefetch 4 drain 60 batches; timm's ``train.py`` of 2 epochs ran 40) measures nothing at
    all; a drain cut short leaves a few prefetched batches in a probe that is then short, and
    read with a short probe's wider error. None: no run known, no cap."""
    if not run_steps:
        return None
    return max(1, run_steps - min(steps, run_steps // 2))


def capped(warmup: int, room: Optional[int]) -> int:
    return warmup if room is None else min(warmup, room)


def window_warmup(warmup: int, config: LoaderSettings, mode: Mode,
                  room: Optional[int] = None) -> int:
    """A screen window's warm-up: its mode's (``mode_warmup``), or the drain of its workers'
    start-up prefetch (``backlog_warmup``), within ``room`` (``warmup_room``)."""
    if mode != Mode.NORMAL:
        return mode_warmup(warmup, mode)
    return capped(backlog_warmup(warmup, config.num_workers, config.prefetch_factor), room)


MIN_WARMUP_S = 1.0  # a claim's launches each warm up about this long at least
MAX_WARMUP_FACTOR = 10  # ... within this many times the run's --warmup


def timed_warmup(warmup: int, steps_per_s: Optional[float]) -> int:
    """Warm-up steps that also span about ``MIN_WARMUP_S`` where a rank is predicted to make
    ``steps_per_s`` (within ``MAX_WARMUP_FACTOR`` times ``warmup``).

    A launch's first second runs slower than its steady state, by time, not by steps: warmed
    up by steps alone, the side with the shorter steps measures more of that second, and a
    claim across batch sizes reads high.
    """
    if not steps_per_s or not steps_per_s > 0:
        return warmup
    return max(warmup, min(MAX_WARMUP_FACTOR * warmup, math.ceil(MIN_WARMUP_S * steps_per_s)))


BURST_ROUNDS = 5  # a probe with workers measures at least this many rounds of them
MIN_MEASURE_S = 1.0  # ... and, where that is predicted to take less, about this long
MAX_BURST_ROUNDS = 10  # ... but no more rounds than this for the sake of time


def burst_steps(steps: int, num_workers: Optional[int], mode: Mode = Mode.NORMAL,
                steps_per_s: Optional[float] = None) -> int:
    """Measured steps that span ``BURST_ROUNDS`` rounds of the workers, and where the rank is
    predicted to make ``steps_per_s``, about ``MIN_MEASURE_S`` seconds (within
    ``MAX_BURST_ROUNDS`` rounds).

    Workers started together deliver their batches together: ``num_workers`` batches arrive
    in a burst, then the loop waits for the next round. A window of a round or two samples
    where the bursts happen to fall, not the rate (8 workers measured 4,080 samples/s with
    prefetch 2 and 2,890 with prefetch 4 over 15 steps); several rounds average them out.
    Five rounds of a fast loop still last a fraction of a second: 16 latency-bound workers
    measured 80 steps in 0.24 s, ±15 %, 150 steps ±4-11 % and 300 steps (1 s) ±4-7 %.
    Uncertain windows lose the choice to cheaper, steadier ones, so the fast ones measure
    longer; a slow loop's windows are long already. The rounds are capped because the
    prediction can be several times too fast (38 workers per rank on 2 CPUs: predicted 377
    steps/s, measured 100). A ceiling window (cached batches replayed) measures about
    ``MIN_MEASURE_S`` too, within ``MAX_BURST_ROUNDS`` times ``steps``: 15 replayed steps of a
    small model lasted 16 ms and measured 38,000 samples/s in one run, 4,500 in the next.
    """
    if mode == Mode.CEILING and steps_per_s:
        return max(steps, min(MAX_BURST_ROUNDS * steps, math.ceil(MIN_MEASURE_S * steps_per_s)))
    if mode != Mode.NORMAL or not num_workers:
        return steps
    rounds = max(steps, BURST_ROUNDS * num_workers)
    if steps_per_s is None or not steps_per_s > 0:
        return rounds
    timed = min(MAX_BURST_ROUNDS * num_workers, math.ceil(MIN_MEASURE_S * steps_per_s))
    return max(rounds, timed)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_int_list(option: str, text: Optional[str], minimum: int) -> Optional[list[int]]:
    """Parse ``"0,2,4"`` into ``[0, 2, 4]``; raise ``ValueError`` with a one-line reason."""
    if text is None:
        return None
    values = []
    for item in text.split(","):
        item = item.strip()
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"{option}: {item!r} is not an integer") from None
        if value < minimum:
            raise ValueError(f"{option}: {value} is below the minimum of {minimum}")
        values.append(value)
    if not values:
        raise ValueError(f"{option}: no values given")
    return sorted(set(values))


def parse_bool_list(option: str, text: Optional[str]) -> Optional[list[bool]]:
    if text is None:
        return None
    try:
        values = [parse_bool(item) for item in text.split(",")]
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    return sorted(set(values))
