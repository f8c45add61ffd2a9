"""Which of a producer's fetches the loading meter meters (``loadcost``), and on which of those
it reads the io counters.

Every fetch of a producer's first ``METER_FIRST`` is metered, then one in each block of
``METER_EVERY``. The one a block meters moves from block to block (a fixed pseudo-random
sequence, the same in every process), so a cost that repeats every few batches (a shard opened
every fourth batch) is caught as often as it occurs, not always or never. Worker ``w`` shifts
the sequence by ``w``: a loader's workers take turns, and any 15 steps of a loader hold metered
batches, one worker or 16. The io counters are read on the metered fetches of every other
block. The figures are read per sample only (``decide.capacity``), so a sample serves.
"""

from __future__ import annotations

import functools
import random
from typing import Optional

METER_FIRST, METER_EVERY = 8, 4
IO_FIRST = 8
PERIOD = 256  # fetches after which the sequence repeats: the masks' length
_DRAW = random.Random(20261207)
_SHIFTS = tuple(_DRAW.randrange(METER_EVERY) for _ in range(PERIOD // METER_EVERY))


@functools.lru_cache(maxsize=None)
def masks(worker: Optional[int]) -> tuple[bytes, bytes]:
    """(metered, io read): for fetch ``n`` past the first ones, ``mask[n % PERIOD]`` is 1 where
    it is. ``worker`` None: the loop's own loading, as worker 0."""
    turn = (worker or 0) % METER_EVERY
    metered = bytes(int(n % METER_EVERY == (_SHIFTS[n // METER_EVERY] + turn) % METER_EVERY)
                    for n in range(PERIOD))
    io = bytes(m & (n // METER_EVERY % 2 == 0) for n, m in enumerate(metered))
    return metered, io


def is_metered(n: int, worker: Optional[int]) -> bool:
    """Whether a producer's ``n``-th fetch (from 0) is metered."""
    return n < METER_FIRST or bool(masks(worker)[0][n % PERIOD])


def reads_io(n: int, worker: Optional[int]) -> bool:
    """Whether a producer's ``n``-th fetch reads the io counters (a metered one)."""
    return n < IO_FIRST or bool(masks(worker)[1][n % PERIOD])
