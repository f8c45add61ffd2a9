"""When an alternation in launches stops: its answer decided, its candidate unable to win, its
answer out of reach of the launches left, or every launch allowed run.

``decide.paired`` reads an alternation as a line, or each candidate against its neighbours,
and calls the candidate faster where the lower end of its interval lies above 1. The launches
still to come enter that reading linearly (the gain) and quadratically (the residual), so the
highest lower end they could give, over every value they could read, has a closed form
(``highest_lower``): where even that leaves the candidate short, nothing those launches
measure can change the answer, and the alternation stops ``futile``. Where the launches left,
read as those so far read (their gain, their spread), would not establish the candidate, it
stops ``unpromising`` (``establishes``). Pure functions over the rows
``paired.fit_alternation`` takes; ``sweep.claim.launch_each`` asks them after each pair.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from ddp_profile.profiler.decide.choose import ChoiceThresholds
from ddp_profile.profiler.decide.neighbours import LOCAL_FROM
from ddp_profile.profiler.decide.paired import (
    CANDIDATE,
    alternation_open,
    as_run,
    paired,
    read_rates,
    whole_runs,
)
from ddp_profile.profiler.quantiles import t_quantile, z_quantile
from ddp_profile.profiler.store.probes import ProbeRecord

DECIDED, FUTILE, ROUNDS, FAILED = "decided", "futile", "rounds", "failed"  # ``stopped``
UNPROMISING = "unpromising"
SPREAD_CONFIDENCE = 0.9  # ``establishes`` reads the launches' spread at the low end of this
# one-sided interval of it: a check stops only where a spread that low would not establish it


def _line(candidate: Sequence[bool]) -> Optional[tuple[np.ndarray, np.ndarray, float, int]]:
    """The line's reading (``paired.fit_alternation``) of logs at these roles as (gain
    weights, residual form, its variance's divisor, degrees of freedom): gain = w . y,
    residual sum of squares = y' M y, the gain's SD = sqrt(y' M y / divisor)."""
    n = len(candidate)
    design = np.array([[1.0, float(i), 1.0 if c else 0.0] for i, c in enumerate(candidate)])
    dof = n - 3
    if dof < 1:
        return None
    inverse = np.linalg.inv(design.T @ design)
    hat = design @ inverse @ design.T
    return (inverse @ design.T)[2], np.eye(n) - hat, dof / inverse[2, 2], dof


def _local(candidate: Sequence[bool]) -> Optional[tuple[np.ndarray, np.ndarray, float, int]]:
    """The neighbours' reading (``neighbours.local_fit``) in ``_line``'s terms; None where it
    does not apply (a candidate at an end, or fewer than ``LOCAL_FROM`` of them)."""
    n = len(candidate)
    rows = []
    for i, c in enumerate(candidate):
        if not c:
            continue
        if i == 0 or i == n - 1 or candidate[i - 1] or candidate[i + 1]:
            return None
        row = np.zeros(n)
        row[i], row[i - 1], row[i + 1] = 1.0, -0.5, -0.5
        rows.append(row)
    if len(rows) < LOCAL_FROM:
        return None
    d = np.array(rows)
    k = len(rows)
    centre = np.eye(k) - np.full((k, k), 1.0 / k)
    covariance = d @ d.T
    expected = float(np.trace(covariance) - covariance.sum() / k)
    weights = d.mean(axis=0)
    return weights, d.T @ centre @ d, expected / float(weights @ weights), k - 1


def highest_lower(logs: Sequence[float], candidate: Sequence[bool], confidence: float,
                  floor: float = 0.0, local: bool = False) -> float:
    """The highest lower end (log) of the candidate's interval once the alternation has the
    roles ``candidate`` (True: a candidate launch), given the first ``len(logs)`` log rates
    and anything at all for the rest, among readings whose gain is at least ``floor`` (log);
    -inf where none reaches it, inf where the rest could lift it without bound. ``local``:
    the neighbours' reading (-inf where it does not apply). With the rest placed where the
    residual is least (``y*``: gain g, residual R) and c the interval's half-width per unit
    of SD, moving them along the gain's direction (s2: its gain squared per residual) peaks
    at g - sqrt(R (c^2 - s2)); where that gain is under ``floor``, at the floor itself."""
    form = (_local if local else _line)(candidate)
    if form is None:
        return -math.inf
    weights, residual, divisor, dof = form
    known = len(logs)
    c = t_quantile(0.5 + confidence / 2, dof) / math.sqrt(divisor)
    old = np.asarray(logs, dtype=float)
    block = residual[known:, known:]
    pseudo = np.linalg.pinv(block) if block.size else block
    rest = -pseudo @ residual[known:, :known] @ old
    every = np.concatenate([old, rest])
    spread = max(0.0, float(every @ residual @ every))
    gain = float(weights @ every)
    s2 = float(weights[known:] @ pseudo @ weights[known:])
    if c * c <= s2:
        return math.inf
    root = math.sqrt(c * c - s2)
    if s2 > 0 and gain + s2 * math.sqrt(spread) / root >= floor or s2 == 0 and gain >= floor:
        return gain - math.sqrt(spread) * root
    if s2 == 0:
        return -math.inf
    return floor - c * math.sqrt(spread + (floor - gain) ** 2 / s2)


def futile(logs: Sequence[float], candidate: Sequence[bool], ends: Sequence[int],
           confidence: float, gain: float = 0.0) -> bool:
    """Whether no value of the launches still to come could make the candidate win: read
    faster (its interval's lower end above 1) with a ratio above ``1 + gain``, at any of the
    lengths ``ends`` the alternation may stop at, by the line or by its neighbours. ``logs``:
    the log rates so far, in order; ``candidate``: the roles of the longest alternation
    allowed (True: a candidate launch). Conservative: it grants every later launch the value
    best for the candidate, and ignores that the alternation might stop before."""
    floor = math.log1p(gain)
    for end in ends:
        if end < len(logs) or end > len(candidate):
            continue
        for local in (False, True):
            if highest_lower(list(logs)[:end], candidate[:end], confidence, floor,
                             local) > 0.0:
                return False
    return True


def establishes(logs: Sequence[float], candidate: Sequence[bool], confidence: float,
                floor: float) -> bool:
    """Whether the alternation, once it has the roles ``candidate`` (True: a candidate
    launch), would establish the candidate were the launches still to come to read as the line
    fitted to the first ``len(logs)`` log rates does: the same gain, and a residual spread at
    the low end of what theirs could be (its ``SPREAD_CONFIDENCE`` lower bound, the
    chi-square quantile by Wilson and Hilferty's cube): the interval's lower end above 0 and
    the gain above ``floor`` (log; the gain asked). Launches that would read it lost give the
    answer stopping gives now. True where the launches so far leave no spread to read. The
    line's reading alone: a level that walks reads wider by it, so this stops sooner there."""
    known = len(logs)
    now = _line(candidate[:known]) if known <= len(candidate) else None
    full = _line(candidate)
    if now is None or full is None:
        return True
    weights, residual, _, dof = now
    y = np.asarray(logs, dtype=float)
    cube = 2.0 / (9 * dof)
    quantile = dof * (1.0 - cube + z_quantile(SPREAD_CONFIDENCE) * math.sqrt(cube)) ** 3
    variance = max(0.0, float(y @ residual @ y)) / quantile
    if variance <= 0.0:
        return True
    _, _, divisor, dof_full = full  # divisor = dof / (the gain's variance per unit variance)
    half = t_quantile(0.5 + confidence / 2, dof_full) * math.sqrt(variance * dof_full / divisor)
    gain = float(weights @ y)
    return gain - half > 0.0 and gain > floor


def alternation_stop(records: Sequence[ProbeRecord], probes: list[ProbeRecord],
                     thresholds: ChoiceThresholds, allowed: int,
                     asked: Optional[float] = None) -> Optional[str]:
    """How the alternation ``probes`` (in order, ending on a reference) stops now, or None
    where it goes on one more pair, B A: ``DECIDED`` where its interval lies on one side of
    what it has to show (``paired.alternation_open``: faster beyond noise, or under the gain
    asked); ``FUTILE`` where, in the pairs left before ``allowed`` launches, no outcome
    could make the candidate faster beyond noise by more than ``noise_floor`` or ``asked``
    (``futile``, at every length it could stop at); ``UNPROMISING`` where, read as the
    launches so far read, the pairs left would not establish it (``establishes``, at
    ``allowed`` launches); ``FAILED`` where it cannot be read (a rate not positive:
    ``paired.paired``); None with no pair left (``ROUNDS``)."""
    if paired(records, probes, thresholds.interval_confidence, thresholds.launch_sd) is None:
        return FAILED
    if not alternation_open(records, probes, thresholds, asked=asked):
        return DECIDED
    left = (allowed - len(probes)) // 2
    rates = read_rates(probes)
    if left < 1 or any(not (r or 0.0) > 0 for r in rates):
        return None
    roles = [bool(p.pair and p.pair.role == CANDIDATE) for p in probes] + [True, False] * left
    ends = range(len(probes) + 2, len(roles) + 1, 2)
    logs = [math.log(float(r or 0.0)) for r in rates]
    gain = max(thresholds.noise_floor, asked or 0.0)
    if futile(logs, roles, ends, thresholds.interval_confidence, gain):
        return FUTILE
    if not establishes(logs, roles, thresholds.interval_confidence, math.log1p(gain)):
        return UNPROMISING
    return None


def persistence_stop(probes: list[ProbeRecord], roles: Sequence[str], confidence: float
                     ) -> Optional[str]:
    """``FUTILE`` where the persistent-workers check's launches so far (``probes``, of the
    ``roles`` it runs in all, none more) read persistent workers faster beyond noise neither
    now nor, whatever the launches left read, once all have run: as whole runs nor per epoch
    (``rules.alternations.persistent_effect`` reads both). None otherwise, and before the
    launches so far can be read (a fit of them with room for its noise)."""
    if not len(roles) > len(probes) >= 4:
        return None
    candidate = [role == CANDIDATE for role in roles]
    readings = [rates for rates in (whole_runs(probes), as_run(probes)) if rates]
    for rates in readings:
        if any(not (r or 0.0) > 0 for r in rates):
            return None
        logs = [math.log(float(r or 0.0)) for r in rates]
        if not futile(logs, candidate, [len(probes), len(roles)], confidence):
            return None
    return FUTILE if readings else None
