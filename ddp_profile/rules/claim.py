"""The expected speedup from the claim's own check: the script's settings and the
recommendation, alternated close in time (``profiler.sweep.claim``).

The probes of one alternation (kind ``paired``, ``pair``: role, position, group) are read as
``log rate = level + gain x [candidate] + drift x position``: every candidate stands between two
references, so the launch's level and a linear drift between them cancel, and ``gain`` is
the log of the speedup. Its interval is Student's at the recommendation's confidence, on the
residual degrees of freedom (7 windows: 4; 5 launches: 2), so a few noisy windows give a wide
interval rather than a confident figure. Without such an alternation (``--pairs 0``, the
script's own settings chosen, a probe of it failed) there is no paired claim and the
recommendation says what its figure rests on instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probes import Kind, Status
from ddp_profile.profiler.store.results import Run
from ddp_profile.rules.gate.statistics import t_quantile

REFERENCE, CANDIDATE = "reference", "candidate"


@dataclass(frozen=True)
class PairedClaim:
    """The speedup the alternation measured, and its interval."""

    ratio: float
    interval: tuple[float, float]
    probes: tuple[str, ...]  # in the order they ran
    candidates: int  # how many candidate windows or launches
    launches: int  # 1: windows of one launch

    def basis(self) -> str:
        where = "windows of one launch" if self.launches == 1 else f"{self.launches} launches"
        return (f"the script's settings and the recommendation alternated, "
                f"{self.candidates} of each between the other's, {where} "
                f"({self.probes[0]}-{self.probes[-1]})")


def _settings(probe: Any) -> tuple:
    """The four settings of a summary probe (its ``config``) or a probes-table row."""
    config = probe.get("config")
    source = config if isinstance(config, dict) else probe
    return tuple(_plain(source.get(key)) for key in SETTING_KEYS)


def _plain(value: Any) -> Any:
    """A table's NaN is a summary's None; its numpy ints are ints."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def alternation(run: Run, reference: dict[str, Any], candidate: dict[str, Any]
                ) -> list[dict[str, Any]]:
    """The last alternation of ``reference``'s settings and ``candidate``'s, in order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for probe in run.summary.get("probes") or []:
        if probe.get("kind") == Kind.PAIRED and isinstance(probe.get("pair"), dict):
            groups.setdefault(str(probe["pair"].get("group")), []).append(probe)
    wanted = {REFERENCE: _settings(reference), CANDIDATE: _settings(candidate)}
    for group in reversed(list(groups.values())):
        if all(_settings(p) == wanted.get(p["pair"].get("role")) for p in group):
            return sorted(group, key=lambda p: p["pair"].get("index", 0))
    return []


def paired_claim(run: Run, reference: dict[str, Any], candidate: dict[str, Any],
                 confidence: float) -> Optional[PairedClaim]:
    """The speedup of ``candidate`` over ``reference`` (probe rows or entries with a config)
    from their alternation; None where there is none, or a probe of it failed."""
    probes = alternation(run, reference, candidate)
    if not probes or any(p.get("status") != Status.OK or not p.get("throughput")
                         or not math.isfinite(p["throughput"]) for p in probes):
        return None
    roles = [p["pair"]["role"] for p in probes]
    if roles.count(CANDIDATE) < 1 or len(probes) - 3 < 1:
        return None
    design = np.array([[1.0, 1.0 if role == CANDIDATE else 0.0, float(p["pair"]["index"])]
                       for role, p in zip(roles, probes)])
    logs = np.log([float(p["throughput"]) for p in probes])
    coef, *_ = np.linalg.lstsq(design, logs, rcond=None)
    residual = logs - design @ coef
    dof = len(probes) - 3
    variance = float(residual @ residual) / dof
    try:
        spread = math.sqrt(variance * np.linalg.inv(design.T @ design)[1, 1])
    except np.linalg.LinAlgError:
        return None
    half = t_quantile(0.5 + confidence / 2, dof) * spread
    gain = float(coef[1])
    launches = len({p.get("launch") or p.get("id") for p in probes})
    return PairedClaim(ratio=math.exp(gain), interval=(math.exp(gain - half),
                                                       math.exp(gain + half)),
                       probes=tuple(str(p["id"]) for p in probes),
                       candidates=roles.count(CANDIDATE), launches=launches)
