"""How a rank's loaders are driven through a probe: each iterator's state, a screen's windows
and the ceiling's replayed batches.

``IteratorState`` is what ``profiler.rank.instrument`` keeps on each DataLoader iterator it
sees. ``Screen`` is a screen's windows (``ProbePlan.windows``) as the training loader goes
through them; at each window's first step, in every rank at the same step,
:func:`rebuilt_iterator` rebuilds the training loader's iterator with the window's settings.
``CeilingReplay`` serves a ceiling probe (or window): a few real batches, then those again.
Both keep the script's epoch as it is (exactly ``len(loader)`` batches, ``StopIteration``
where it expects it, the sampler's order unchanged): every batch of indices an iterator takes
is noted as dispatched (``note_dispatched``) and dropped once yielded (``note_yielded``), and
a rebuilt iterator or a replay serves what the pass still owes (``rest_of_pass``,
:func:`serving`). An ``IterableDataset`` cannot be continued this way (``cannot_continue``).
Why: docs/how-it-works.md, "Probes keep your loop's contract".
"""

from __future__ import annotations

import collections
import functools
import itertools
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from ddp_profile.profiler.settings import (
    CEILING_CACHE_BATCHES,
    LoaderSettings,
    Mode,
    ProbePlan,
    window_index,
)

PENDING = "_ddp_profile_pending"  # on an iterator: deque of (sampler iterator, indices)


def note_dispatched(iterator: Any, indices: Any) -> None:
    """``iterator`` took ``indices`` from its sampler (to fetch, or to send to a worker)."""
    pending = iterator.__dict__.get(PENDING)
    if pending is None:
        pending = collections.deque()
        iterator.__dict__[PENDING] = pending
    pending.append((iterator.__dict__.get("_sampler_iter"), indices))


def noting_dispatch(next_index: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``_BaseDataLoaderIter._next_index`` that notes what it takes (``note_dispatched``)."""
    @functools.wraps(next_index)
    def _next_index(iterator: Any) -> Any:
        indices = next_index(iterator)
        note_dispatched(iterator, indices)
        return indices
    return _next_index


def note_yielded(iterator: Any) -> None:
    """``iterator`` handed its oldest dispatched batch to the loop (batches come in order:
    ``in_order=False`` keeps the count right, not which samples)."""
    pending = iterator.__dict__.get(PENDING)
    if pending:
        pending.popleft()


def cannot_continue(loader: Any) -> Optional[str]:
    """Why a new iterator of ``loader`` cannot serve the rest of the current pass, or None."""
    from torch.utils.data import IterableDataset

    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return ("its IterableDataset's stream lives in the dataset object of each worker: a "
                "new iterator would start it again")
    return None


def rest_of_pass(iterator: Any) -> Iterator[Any]:
    """The indices ``iterator`` still owes its pass: dispatched and not yielded, then the rest
    of its sampler iterator (consumed as the result is)."""
    sampler_iter = iterator.__dict__.get("_sampler_iter")
    pending = iterator.__dict__.get(PENDING) or ()
    owed = [indices for source, indices in pending if source is sampler_iter]
    if PENDING in iterator.__dict__:
        iterator.__dict__[PENDING] = collections.deque()
    return itertools.chain(owed, sampler_iter if sampler_iter is not None else ())


def batches_left(loader: Any, iterator: Any) -> Optional[int]:
    """For an iterator that cannot be continued from its sampler (an IterableDataset): the
    batches its pass still owes by the loader's length (its dataset's length in batches), or
    None where it has none."""
    try:
        return max(0, len(loader) - int(getattr(iterator, "_num_yielded", 0)))
    except TypeError:
        return None


class _PassRest:
    """Stands in for a loader's index sampler while a new iterator is built (which may call
    ``iter`` more than once: the worker iterator resets itself): ``iter`` is the rest of a
    pass; ``len`` is the sampler's own."""

    def __init__(self, rest: Iterator[Any], sampler: Any):
        self._rest, self._sampler = rest, sampler

    def __iter__(self) -> Iterator[Any]:
        return self._rest

    def __len__(self) -> int:
        return len(self._sampler)


def serving(loader: Any, rest: Iterator[Any]) -> Any:
    """A new iterator of ``loader`` (its settings as they are now) that serves ``rest``, the
    rest of the current pass, then ends the epoch.

    The loader's index sampler is swapped for the build only (a worker iterator takes its
    prefetch at construction) and the iterator keeps the real one for its later passes. The
    random generator's state (torch's default one, and the loader's own) is put back: building
    an iterator draws its workers' base seed from it, and the script's random stream must not
    move.
    """
    import torch

    attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    sampler = getattr(loader, attribute)
    generator = getattr(loader, "generator", None)
    states = (torch.random.get_rng_state(),
              generator.get_state() if generator is not None else None)
    object.__setattr__(loader, attribute, _PassRest(rest, sampler))
    try:
        fresh = loader._get_iterator()
    finally:
        object.__setattr__(loader, attribute, sampler)
        torch.random.set_rng_state(states[0])
        if generator is not None:
            generator.set_state(states[1])
    fresh._index_sampler = sampler
    return fresh


