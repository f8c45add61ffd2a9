"""Where the batches are made: what producing each one costs (``loadcost``, read with the
producing thread's own counters, ``clocks``) and the files the producers read (``pagecache``).
Runs in the ranks and in their DataLoader workers."""
