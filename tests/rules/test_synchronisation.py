"""Communication rules on hand-built runs: each fires on its evidence, and only then."""

from __future__ import annotations

from ddp_profile.rules import evaluate
from ddp_profile.rules.base import Thresholds
from ddp_profile.rules.findings.distributed import straggler
from ddp_profile.rules.findings.synchronisation import (
    allreduce_per_micro_batch,
    exposed_communication,
    host_sync_per_step,
    per_step_collectives,
    sync_batchnorm,
)
from tests.rules.tables import RunBuilder

T = Thresholds()


def comm(exposed_s: float = 0.03, step_s: float = 0.1, **extra) -> dict:
    return {"comm": {"exposed_fraction": exposed_s / step_s, "exposed_s": exposed_s,
                     "comm_s": 2 * exposed_s, "overlap_s": exposed_s, "step_s": step_s,
                     "timed_steps": 10, "gradient_bytes": 67e6, "buckets": 3,
                     "bucket_cap_bytes": 25 * 2 ** 20, "backend": "gloo", "world_size": 2,
                     "bandwidth_bytes_per_s": 1.1e9, "syncs_per_optimizer_step": 1.0,
                     "forwards_per_optimizer_step": 1.0, "env": {}, "sites": [], **extra},
            "comm_fraction": exposed_s / step_s}


def alternated(builder: RunBuilder, gains: dict, drift: float = 0.0, rounds: int = 2,
               rate: float = 100.0, launch: str = "", noise: tuple = ()) -> RunBuilder:
    """DDP options (``gains``: options text -> (options, true speedup)) alternated with the
    script's own, ``A B A C A`` per round, on a machine whose speed moves ``drift`` per place:
    each entry a launch of its own, or windows of ``launch``."""
    from ddp_profile.profiler.decide.paired import rounds as sequence_of

    candidates = list(gains.values())
    for index, i in enumerate(sequence_of(len(candidates), rounds)):
        options, gain = candidates[i] if i >= 0 else ({}, 1.0)
        jitter = noise[index] if index < len(noise) else 1.0
        builder.probe(f"d{index:02d}", kind="ddp", num_workers=0, batch_size=8,
                      throughput=rate * gain * (1 + drift) ** index * jitter,
                      entry={"ddp_options": options, "launch": launch or f"d{index:02d}",
                             "pair": {"role": "reference" if i < 0 else "candidate",
                                      "index": index, "group": "ddp-003"}})
    return builder


def run_with(entry: dict, larger: float = 0.0, unsynced: float = 0.0, device: str = "cpu"):
    """The baseline (100 ms steps of 8 samples); ``larger``: a batch-32 probe this many times
    as fast; ``unsynced``: the baseline without gradient synchronisation, as fast."""
    builder = (RunBuilder(world_size=2, device=device).probe("base", kind="baseline", num_workers=0,
                                              batch_size=8, entry=entry)
               .steps(data_wait=0.001, compute=0.09, other=0.009))
    if larger:
        builder.probe("b32", num_workers=0, batch_size=32).steps(
            data_wait=0.001, compute=0.099 * 4 / larger, other=0.0, samples=32)
    if unsynced:
        builder.probe("nosync", kind="ddp", num_workers=0, batch_size=8,
                      entry={"ddp_options": {"gradient_sync": False}}).steps(
            data_wait=0.001, compute=0.099 / unsynced, other=0.0)
    return builder.build()


def test_exposed_communication_cites_the_reducer_timers_and_the_measured_batch():
    run = run_with(comm(0.031), larger=3.3)
    finding = exposed_communication(run, T)
    assert finding is not None and finding.severity == "high"
    assert "31.0 ms of each 100.0 ms step (31 %)" in finding.evidence
    assert "67.0 MB of gradients in 3 bucket(s)" in finding.evidence
    assert "1.10 GB/s" in finding.evidence
    findings, rec = evaluate(run)
    voiced = next(f for f in findings if f.rule == "exposed-communication")
    assert rec.config["batch_size"] == 32
    assert voiced.recommendation.startswith("Measured in this run: num_workers=")
    assert "b32" not in voiced.recommendation
    assert "scale the learning rate" in voiced.recommendation
    assert "Not measured in this run" in voiced.recommendation  # bucket_cap_mb etc.


