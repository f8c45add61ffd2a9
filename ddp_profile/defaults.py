"""The CI gate's defaults, in one place: read by its statistics and verdict (``rules.gate``),
its command (``commands.baseline_gate``), the CLI's options and the project file. No imports:
the CLI reads them at start-up."""

MAX_REGRESSION = 0.05  # tolerated slowdown of the gated throughput (0.05 = 5 %)
ALPHA = 0.002  # significance level of the one-sided test
CONFIDENCE = 0.90  # of the interval of the change the gate reports and decides with
POWER = 0.95  # for the smallest slowdown the gate would detect
MIN_SAMPLES = 8  # steps a side below which the gate is inconclusive
