"""Where the batches are made: what producing them costs (``loadcost``: a sample of them, read
with the producing thread's own counters, ``clocks``) and the files the producers read
(``pagecache``: every fetch's).
Runs in the ranks and in their DataLoader workers."""