def test_exposed_communication_unmeasured_batch_is_a_labelled_prediction():
    findings, _ = evaluate(run_with(comm(0.015)))
    finding = next(f for f in findings if f.rule == "exposed-communication")
    assert finding.severity == "medium"
    assert finding.recommendation.startswith("Prediction (not measured)")
    assert "--batch-size 8,16,32" in finding.recommendation


def test_little_exposed_communication_is_no_finding():
    assert exposed_communication(run_with(comm(0.005)), T) is None
    assert exposed_communication(run_with({}), T) is None
    few = comm(0.05)
    few["comm"]["timed_steps"] = 2
    assert exposed_communication(run_with(few), T) is None


def test_the_step_without_synchronisation_decides_and_the_timers_explain():
    run = run_with(comm(0.03), unsynced=1.5)  # the timers see 30 %, the probe says 33 %
    finding = exposed_communication(run, T)
    assert finding is not None and finding.severity == "high"
    assert finding.evidence.startswith("Measured: without gradient synchronisation (probe "
                                       "nosync")
    assert "1.49x as fast as with it (probe base): synchronising the gradients costs 33 % of " \
        "each step" in finding.evidence
    assert "DDP's reducer timers: 30.0 ms of each 100.0 ms step" in finding.evidence
    # the timers miss part of it (contention, DDP's own work): the measurement decides
    hidden = exposed_communication(run_with(comm(0.006), unsynced=1.4), T)
    assert hidden is not None and "costs 28 % of each step" in hidden.evidence


def test_timers_without_a_measured_cost_are_no_finding():
    assert exposed_communication(run_with(comm(0.03), unsynced=1.01), T) is None


def test_slow_nccl_environment_is_named():
    finding = exposed_communication(run_with(comm(0.03, env={"NCCL_IB_DISABLE": "1"})), T)
    assert finding is not None and "NCCL_IB_DISABLE=1: InfiniBand is disabled" in finding.evidence


def test_allreduce_per_micro_batch_predicts_the_saving():
    entry = comm(0.01, syncs_per_optimizer_step=4.0, forwards_per_optimizer_step=4.0)
    finding = allreduce_per_micro_batch(run_with(entry), T)
    assert finding is not None and finding.severity == "high"
    assert "after 4.0 of them" in finding.evidence
    assert "model.no_sync()" in finding.recommendation
    assert "Prediction (not measured): about 30.0 ms less per optimizer step" in \
        finding.recommendation


def test_accumulation_saving_rests_on_the_measured_synchronisation():
    entry = comm(0.01, syncs_per_optimizer_step=4.0, forwards_per_optimizer_step=4.0)
    finding = allreduce_per_micro_batch(run_with(entry, unsynced=1.25), T)
    assert finding is not None
    assert "about 15 % of each optimizer step saved" in finding.recommendation  # 0.2 x 3/4
    assert "(probe nosync) a micro-batch took 20 % less time" in finding.recommendation


def test_accumulation_under_no_sync_is_no_finding():
    entry = comm(0.01, syncs_per_optimizer_step=1.0, forwards_per_optimizer_step=4.0)
    assert allreduce_per_micro_batch(run_with(entry), T) is None
    assert allreduce_per_micro_batch(run_with(comm(0.01)), T) is None  # no accumulation


def site(file: str, seconds: float, line: int = 88) -> dict:
    return {"op": "all_reduce", "file": file, "line": line, "function": "reduce_value",
            "calls": 40, "seconds": seconds}


def test_per_step_collectives_name_the_call_site():
    entry = comm(0.001, collectives={"per_step": 1.0, "seconds_per_step": 0.006,
                                     "steps_with_calls": 1.0, "fraction": 0.06},
                 sites=[site("/home/u/train.py", 0.24)])
    finding = per_step_collectives(run_with(entry), T)
    assert finding is not None and finding.severity == "low"
    assert "all_reduce at train.py:88 in reduce_value (40 calls)" in finding.evidence
    assert "every N steps" in finding.recommendation
    # what the host waits for is said only where there is a GPU to wait for
    assert finding.evidence.endswith("Each waits for the slowest rank.")
    worded = per_step_collectives(run_with(entry, device="cuda"), T)
    assert worded is not None and "(.item()) blocks the host until the GPU" in worded.evidence


