"""Whether a value is a finite number: the one test, for the rules' table cells (numpy scalars
included), the reports' figures and the probes' summaries."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional


def finite(value: Any) -> bool:
    """A real number (Python's or numpy's), neither NaN nor infinite; False for None, text,
    pandas' NA."""
    return isinstance(value, numbers.Real) and math.isfinite(value)


def finite_or_none(value: Any) -> Optional[float]:
    """``value`` as a float where ``finite``, else None."""
    return float(value) if finite(value) else None
