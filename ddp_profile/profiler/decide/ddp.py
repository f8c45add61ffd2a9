"""The DDP options a sweep measures against the script's own, their names, and the paired fit
of their alternation: read by the sweep (``sweep.communication``, which measures them) and the
rules (``rules.findings.synchronisation``, which word what they did) alike."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ddp_profile.profiler.decide.paired import (
    REFERENCE,
    AlternationFit,
    check_interval,
    fit_alternation,
)
from ddp_profile.profiler.store.probes import ProbeRecord

DEFAULT_BUCKET_CAP_MB = 25  # DDP's bucket_cap_mb when the script gives none


def ddp_counterfactuals(baseline: ProbeRecord) -> list[dict[str, Any]]:
    """The DDP options measured where communication costs: 4x the bucket cap (fewer, larger
    all-reduces: the 25 MB default is often too small for fast links, and on a slow one larger
    buckets can overlap less), and ``gradient_as_bucket_view=True`` (gradients are views into
    the buckets: no copy in and out) where the script leaves it off, and
    ``find_unused_parameters=False`` where the script sets it and DDP found no unused
    parameter (it then searches the autograd graph every step for nothing). No larger cap
    where each DDP module's gradients already fit in one bucket (``one_bucket``): it would
    change nothing but the launch, and its figure would be noise read as an effect.
    Compression hooks are not tried: they change numerics, and registering one would make the
    script's own ``register_comm_hook`` fail."""
    comm = baseline.comm.fields
    cap = comm.get("bucket_cap_bytes")
    cap_mb = cap / 2 ** 20 if cap else DEFAULT_BUCKET_CAP_MB
    options: list[dict[str, Any]] = [] if one_bucket(comm) else [
        {"bucket_cap_mb": int(round(4 * cap_mb))}]
    if not comm.get("gradient_as_bucket_view"):
        options.append({"gradient_as_bucket_view": True})
    if comm.get("find_unused_parameters") and comm.get("unused_parameter_size") == 0:
        options.append({"find_unused_parameters": False})
    return options


def one_bucket(comm: Mapping[str, Any]) -> bool:
    """Every DDP module's gradients travel in one bucket (the summary's ``comm``: ``buckets``
    against ``modules``): a larger bucket cap cannot change the all-reduces."""
    buckets, modules = comm.get("buckets"), comm.get("modules") or 1
    return isinstance(buckets, int) and buckets <= modules


def options_key(options: Mapping[str, Any]) -> str:
    """A DDP counterfactual's name: its options, sorted (the sweep and the rules name it so)."""
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items()))


def alternation_fit(entries: list[ProbeRecord]) -> Optional[AlternationFit]:
    """The fit of an alternation's entries (``decide.paired.fit_alternation``; each candidate by
    its options), None where one failed or too few ran."""
    if not entries or any(not e.measured or e.pair is None for e in entries):
        return None
    return fit_alternation([
        (None if e.pair.role == REFERENCE else options_key(dict(e.comm.options or {})),
         float(e.pair.index), e.throughput) for e in entries],
        local=len({e.launch for e in entries}) > 1)


def effect_interval(fit: AlternationFit, key: str, launches: int, confidence: float,
                    launch_sd: float) -> tuple[float, float]:
    """The interval of the options ``key``'s ratio over the script's own. Windows of one launch
    (``launches`` 1): the fit's own interval (the step without synchronisation is a
    measurement, no user launches it). Launches: what a user's check would measure, as for
    the claim: the fit's uncertainty and the spread between launches (the fit's residual, at
    least ``launch_sd``) over ``CHECK_ROUNDS`` launches of each."""
    between = max(launch_sd, fit.residual_sd) if launches > 1 else 0.0
    return check_interval(fit, key, between, confidence)