@dataclass
class IteratorState:
    """One DataLoader iterator as the instrumentation follows it."""

    loader_id: int
    iter_index: int  # the loader's how-manieth iterator (its epoch, for most scripts)
    t_iter: int  # perf_counter_ns when it was made (its workers' start)
    loader: "weakref.ref[Any]"
    iterator: Optional["weakref.ref[Any]"] = None  # the iterator itself (the script holds it)
    default_bs: int = 1  # samples per batch where a batch does not say
    first: bool = True  # its first batch not returned yet
    delegate: Any = None  # the iterator a screen window rebuilt, serving in its place
    fingerprints: int = 0  # batches fingerprinted (the sharding check)
    replay: Optional[Iterator[Any]] = None  # a ceiling's replay: what its pass still owes
    replayed: int = 0  # batches replayed from this iterator
    served: int = 0  # batches this iterator gave the loop
    epoch_len: Optional[int] = None  # len(loader) when it was made (None: no length)
    meter: Any = None  # the batch meter of the iterator serving (in-process loading only)
    clock: Any = None  # its loader's ``stepclock.StepClock``, from its first batch

    # ``served`` at the batch past ``len(loader)`` (-1: no length): this iterator outlived an
    # epoch there (read at every batch: kept, not computed)
    outlived_at: int = field(init=False, default=-1)

    def __post_init__(self) -> None:
        if self.epoch_len is not None:
            self.outlived_at = self.epoch_len + 1

    def serve(self) -> bool:
        """One more batch given to the loop; True at the one past ``len(loader)``: this
        iterator outlived an epoch."""
        self.served += 1
        return self.served == self.outlived_at

    @property
    def source(self) -> Any:
        """The iterator that serves the script's (``delegate`` once a window rebuilt it)."""
        if self.delegate is not None:
            return self.delegate
        return self.iterator() if self.iterator is not None else None

class Screen:
    """The windows of a probe (one window, all steps, for a probe that is not a screen)."""

    def __init__(self, plan: ProbePlan):
        self.plan = plan
        self.windows = bool(plan.windows)
        self.starts = plan.window_starts() if plan.windows else [0]  # fixed per probe
        self.total_steps = plan.total_steps  # computed once, read at every step
        # a pass may be continued (a window's rebuilt iterator, a ceiling's replay): the
        # batches taken are noted (``note_dispatched``)
        self.replays = bool(plan.windows) or plan.mode == Mode.CEILING
        self.window = 0  # the window the training loader is in
        self.script_threads: Optional[int] = None  # torch's intra-op threads as the script had
        # them before a window changed them (read where the screen switches threads)

    def label(self, record: dict[str, Any]) -> None:
        """A screen's step record gets its window, and is measured past the window's
        warm-up."""
        found = self.window_of(record["step"])
        if found is not None:
            record["window"], record["measured"] = found

    def window_of(self, step: int) -> Optional[tuple[int, bool]]:
        """(the window of a screen's step, whether it is measured: past the window's
        warm-up); None for a probe (its steps keep their own)."""
        if not self.windows:
            return None
        window = window_index(self.starts, step)
        return window, step - self.starts[window] >= self.plan.window_warmup(window)

    def done(self, steps_closed: int, measured_steps: int, wanted: int) -> bool:
        """A screen ends after its last window; a probe once ``wanted`` steps were measured."""
        return steps_closed >= self.total_steps if self.windows else measured_steps >= wanted

    def boundary(self, steps_closed: int) -> Optional[int]:
        """The window that begins at this step (None where none does)."""
        if self.windows and steps_closed in self.starts:
            return self.starts.index(steps_closed)
        return None

    def start_threads(self) -> None:
        """Window 0's threads where it runs its own (``ProbePlan.window_threads``): set at the
        first batch, once the script set its own (which later windows restore)."""
        if self.windows and self.plan.window_threads(0):
            self.switch_threads(0)

    def switch_threads(self, window: int) -> int:
        """Where the screen switches threads (``ProbePlan.switches_threads``), torch's
        intra-op threads for ``window``: its own count, else the script's (read with
        ``torch.get_num_threads`` before the first switch). The count in force now."""
        import torch

        if self.plan.switches_threads:
            if self.script_threads is None:
                self.script_threads = int(torch.get_num_threads())
            wanted = self.plan.window_threads(window) or self.script_threads
            if torch.get_num_threads() != wanted:
                torch.set_num_threads(wanted)
        return int(torch.get_num_threads())

    def mode(self, training: bool) -> Mode:
        """The mode a batch is served in (``Mode.NORMAL`` or ``Mode.CEILING``)."""
        if self.windows and training:
            return self.plan.window_mode(self.window)
        return self.plan.mode