def test_cheap_or_torch_internal_collectives_are_no_finding():
    cheap = comm(0.001, collectives={"per_step": 1.0, "seconds_per_step": 0.001,
                                     "steps_with_calls": 1.0, "fraction": 0.01},
                 sites=[site("/home/u/train.py", 0.04)])
    assert per_step_collectives(run_with(cheap), T) is None
    internal = comm(0.001, collectives={"per_step": 2.0, "seconds_per_step": 0.01,
                                        "steps_with_calls": 1.0, "fraction": 0.1},
                    sites=[site("/venv/torch/nn/modules/_functions.py", 0.4)])
    assert per_step_collectives(run_with(internal), T) is None


def test_sync_batchnorm_quotes_its_timed_collectives():
    entry = comm(0.001, has_sync_bn=True,
                 sites=[site("/venv/torch/nn/modules/_functions.py", 0.4)])
    finding = sync_batchnorm(run_with(entry), T)
    assert finding is not None and "0.40 s over 40 calls" in finding.evidence
    assert sync_batchnorm(run_with(comm(0.001)), T) is None


def test_waiting_in_a_collective_is_not_straggling():
    """Rank 0 is slow before the loss all-reduce; rank 1 waits there for it, in its other
    time. The waiting rank is not the straggler."""
    def other(rank, step):
        return 0.030 if rank == 1 else 0.002
    run = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0)
           .steps(data_wait=0.001, compute=0.05, other=other, forward=0.01).build())
    assert straggler(run, T) is not None  # without knowing it waited, rank 1 looks slow
    steps = run.steps
    steps.loc[steps["rank"] == 1, "coll_s"] = 0.028
    steps.loc[steps["rank"] == 0, "coll_s"] = 0.0
    assert straggler(run, T) is None


def test_find_unused_parameters_cites_its_measured_counterfactual():
    from ddp_profile.rules.findings.distributed import find_unused_parameters

    def run(speedup: float, alternate: bool = True):
        builder = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0)
                   .steps(compute=0.1)
                   .event("ddp", find_unused_parameters=True, device_type="cpu")
                   .event("ddp_unused_parameters", params_without_grad=0, params_total=8))
        if not alternate:
            return (builder.probe("fup", kind="ddp", num_workers=0,
                                  entry={"ddp_options": {"find_unused_parameters": False}})
                    .steps(compute=0.1 / speedup).build())
        options = {"find_unused_parameters": False}
        return alternated(builder, {"f": (options, speedup)}, drift=0.03).build()
    faster = find_unused_parameters(run(1.3), T)
    assert faster.severity == "medium" and "ran 1.30x [" in faster.evidence \
        and "faster beyond noise" in faster.evidence, faster.evidence
    same = find_unused_parameters(run(1.0), T)
    assert same.severity == "low" and "not faster beyond noise" in same.evidence
    # one launch against another is no evidence, however fast
    alone = find_unused_parameters(run(1.3, alternate=False), T)
    assert alone.severity == "low" and "(probe base; probe fup, not faster beyond noise)" \
        in alone.evidence, alone.evidence


def test_ddp_options_alternated_with_the_scripts_own_are_judged_on_their_pairs():
    """A machine that speeds up 8 % a launch: the last launch of an option runs 1.5x the
    first of the script's whatever the option does. Alternated, the drift cancels: a larger
    bucket cap that saves 10 % is told, gradient_as_bucket_view (no effect) is not."""
    cap, view = {"bucket_cap_mb": 100}, {"gradient_as_bucket_view": True}
    builder = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0,
                                              batch_size=8, entry=comm(0.03))
               .steps(compute=0.1, jitter=0.01))
    builder = alternated(builder, {"cap": (cap, 1.10), "view": (view, 1.0)}, drift=0.08,
                         noise=(1.0, 1.004, 0.996, 1.0, 1.003, 0.997, 1.0, 1.002, 0.999))
    text = exposed_communication(builder.build(), T).advice.extra
    assert "bucket_cap_mb=100 ran 1.10x [" in text and \
        "(probes d01, d05, faster beyond noise: use DDP(model, ..., bucket_cap_mb=100))" \
        in text, text
    assert "gradient_as_bucket_view=True ran 1.00x [" in text and \
        "(probes d03, d07, within noise)" in text, text
    assert "alternated A B A C A B A C A in launches, probes d00-d08" in text
    assert "a drift of +8.0% per place" in text


