"""The paired gate's verdict: the change and its reference alternated in launches, one fit.

``ddp-profile gate --against REF`` measures the current side (``B``) and the reference (``A``)
in one job, ``A B A B A`` and one more ``B A`` at a time while the verdict is open. The
launches are read with the claim's fit (``paired.fit_alternation``), so a runner whose speed
drifts over the job moves both sides alike and drops out of the gain (locally, with
``neighbours.local_fit``, where it slows down and recovers). The tolerance rule is the stored
baseline gate's (``rules.gate.verdict``): **regression** where the interval of current /
reference lies wholly below ``1 - max_regression``, **pass** where wholly above it,
**inconclusive** where it straddles it (with the launches a side that would decide it,
``launches_needed``) or where the sides ran in environments that differ beyond the change
(``environment``).

Pure functions over launch rates: the gate's command runs the launches and renders the result.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

from ddp_profile.defaults import CONFIDENCE, MAX_REGRESSION
from ddp_profile.profiler.decide.paired import CANDIDATE, REFERENCE, fit_alternation
from ddp_profile.profiler.quantiles import t_quantile

PASS = "pass"
REGRESSION = "regression"
INCONCLUSIVE = "inconclusive"
# Why (the wording is ``reports.gate_paired``'s):
BEYOND = "beyond"  # the interval lies wholly beyond the tolerance
WITHIN = "within"  # wholly within it
STRADDLES = "straddles"  # across it: more launches would decide
TOO_FEW = "too_few"  # a side failed, or no room for the noise yet
ENVIRONMENT = "environment"  # the sides ran in different environments
MIN_LAUNCHES = 5  # A B A B A: the level, the drift, the gain and two degrees of freedom
DEFAULT_MAX_LAUNCHES = 19  # A B ... A: 10 of the reference, 9 of the current side
SIDES = {REFERENCE: "reference", CANDIDATE: "current"}


@dataclass(frozen=True)
class Launch:
    """One launch of one side, as the verdict reads it."""

    side: str  # REFERENCE or CANDIDATE (the current side)
    position: int  # its place in the order they ran
    rate: Optional[float]  # global samples/s over its measured steps; None: it failed
    probe_id: str = ""


@dataclass(frozen=True)
class PairedVerdict:
    """The gate's verdict on an alternation of launches (see the module docstring)."""

    status: str
    basis: str
    ratio: float  # current / reference, the fit's
    low: float  # the ``confidence`` interval of ``ratio``
    high: float
    drift: float  # the fit's change of log rate per launch (both sides)
    residual_sd: float  # a launch's level about the fit (log scale: relative)
    dof: int
    launches_reference: int
    launches_current: int
    launches_needed: Optional[int]  # launches in all that would decide an open verdict
    max_regression: float = MAX_REGRESSION
    confidence: float = CONFIDENCE
    differences: tuple[str, ...] = ()  # environment differences that made it inconclusive
    local: bool = False  # each current launch read against the reference launches beside it

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in asdict(self).items()}


def _open(basis: str, reference: int, current: int, max_regression: float,
          confidence: float) -> PairedVerdict:
    nan = math.nan
    return PairedVerdict(INCONCLUSIVE, basis, nan, nan, nan, nan, nan, 0, reference, current,
                         None, max_regression, confidence)


def judge(launches: Sequence[Launch], *, max_regression: float = MAX_REGRESSION,
          confidence: float = CONFIDENCE, differences: Sequence[str] = ()) -> PairedVerdict:
    """The verdict on ``launches`` (in the order they ran). A failed launch leaves it
    inconclusive (``TOO_FEW``): the gate stops at a side that fails rather than fit round it.
    ``differences``: environment differences between the sides that are not the change
    under test; any makes it inconclusive (``ENVIRONMENT``) whatever the fit says."""
    if not 0 <= max_regression < 1:
        raise ValueError(f"max_regression must be in [0, 1), got {max_regression}")
    reference = sum(1 for launch in launches if launch.side == REFERENCE)
    current = len(launches) - reference
    fit = fit_alternation([(CANDIDATE if launch.side == CANDIDATE else None,
                            float(launch.position), float(launch.rate or 0.0))
                           for launch in launches], local=True) \
        if all(launch.rate for launch in launches) else None
    if fit is None:
        return _open(TOO_FEW, reference, current, max_regression, confidence)
    gain, error = fit.gains[CANDIDATE], fit.errors[CANDIDATE]
    half = t_quantile(0.5 + confidence / 2, fit.dof) * error
    tolerance = math.log(1.0 - max_regression)
    if differences:
        status, basis = INCONCLUSIVE, ENVIRONMENT
    elif gain + half < tolerance:
        status, basis = REGRESSION, BEYOND
    elif gain - half > tolerance:
        status, basis = PASS, WITHIN
    else:
        status, basis = INCONCLUSIVE, STRADDLES
    needed = launches_needed(len(launches), gain, half, tolerance) \
        if basis == STRADDLES else None
    return PairedVerdict(status, basis, math.exp(gain), math.exp(gain - half),
                         math.exp(gain + half), fit.drift, fit.residual_sd, fit.dof,
                         reference, current, needed, max_regression, confidence,
                         tuple(differences), fit.local)