class CeilingReplay:
    """A ceiling's batches: the first ``CEILING_CACHE_BATCHES`` of each loader, then those
    again in turn (the loop runs without loading).

    Replaying, an iterator stops loading: its workers are shut down, and the loader starts
    none for later epochs (its ``num_workers`` is set to 0, so ``iter(loader)`` costs what an
    in-process iterator's start costs). Each replayed batch takes its place in the pass (the
    indices the real one would have had, ``rest_of_pass``), and the epoch ends, with
    ``StopIteration``, where the real pass would have. An IterableDataset's pass ends after
    ``len(loader)`` batches; one without a length has no end to keep (``unbounded``).
    """

    def __init__(self) -> None:
        self._cache: dict[int, list[Any]] = {}
        self.unbounded: Optional[str] = None  # why a replayed epoch may not end where it would

    def fetch(self, state: IteratorState, next_batch: Callable[[], Any]) -> Any:
        cache = self._cache.setdefault(state.loader_id, [])
        if len(cache) < CEILING_CACHE_BATCHES:
            batch = next_batch()
            if len(cache) < CEILING_CACHE_BATCHES:
                cache.append(batch)
            return batch
        if state.replay is None:
            state.replay = self._stop_loading(state)
        next(state.replay)  # StopIteration: the pass is over where the script expects it
        state.replayed += 1
        return cache[state.replayed % len(cache)]

    def _stop_loading(self, state: IteratorState) -> Iterator[Any]:
        """What ``state``'s pass still owes; its workers shut down, none started again."""
        loader, source = state.loader(), state.source
        if loader is not None and cannot_continue(loader):
            left = batches_left(loader, source)
            if left is None:
                self.unbounded = ("the IterableDataset has no length: a replayed epoch ends "
                                  "only with the probe")
            rest: Iterator[Any] = itertools.repeat(None, left) if left is not None \
                else itertools.repeat(None)
        else:
            rest = rest_of_pass(source)
        shutdown_workers(source)
        if loader is not None and getattr(loader, "num_workers", 0):
            loader.num_workers = 0
        return rest


def loader_length(loader: Any) -> Optional[int]:
    """``len(loader)``, or None where it has none (an IterableDataset without a length)."""
    try:
        return len(loader)
    except Exception:  # noqa: BLE001
        return None


def shutdown_workers(iterator: Any) -> None:
    """Stop a DataLoader iterator's worker processes (best effort)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # noqa: BLE001
            pass


def applied_settings(loader: Any) -> dict[str, Any]:
    """The settings a DataLoader runs with now."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    return {"num_workers": workers, "pin_memory": bool(getattr(loader, "pin_memory", False)),
            "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers else None,
            "batch_size": getattr(loader, "batch_size", None)}


def target_settings(applied: dict[str, Any], settings: LoaderSettings) -> dict[str, Any]:
    """The loader attributes for a window: its overrides over what runs now."""
    target = dict(applied)
    if settings.num_workers is not None:
        target["num_workers"] = settings.num_workers
    if settings.pin_memory is not None:
        target["pin_memory"] = settings.pin_memory
    if target["num_workers"]:
        target["prefetch_factor"] = (settings.prefetch_factor or applied.get("prefetch_factor")
                                     or 2)
    else:
        target["prefetch_factor"] = None
    return target


class CannotSwitch(RuntimeError):
    """A loader whose settings cannot change mid-epoch without changing what the loop sees."""


def rebuilt_iterator(loader: Any, state: IteratorState,
                     settings: LoaderSettings) -> Optional[tuple[Any, int]]:
    """A fresh iterator of ``loader`` with ``settings`` that serves the rest of the current
    pass (``serving``), and its start (``perf_counter_ns``).

    The running iterator's workers are shut down first, to free the CPUs. None when the
    loader already runs with these settings. Raises ``CannotSwitch`` before anything changed
    where the pass cannot be continued (an IterableDataset), else whatever the DataLoader
    raises (a subclass may forbid it); the caller ends the screen then.
    """
    if loader is None:
        raise RuntimeError("the DataLoader is gone")
    reason = cannot_continue(loader)
    if reason is not None:
        raise CannotSwitch(reason)
    applied = applied_settings(loader)
    target = target_settings(applied, settings)
    if target == applied:
        return None
    running = state.source
    rest = state.replay if state.replay is not None else rest_of_pass(running)
    shutdown_workers(running)
    for key, value in target.items():
        if key != "batch_size":
            setattr(loader, key, value)
    started = time.perf_counter_ns()
    fresh = serving(loader, rest)
    if getattr(loader, "persistent_workers", False):
        loader._iterator = fresh
    state.replay, state.replayed = None, 0
    return fresh, started