def test_ddp_options_on_their_own_are_never_advised():
    """An option measured in a launch of its own, against the baseline's (and its twin's):
    each launch runs at a level of its own, so no verdict rests on it."""
    def run(twin_speed: float):
        builder = (RunBuilder(world_size=2)
                   .probe("base", kind="baseline", num_workers=0, batch_size=8,
                          entry=comm(0.03)).steps(compute=0.1, jitter=0.02))
        if twin_speed:
            builder.probe("twin", kind="ddp", num_workers=0, batch_size=8,
                          entry={"ddp_options": {}}).steps(compute=0.1 / twin_speed,
                                                           jitter=0.02, seed=1)
        return (builder.probe("cap", kind="ddp", num_workers=0, batch_size=8,
                               entry={"ddp_options": {"bucket_cap_mb": 100}})
                .steps(compute=0.1 / 1.15, jitter=0.02, seed=2).build())
    alone = exposed_communication(run(0.0), T).advice.extra
    assert "bucket_cap_mb=100 ran 1.13x (probe cap, faster in a launch of its own, not " \
        "alternated" in alone and "use DDP(model" not in alone, alone
    pooled = exposed_communication(run(1.15), T).advice.extra
    assert "(probes base and twin, pooled)" in pooled and "(probe cap, within noise)" in pooled


def test_an_option_faster_than_no_synchronisation_at_all_is_never_advised():
    """A real run (17 KB of gradients, one bucket): bucket_cap_mb=100 measured 1.54x, the step
    without any synchronisation 1.25x. An option can only save part of what synchronising
    costs: the figure is the launches' variance, and the finding never tells to use it."""
    builder = (RunBuilder(world_size=2)
               .probe("base", kind="baseline", num_workers=0, batch_size=8, entry=comm(0.03))
               .steps(compute=0.1, jitter=0.01)
               .probe("nosync", kind="ddp", num_workers=0, batch_size=8,
                      entry={"ddp_options": {"gradient_sync": False}})
               .steps(compute=0.1 / 1.25, jitter=0.01, seed=1))
    alternated(builder, {"cap": ({"bucket_cap_mb": 100}, 1.54)})
    extra = exposed_communication(builder.build(), T).advice.extra
    assert "bucket_cap_mb=100 ran 1.54x [" in extra and "use DDP(model" not in extra, extra
    assert "faster even than without any synchronisation (probe nosync)" in extra
    assert "not established" in extra


def test_the_cost_of_synchronisation_is_read_from_windows_alternated_in_one_launch():
    """The step with and without gradient synchronisation alternated in windows of one launch
    (A B A B A B A), on a machine slowing 3 % a window: 1.25x as fast without, 20 % of the
    step; the interval is the windows' own (no user launches the step without it)."""
    builder = (RunBuilder(world_size=2)
               .probe("base", kind="baseline", num_workers=0, batch_size=8, entry=comm(0.03))
               .steps(compute=0.1, jitter=0.01))
    alternated(builder, {"s": ({"gradient_sync": False}, 1.25)}, drift=-0.03, rounds=3,
               launch="d00-screen", noise=(1.0, 1.01, 0.99, 1.0, 1.005, 0.995, 1.0))
    finding = exposed_communication(builder.build(), T)
    assert finding.evidence.startswith(
        "Measured: without gradient synchronisation (probes d01, d03, d05: the script's"), \
        finding.evidence
    assert "ran 1.25x [" in finding.evidence and "costs 20 % of each step" in finding.evidence
    assert "alternated A B A B A B A in windows of one launch" in finding.evidence


