"""The CI gate's decision, apart from its wording (``reports.ci``) and I/O
(``commands.baseline_gate``).

``statistics``: rank tests, Hodges-Lehmann intervals, detectability. ``verdict``: the rule,
its data types (``Verdict``, ``LaunchCheck``, ``Comparison``, ``GateResult``).
"""