def launches_needed(launches: int, gain: float, half: float, tolerance: float
                    ) -> Optional[int]:
    """The launches in all (odd: ``A ... A``) whose interval would clear the tolerance at the
    gain and spread seen: the half-width shrinks as one over the root of the launches (its
    ``t`` factor shrinking too is left as margin). None where the gain sits on the
    tolerance (no number of launches is predictable)."""
    distance = abs(gain - tolerance)
    if distance < 1e-3 or half <= 0:
        return None
    needed = math.ceil(launches * (half / distance) ** 2)
    return max(launches + 2, needed + (1 - needed % 2))


def more(verdict: PairedVerdict, launches: int, max_launches: int) -> bool:
    """Whether the job measures another ``B A`` pair: the verdict is open on the fit (not
    on a failed launch or the environment) and the budget holds two more launches."""
    return verdict.basis == STRADDLES and launches + 2 <= max_launches


# ---- the environment of each side ------------------------------------------------------------
COMPARED = ("device", "world_size", "torch_version", "gpu_name", "cpu_model")
THROTTLED = 0x8 | 0x20 | 0x40 | 0x80  # NVML: HW slowdown, SW thermal, HW thermal, power brake
CLOCK_NOTE = 0.10  # SM clock medians this far apart are named (not a verdict by themselves)


def environment_differences(reference: Sequence[Mapping[str, Any]],
                            current: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """What differs between the launches of the two sides (each launch's ``environment``:
    the ranks' context and its GPU's ``sm_clock_mhz`` median and ``throttled`` share of
    samples): (differences that make the verdict inconclusive, notes). World size, device,
    torch, GPU and CPU model are the runner's, not the change's, and so is a GPU throttled
    (thermal, power brake, hardware slowdown) on one side only. The SM clock moves with the
    load a change puts on the GPU, so a clock difference is named and decides nothing."""
    differences: list[str] = []
    for key in COMPARED:
        a = {str(e.get(key)) for e in reference if e.get(key) is not None}
        b = {str(e.get(key)) for e in current if e.get(key) is not None}
        if a and b and a != b:
            differences.append(f"{key}: reference {', '.join(sorted(a))}, current "
                               f"{', '.join(sorted(b))}")
    throttled = [_share(side, "throttled") for side in (reference, current)]
    if throttled[0] is not None and throttled[1] is not None \
            and (throttled[0] > 0) != (throttled[1] > 0):
        differences.append(f"GPU throttled (thermal, power brake or hardware slowdown) in "
                           f"{throttled[0]:.0%} of the reference's samples and "
                           f"{throttled[1]:.0%} of the current side's")
    notes: list[str] = []
    clocks = [_share(side, "sm_clock_mhz") for side in (reference, current)]
    if clocks[0] and clocks[1] and abs(clocks[1] / clocks[0] - 1) > CLOCK_NOTE:
        notes.append(f"GPU SM clock median {clocks[0]:.0f} MHz on the reference, "
                     f"{clocks[1]:.0f} MHz on the current side")
    return differences, notes


def _share(launches: Sequence[Mapping[str, Any]], key: str) -> Optional[float]:
    """The mean of ``key`` over the launches that have it."""
    values = [float(e[key]) for e in launches if isinstance(e.get(key), (int, float))
              and math.isfinite(e[key])]
    return sum(values) / len(values) if values else None