def test_a_larger_bucket_cap_is_neither_tried_nor_suggested_for_one_bucket():
    from ddp_profile.profiler.decide.ddp import ddp_counterfactuals
    from ddp_profile.profiler.store.probes import ProbeRecord

    one = comm(0.03, buckets=1, modules=1)["comm"]
    baseline = ProbeRecord.from_json({"id": "p000", "status": "ok", "comm": one})
    assert ddp_counterfactuals(baseline) == [{"gradient_as_bucket_view": True}]
    run = run_with({**comm(0.03, buckets=1, modules=1)}, larger=2.0)
    extra = exposed_communication(run, T).advice.extra
    assert "bucket_cap_mb" not in extra and "gradient_as_bucket_view=True" in extra, extra
    run = run_with(comm(0.03), larger=2.0)  # 3 buckets: a larger cap is worth measuring
    assert "bucket_cap_mb=...) larger than 25" in exposed_communication(run, T).advice.extra


def syncs(idle: float, starved: float = 0.0, steps_with_syncs: float = 1.0) -> dict:
    entry = comm(0.001, host_syncs={
        "per_step": 2.0, "steps_with_syncs": steps_with_syncs,
        "timed_seconds_per_step": 0.004,
        "sites": [{"file": "/home/u/train.py", "line": 91, "function": "train",
                   "text": "total += loss.item()", "via": None, "calls": 40, "seconds": 0.0},
                  {"file": "/home/u/train.py", "line": 95, "function": "train",
                   "text": "torch.cuda.synchronize()", "via": None, "calls": 40,
                   "seconds": 0.16}]})
    return {**entry, "gpu_idle_fraction": idle, "gpu_starved_fraction": starved}


def test_host_sync_per_step_names_each_line_and_labels_its_saving():
    finding = host_sync_per_step(run_with(syncs(idle=0.30, starved=0.05)), T)
    assert finding is not None and finding.severity == "medium"
    assert "2.0 host-GPU synchronisation(s) per step" in finding.evidence
    assert "train.py:91 `total += loss.item()`, 40 calls" in finding.evidence
    assert "torch.cuda.synchronize() waited 4.0 ms a step" in finding.evidence
    assert "idle between steps 30 % of the time, 25 % of it while the host" in finding.evidence
    assert "Predicted, not measured: up to 25 %" in finding.recommendation
    # the fixes follow the lines found: the loss read and the explicit synchronize
    assert finding.recommendation.startswith(
        "Keep per-step values on the GPU and read them every N steps (at log time); take "
        "torch.cuda.synchronize() out of the loop")
    assert "non_blocking" not in finding.recommendation  # no blocking copy was found


def test_host_syncs_without_an_idle_gpu_or_in_few_steps_are_no_finding():
    assert host_sync_per_step(run_with(syncs(idle=0.02)), T) is None  # the GPU stays busy
    # idle, but waiting for data explains it: the loading rules speak
    assert host_sync_per_step(run_with(syncs(idle=0.40, starved=0.38)), T) is None
    assert host_sync_per_step(run_with(syncs(idle=0.30, steps_with_syncs=0.2)), T) is None
    assert host_sync_per_step(run_with(comm(0.001)), T) is None  # none counted (CPU)
    low = host_sync_per_step(run_with(syncs(idle=0.08)), T)
    assert low is not None and low.severity == "low"


def test_a_checkpoint_between_epochs_is_not_named_as_a_per_step_sync():
    """A site whose calls all fell outside every step (a checkpoint's ``torch.save`` between
    epochs: hundreds of copies) is no evidence of a sync per step; a site called both ways is
    named by its calls inside steps."""
    entry = syncs(idle=0.30, starved=0.05)
    save = {"file": "/home/u/checkpoint.py", "line": 12, "function": "save",
            "text": "torch.save(state, path)", "via": "storage.py:264 cpu", "calls": 184,
            "outside": 184, "seconds": 0.0}
    entry["comm"]["host_syncs"]["sites"] = [save, {
        **entry["comm"]["host_syncs"]["sites"][0], "calls": 44, "outside": 4}]
    finding = host_sync_per_step(run_with(entry), T)
    assert "checkpoint.py" not in finding.evidence and "torch.save" not in finding.evidence
    assert "train.py:91 `total += loss.item()`, 40 calls" in finding.evidence


