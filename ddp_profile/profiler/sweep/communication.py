"""The communication counterfactuals of a sweep: ``measure(search)``, called by ``Search.run``.

Each is a probe of kind ``ddp`` (``store.probes.Kind.DDP``): the script's own settings with
other DDP options (``ProbePlan.ddp``, applied by the rank hook), never in the choice; the
exposed-communication rule judges each against the baseline. Larger per-rank batches are
ordinary sweep probes, which the choice weighs under its batch-size clause.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ddp_profile.profiler.settings import GRADIENT_SYNC, LoaderSettings
from ddp_profile.profiler.store.probes import Kind, Status
from ddp_profile.profiler.sweep.choose import (
    UNSTABLE_RSE,
    comm_bound,
    exposed_share,
    relative_se,
)
from ddp_profile.profiler.sweep.climb import beats
from ddp_profile.profiler.sweep.space import normalise

Entry = dict[str, Any]
DEFAULT_BUCKET_CAP_MB = 25  # DDP's bucket_cap_mb when the script gives none


def ddp_counterfactuals(baseline: Entry) -> list[dict[str, Any]]:
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
    comm = baseline.get("comm") or {}
    cap = comm.get("bucket_cap_bytes")
    cap_mb = cap / 2 ** 20 if cap else DEFAULT_BUCKET_CAP_MB
    options: list[dict[str, Any]] = [] if one_bucket(comm) else [
        {"bucket_cap_mb": int(round(4 * cap_mb))}]
    if not comm.get("gradient_as_bucket_view"):
        options.append({"gradient_as_bucket_view": True})
    if comm.get("find_unused_parameters") and comm.get("unused_parameter_size") == 0:
        options.append({"find_unused_parameters": False})
    return options


def one_bucket(comm: dict[str, Any]) -> bool:
    """Every DDP module's gradients travel in one bucket (the summary's ``comm``: ``buckets``
    against ``modules``): a larger bucket cap cannot change the all-reduces."""
    buckets, modules = comm.get("buckets"), comm.get("modules") or 1
    return isinstance(buckets, int) and buckets <= modules


def measure(search: Any, larger_batches: bool = True) -> None:
    """Where DDP's timers show exposed communication (``choose.exposed_share``), first the
    script's own settings and DDP options again (a twin: a launch can run at a level of its
    own, and the baseline was the first), then the step without gradient synchronisation
    (every forward as under ``no_sync()``): what communication costs, measured against both.
    Where it costs ``comm_exposed_share`` or more (``choose.comm_bound``): unless the
    batch-size axis was given (or ``larger_batches`` is off: not an adaptive search), the best
    configuration with 2x, then 4x the per-rank batch (the all-reduce moves the same gradients
    per step whatever the batch; the finding says that a batch size changes the
    optimisation); then other DDP options (``ddp_counterfactuals``). An unstable probe is
    measured again, twice as long. ``search``: the ``sweep.search.Search`` that calls in (not
    imported: no cycle)."""
    baseline = search.baseline
    if baseline is None or baseline.get("status") != Status.OK or not exposed_share(baseline):
        return
    twin = _ddp_probe(search, {})  # the script as it is, beside its counterfactuals
    unsynced = _ddp_probe(search, {GRADIENT_SYNC: False})
    if not comm_bound(baseline, unsynced, twin):
        return
    if larger_batches and search.space.batch_size is None:
        _larger_batches(search)
    for options in ddp_counterfactuals(baseline):
        _ddp_probe(search, options)


def _ddp_probe(search: Any, options: dict[str, Any]) -> Entry:
    """The script's own settings with DDP ``options``."""
    assert search.baseline is not None
    rate = search.steps_per_s(normalise(LoaderSettings.from_dict(search.baseline.get("config"))))
    entry = search.measurer.measure(LoaderSettings(), kind=Kind.DDP, ddp=options, steps_per_s=rate)
    if entry["status"] == Status.OK and relative_se(entry) > UNSTABLE_RSE:
        entry = search.measurer.measure(LoaderSettings(), kind=Kind.DDP, ddp=options,
                                        steps=search.options.steps * 2, steps_per_s=rate)
    return entry


def _larger_batches(search: Any) -> None:
    """The best configuration so far with 2x, then 4x its per-rank batch, while it gains."""
    assert search.baseline is not None
    best = search.best() or search.baseline
    current = normalise(LoaderSettings.from_dict(best.get("config")))
    batch = current.batch_size or LoaderSettings.from_dict(search.baseline.get("config")
                                                           ).batch_size
    if not batch:
        return
    for factor in (2, 4):
        entry = search.measure_config(replace(current, batch_size=batch * factor))
        if not beats(entry, best):
            break
        best = entry
