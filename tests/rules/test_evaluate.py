"""evaluate(): the registry, severity order, dict form, overridable thresholds."""

from __future__ import annotations

import dataclasses

import pytest

from ddp_profile.rules import RULES, Finding, Thresholds, evaluate, finding_to_dict
from tests.rules.tables import RunBuilder, empty_run

RULE_IDS = {"data-loader-bound", "cpu-bound-preprocessing", "io-bound-loading", "pin-memory",
            "persistent-workers", "worker-oversubscription", "batch-size-headroom",
            "low-gpu-utilization", "straggler", "frequent-io", "missing-distributed-sampler",
            "missing-set-epoch", "data-parallel", "backend-mismatch", "find-unused-parameters",
            "no-ddp", "thread-oversubscription", "exposed-communication",
            "allreduce-per-micro-batch", "per-step-collectives", "host-sync-per-step",
            "sync-batchnorm"}


def test_registry_has_every_rule_once():
    assert len(RULES) == len(RULE_IDS) == len({rule.__name__ for rule in RULES})
    for rule in RULES:
        assert rule.__doc__ and "Trigger" in rule.__doc__, rule.__name__


def test_empty_run_has_no_findings():
    findings, rec = evaluate(empty_run())
    assert findings == [] and rec.probe_id is None


def test_findings_sorted_by_severity():
    run = (RunBuilder(world_size=2)
           .probe("p", kind="baseline", num_workers=0, loader={"distributed_sampler": False})
           .steps(data_wait=0.03, compute=0.07)  # data-loader-bound: medium
           .event("ddp", find_unused_parameters=True, device_type="cpu")
           .event("ddp_unused_parameters", params_without_grad=0, params_total=4)  # low
           .event("batch_fingerprint", rank=0, loader_id=0, index=0, digest="a")
           .event("batch_fingerprint", rank=0, loader_id=0, index=1, digest="b")
           .event("batch_fingerprint", rank=1, loader_id=0, index=0, digest="a")
           .event("batch_fingerprint", rank=1, loader_id=0, index=1, digest="b")
           .build())  # missing-distributed-sampler: high
    findings, _ = evaluate(run)
    assert [f.rule for f in findings] == ["missing-distributed-sampler", "data-loader-bound",
                                         "find-unused-parameters"]
    assert {f.rule for f in findings} <= RULE_IDS


def test_thresholds_override_reaches_the_rules():
    run = RunBuilder().probe("p", kind="baseline").steps(data_wait=0.03, compute=0.07).build()
    assert [f.rule for f in evaluate(run)[0]] == ["data-loader-bound"]
    assert evaluate(run, Thresholds(data_wait_fraction=0.4))[0] == []


def test_thresholds_and_findings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Thresholds().data_wait_fraction = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        Thresholds(no_such_threshold=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        Finding(rule="x", severity="urgent", title="", evidence="", recommendation="")


def test_finding_to_dict_matches_summary_keys():
    finding = Finding(rule="straggler", severity="high", title="t", evidence="e",
                      recommendation="r", ranks=(3,))
    assert finding_to_dict(finding) == {"rule": "straggler", "severity": "high", "title": "t",
                                        "evidence": "e", "recommendation": "r", "ranks": [3]}
