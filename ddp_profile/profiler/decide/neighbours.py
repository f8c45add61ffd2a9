"""Each candidate launch against the references either side of it: an alternation's gain where
the machine's level wanders.

Launches of an alternation each run at a level of their own. The linear fit
(``paired.fit_alternation``) takes out one level and a straight drift; a machine that slows
down and recovers within the alternation leaves a curve in the fit's residual, and the
interval widens until it says nothing. Here each candidate launch ``c`` is read against the two
references beside it, ``d = log c - (log a_before + log a_after) / 2``, so a level that moves
little across three launches cancels. It needs more launches than the fit and reads an
alternation only where every candidate has ``LOCAL_FROM`` launches; ``paired.fit_alternation``
reads locally only where the line leaves ``LOCAL_VARIANCE_RATIO`` times the variance the
neighbours show. Its noise estimate: docs/internals.md, "Reading an alternation locally
(decide/neighbours)"; ``benchmarks/alternations.py`` models the choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

LOCAL_FROM = 4  # launches of each candidate, each between two references: 3 degrees of
# freedom for one candidate (with 2, a noise estimate read small by chance too often decides)


@dataclass(frozen=True)
class LocalFit:
    """Each candidate's log gain over its neighbouring references, its standard error, one
    launch's noise (``sigma``, log scale) and the degrees of freedom it rests on."""

    gains: dict[str, float]
    errors: dict[str, float]
    sigma: float
    dof: int


def local_fit(rows: Sequence[tuple[Optional[str], float, float]]) -> Optional[LocalFit]:
    """``rows``: (candidate key, None for the reference; position; rate), as the fit takes
    them. None where a candidate stands next to another candidate or at an end, where any
    candidate has fewer than ``LOCAL_FROM`` launches, or where a rate is not positive."""
    ordered = sorted(rows, key=lambda row: row[1])
    if any(not (rate > 0 and math.isfinite(rate)) for _, _, rate in ordered):
        return None
    logs = np.log([float(rate) for _, _, rate in ordered])
    weights: dict[str, list[np.ndarray]] = {}
    for i, (key, _, _) in enumerate(ordered):
        if key is None:
            continue
        if i == 0 or i == len(ordered) - 1 or ordered[i - 1][0] is not None \
                or ordered[i + 1][0] is not None:
            return None
        row = np.zeros(len(ordered))
        row[i], row[i - 1], row[i + 1] = 1.0, -0.5, -0.5
        weights.setdefault(key, []).append(row)
    if not weights or any(len(w) < LOCAL_FROM for w in weights.values()):
        return None
    gains, units, spread, expected = {}, {}, 0.0, 0.0
    for key, rows_of_key in weights.items():
        matrix = np.array(rows_of_key)
        d = matrix @ logs
        k = len(d)
        gains[key] = float(d.mean())
        spread += float(((d - d.mean()) ** 2).sum())
        covariance = matrix @ matrix.T  # in units of sigma^2
        expected += float(np.trace(covariance) - covariance.sum() / k)
        mean_weights = matrix.mean(axis=0)
        units[key] = float(mean_weights @ mean_weights)
    sigma = math.sqrt(spread / expected)
    return LocalFit(gains=gains, errors={k: sigma * math.sqrt(u) for k, u in units.items()},
                    sigma=sigma, dof=sum(len(w) - 1 for w in weights.values()))