def test_host_sync_fixes_follow_the_source_line_of_each_site():
    from ddp_profile.rules.findings.synchronisation import _sync_fixes

    copy = {"text": "source = source.to(self.gpu_id)"}
    assert _sync_fixes([copy]).startswith("Copy batches with .to(device, non_blocking=True)")
    hidden = {"text": "mask = scores[scores > 0]"}
    assert "nonzero, boolean indexing" in _sync_fixes([hidden])
    assert all(fix in _sync_fixes([{"text": ""}]).lower()
               for fix in ("synchronize", "non_blocking", "every n steps"))


def test_one_evaluation_fits_the_ddp_counterfactuals_once_for_every_rule_that_reads_them(
        monkeypatch):
    """Four rules read the DDP counterfactuals: one evaluation fits them once (its
    ``claim.Evidence``); another evaluation, or other thresholds, is another reading."""
    import dataclasses
    import inspect

    from ddp_profile.rules import RULES, measured_thresholds
    from ddp_profile.rules import alternations as claim_rules
    from ddp_profile.rules.alternations import Evidence

    builder = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0,
                                              batch_size=8, entry=comm(0.03))
               .steps(compute=0.1, jitter=0.01))
    run = alternated(builder, {"cap": ({"bucket_cap_mb": 100}, 1.10)}).build()
    fits = []
    real = claim_rules.alternated_effects
    monkeypatch.setattr(claim_rules, "alternated_effects",
                        lambda *args: fits.append(1) or real(*args))
    findings = evaluate(run, T).findings
    assert "exposed-communication" in [f.rule for f in findings], findings
    assert len(fits) == 1, fits
    thresholds = measured_thresholds(run, T)  # what evaluate decided with
    known = Evidence(run, thresholds)
    first = known.ddp_effects
    assert known.ddp_effects is first and len(fits) == 2
    assert "bucket_cap_mb=100" in first
    assert Evidence(run, thresholds).ddp_effects == first and len(fits) == 3
    # other thresholds are another reading
    other = Evidence(run, dataclasses.replace(thresholds, interval_confidence=0.8))
    assert "bucket_cap_mb=100" in other.ddp_effects and len(fits) == 4
    # one calling convention: every rule takes the run, the thresholds and the reading
    assert all(list(inspect.signature(rule).parameters) == ["run", "thresholds", "known"]
               for rule in RULES)


def test_the_sweep_reads_the_step_without_synchronisation_as_the_finding_does():
    """Whether the step without gradient synchronisation saves enough to measure DDP options
    and larger batches (``sweep.communication.unsynchronised``) is the finding's own reading:
    the same alternation, at the spread between launches the run showed (here the script's
    settings read 8 % apart in three launches, which a 1.2x gain alternated in launches
    cannot clear), not at the default spread."""
    from types import SimpleNamespace

    from ddp_profile.profiler.sweep.communication import unsynchronised

    for spread, expected in (((), True), ((1.1, 0.92, 1.08), False)):
        builder = (RunBuilder(world_size=2).probe("base", kind="baseline", num_workers=0,
                                                  batch_size=8, entry=comm(0.03))
                   .steps(compute=0.1, jitter=0.01))
        for i, factor in enumerate(spread):  # the script's settings again, a launch each
            builder.probe(f"again{i}", num_workers=0, batch_size=8,
                          entry={"launch": f"again{i}"}).steps(compute=0.1 / factor, jitter=0.01)
        run = alternated(builder, {"s": ({"gradient_sync": False}, 1.2)},
                         noise=(1.0, 1.01, 0.99, 1.0, 1.01)).build()
        search = SimpleNamespace(options=SimpleNamespace(pairs=3), entries=run.records)
        found = "exposed-communication" in [f.rule for f in evaluate(run, T).findings]
        assert unsynchronised(search) is found is expected, spread
