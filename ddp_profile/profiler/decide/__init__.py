"""Pure decisions over probe records, read by the sweep, the rules and the gate alike: the best
configuration (``choose``), the paired fit of an alternation and the claim's verdict
(``paired``), what the evidence establishes and what stays open (``evidence``), the input
pipeline's capacity model (``capacity``), the DDP options measured and their alternation's fit
(``ddp``). Nothing here launches a process or reads a file."""
