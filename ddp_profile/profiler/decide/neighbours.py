"""Each candidate launch against the references either side of it: an alternation's gain where
the machine's level wanders.

Launches of an alternation each run at a level of their own: the machine's other work comes
and goes. The linear fit (``paired.fit_alternation``) takes out one level and a straight
drift. A machine that slows down and recovers within the alternation leaves a curve in the
fit's residual, and the interval widens until it says nothing. imagenet's ``main.py`` on 2
busy cores is an example: the script's settings ran 22.5, 22.0, 16.4, 18.9 and 23.9 samples/s
over 9 launches, and the candidate between them ran 26.1, 24.5, 19.3 and 23.7. The fit read
1.13x [0.88-1.46]; each candidate against the mean of its two neighbours read 1.17, 1.27, 1.10
and 1.11.

Here each candidate launch ``c`` is read against the two references beside it:
``d = log c - (log a_before + log a_after) / 2``. A level that moves little across three
launches cancels, whatever its shape over the alternation. The gain is the mean of a
candidate's ``d``. One launch's noise ``sigma`` comes from the spread of the ``d``, pooled over
the candidates, with one degree of freedom fewer than the ``d`` of each. Neighbouring ``d``
share a reference, and for independent launches that covariance is taken into account
exactly: ``E[sum (d - mean)^2] = sigma^2 (tr C - 1'C1 / k)``, with ``C = W W'`` for the
weights ``W`` that make the ``d`` from the launches.

It needs more launches than the fit: ``A B A B A`` leaves it one degree of freedom where the fit
has two. It reads an alternation only where every candidate has ``LOCAL_FROM`` launches, each
between two references. Where the level stays still, or noise swamps its moves, the line is the
sharper reading. ``paired.fit_alternation`` therefore reads locally only where the line leaves
``LOCAL_VARIANCE_RATIO`` times the variance the neighbours show. ``benchmarks/alternations.py``
models the line, the local reading and that choice.
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
