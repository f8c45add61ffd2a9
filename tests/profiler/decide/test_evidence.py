"""What the evidence establishes (``decide.evidence``): an undecided gain is alternated, not
dropped; a checked gain moves the recommendation only beyond noise; what stays open is said."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_profile.profiler.decide import evidence
from ddp_profile.profiler.decide.choose import ChoiceThresholds, candidate_of, choose
from ddp_profile.profiler.decide.paired import alternation_open
from ddp_profile.profiler.store.probes import ProbeRecord

DEFAULTS = ChoiceThresholds()
OWN = {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "batch_size": 64}


def probe(index: int, throughput: float, kind: str = "sweep", rse: float = 0.01,
          **config: Any) -> ProbeRecord:
    line = {"id": f"p{index:03d}", "kind": kind, "status": "ok",
            "config": {**OWN, **config}, "throughput": throughput, "throughput_rse": rse,
            "data_wait_fraction": 0.5, "steps_measured": 30}
    return ProbeRecord.from_json(line)


def alternated(start: int, reference: float, candidate: float, group: str = "claim-x",
               **config: Any) -> list[ProbeRecord]:
    """``A B A B A B A`` windows of one launch, the candidate at ``config``."""
    probes = []
    for index, role in enumerate(["reference", "candidate"] * 3 + ["reference"]):
        line = probe(start + index, candidate if role == "candidate" else reference, "paired",
                     **(config if role == "candidate" else {})).to_json()
        line.update(pair={"role": role, "index": index, "group": group},
                    launch=f"p{start:03d}-screen")
        probes.append(ProbeRecord.from_json(line))
    return probes


def best_of(records: list[ProbeRecord]) -> ProbeRecord:
    chosen = choose([candidate_of(r) for r in records if r.counts_for_choice],
                    candidate_of(records[0]))
    return next(r for r in records if r.id == chosen.id)


def test_a_gain_within_noise_is_the_subject_of_the_check():
    """Two workers measured 1.3x in a noisy screen window (±15 %): ``choose`` keeps the
    script's settings, and the window becomes what the check alternates."""
    records = [probe(0, 1000.0, "baseline"), probe(1, 1300.0, rse=0.15, num_workers=2,
                                                    prefetch_factor=2)]
    assert best_of(records).id == "p000"
    assert evidence.subject(records, records[0], best_of(records)).id == "p001"
    open_ = evidence.verdict(records, records[0], best_of(records))
    assert open_.pick.id == "p000" and open_.checked is None and open_.undecided
    [seen] = evidence.seen(records, records[0], open_)
    assert seen.probe == "p001" and seen.ratio == pytest.approx(1.3)
    assert "within the noise" in seen.why


def test_a_short_probe_is_evidence_not_nothing():
    """Batch 256 measured 2.4x in a probe the script ended 3 steps short: ``choose`` sets short
    probes aside; the evidence layer alternates it."""
    short = probe(2, 2400.0, batch_size=256).to_json()
    short.update(short=True, steps_measured=27)
    records = [probe(0, 1000.0, "baseline"), probe(1, 1500.0, batch_size=128),
               ProbeRecord.from_json(short)]
    assert evidence.subject(records, records[0], records[0]).id == "p002"
    [first, second] = evidence.seen(records, records[0], evidence.verdict(
        records, records[0], records[0]))
    assert first.short and "fewer steps than asked" in first.why
    assert second.probe == "p001" and not second.short


def test_the_alternation_decides_an_undecided_gain():
    searched = [probe(0, 1000.0, "baseline"), probe(1, 1300.0, rse=0.15, num_workers=2,
                                                     prefetch_factor=2)]
    held = searched + alternated(2, 1000.0, 1200.0, num_workers=2, prefetch_factor=2)
    decided = evidence.verdict(held, held[0], best_of(held))
    assert decided.pick.id == "p001" and decided.undecided
    assert decided.claim.ratio == pytest.approx(1.2) and decided.claim.faster
    assert evidence.seen(held, held[0], decided) == []

    gone = searched + alternated(2, 1000.0, 1000.0, num_workers=2, prefetch_factor=2)
    kept = evidence.verdict(gone, gone[0], best_of(gone))
    assert kept.pick.id == "p000" and kept.checked.ratio == pytest.approx(1.0)
    [seen] = evidence.seen(gone, gone[0], kept)
    assert "cannot tell from none" in seen.why and "1.00x" in seen.why


def test_a_faster_contender_of_an_established_check_is_alternated_and_wins_a_larger_gain():
    """timm's shape: one worker established by its check; batch 128 measured faster still in
    noisy probes the script ended short, and is alternated with the script's settings next.
    It becomes the recommendation where its own alternation establishes a larger gain."""
    searched = [probe(0, 1000.0, "baseline"), probe(1, 1200.0, num_workers=1),
                probe(2, 1500.0, rse=0.25, num_workers=1, batch_size=128)]
    base, best = searched[0], best_of(searched)
    assert best.id == "p001" and evidence.contender(searched, base, best) is None  # unchecked
    first = searched + alternated(3, 1000.0, 1200.0, "claim-a", num_workers=1)
    assert evidence.contender(first, base, best).id == "p002"
    assert evidence.verdict(first, base, best).pick.id == "p001"  # until it is alternated

    def read(rate: float) -> evidence.Verdict:
        records = first + alternated(10, 1000.0, rate, "claim-b", num_workers=1, batch_size=128)
        assert evidence.contender(records, base, best).id == "p002"  # the same question
        return evidence.verdict(records, base, best)

    won = read(1400.0)
    assert won.pick.id == "p002" and won.claim.ratio == pytest.approx(1.4)
    assert won.because == evidence.OUTRAN and won.rival.id == "p001"
    assert won.rival_claim.ratio == pytest.approx(1.2)
    assert evidence.seen(first + alternated(10, 1000.0, 1400.0, "claim-b", num_workers=1,
                                            batch_size=128), base, won) == []
    for rate, why in ((1000.0, "cannot tell from none"),
                      (1150.0, "less than the recommendation's 1.20x")):
        lost = read(rate)
        assert lost.pick.id == "p001" and lost.claim.ratio == pytest.approx(1.2)
        assert lost.rival.id == "p002" and lost.rival_claim.ratio == pytest.approx(rate / 1000)
        records = first + alternated(10, 1000.0, rate, "claim-b", num_workers=1,
                                     batch_size=128)
        [seen] = evidence.seen(records, base, lost)
        assert seen.probe == "p002" and why in seen.why, seen.why


def test_no_contender_behind_a_check_that_established_nothing():
    """Where nothing is faster than the script's settings, only the first check can claim a
    gain by chance: a second is alternated only behind an established one."""
    searched = [probe(0, 1000.0, "baseline"), probe(1, 1200.0, num_workers=1),
                probe(2, 1500.0, rse=0.25, num_workers=1, batch_size=128)]
    records = searched + alternated(3, 1000.0, 1000.0, "claim-a", num_workers=1)
    assert evidence.verdict(records, records[0], best_of(records)).pick.id == "p000"
    assert evidence.contender(records, records[0], best_of(records)) is None


def test_nothing_to_check_where_nothing_measured_faster():
    records = [probe(0, 1000.0, "baseline"), probe(1, 1010.0, num_workers=2, prefetch_factor=2),
               probe(2, 700.0, num_workers=4, prefetch_factor=2)]
    assert evidence.subject(records, records[0], best_of(records)) is None
    decided = evidence.verdict(records, records[0], best_of(records))
    assert decided.pick.id == "p000" and evidence.seen(records, records[0], decided) == []


def test_another_batch_size_needs_a_clear_gain_even_when_checked():
    """Batch 128 alternated at 1.08x, beyond noise but under a ``clear_gain`` of 10 %: not a
    reason to change the training's batch size; 1.15x is."""
    strict = ChoiceThresholds(clear_gain=0.10)
    records = [probe(0, 1000.0, "baseline"), probe(1, 1200.0, rse=0.2, batch_size=128)]
    small = records + alternated(2, 1000.0, 1080.0, batch_size=128)
    decided = evidence.verdict(small, small[0], best_of(small), strict)
    assert decided.pick.id == "p000" and decided.checked.faster
    clear = records + alternated(2, 1000.0, 1150.0, batch_size=128)
    assert evidence.verdict(clear, clear[0], best_of(clear), strict).pick.id == "p001"


def waiting(record: ProbeRecord, share: float) -> ProbeRecord:
    return record.amended({"data_wait_fraction": share})


def test_a_compute_bound_scripts_small_loader_gain_is_checked_and_moves_it_only_past_clear_gain():
    """pytorch/examples' imagenet: its steps wait 13 % for data; 2 workers measured 1.04x in
    probes (the search keeps the script's settings: under ``clear_gain``), 1.11x in plain
    launches, its validation loader served by the same workers. Checked, not dropped; the
    check moves the settings only for a gain above ``clear_gain``, and says why not below."""
    records = [waiting(probe(0, 1000.0, "baseline"), 0.13),
               waiting(probe(1, 1040.0, rse=0.03, num_workers=2, prefetch_factor=2), 0.02)]
    assert best_of(records).id == "p000"
    assert evidence.subject(records, records[0], best_of(records)).id == "p001"
    assert evidence.subject(records[:1] + [waiting(probe(1, 1015.0, num_workers=2,
                                                         prefetch_factor=2), 0.02)],
                            records[0], records[0]) is None  # within the noise floor
    strict = ChoiceThresholds(clear_gain=0.10)  # a check's own interval is about ±6 %
    small = records + alternated(2, 1000.0, 1080.0, num_workers=2, prefetch_factor=2)
    kept = evidence.verdict(small, small[0], best_of(small), strict)
    assert kept.pick.id == "p000" and kept.checked.faster
    [seen] = evidence.seen(small, small[0], kept, strict)
    assert "1.08x" in seen.why and "faster, but" in seen.why and "above 10%" in seen.why
    clear = records + alternated(2, 1000.0, 1150.0, num_workers=2, prefetch_factor=2)
    assert evidence.verdict(clear, clear[0], best_of(clear), strict).pick.id == "p001"
    assert evidence.verdict(clear, clear[0], best_of(clear)).pick.id == "p001"


def timed(record: ProbeRecord, samples: int, seconds: float) -> ProbeRecord:
    """The probe's launch ran the script to its end: its whole run timed."""
    return record.amended({"script_samples": samples, "script_run_s": seconds, "short": True})


def test_a_run_that_pays_beyond_its_steps_checks_a_worker_count_its_steps_cannot_rank():
    """imagenet's main.py: its whole run 8 % slower than its steps (its validation, on the
    same ``-j`` workers, in no step); 2 workers read 1.02x by steps, under the noise floor, or
    0.97x: checked in whole launches all the same. Steps slower by more than the run pays
    beyond them, or a run that pays nothing beyond its steps, check nothing."""
    base = waiting(probe(0, 1000.0, "baseline"), 0.13)
    workers = waiting(probe(1, 1015.0, num_workers=2, prefetch_factor=2), 0.02)
    records = [timed(base, 9200, 10.0), workers]  # 920 samples/s over the whole run
    assert evidence.outside_steps(records[0]) == pytest.approx(0.08)
    assert evidence.subject(records, records[0], best_of(records)).id == "p001"
    because = evidence.checked_because(records, records[0], records[1])
    assert because != evidence.STEP_FASTER and "9% longer than their steps" in because
    steady = [timed(base, 9800, 10.0), workers]  # 2 % beyond its steps: within clear_gain
    assert evidence.outside_steps(steady[0]) is None
    assert evidence.subject(steady, steady[0], best_of(steady)) is None
    slower = [timed(base, 9200, 10.0),
              waiting(probe(1, 970.0, num_workers=2, prefetch_factor=2), 0.02)]
    assert evidence.subject(slower, slower[0], best_of(slower)).id == "p001"
    lost = [timed(base, 9200, 10.0),
            waiting(probe(1, 910.0, num_workers=2, prefetch_factor=2), 0.02)]
    assert evidence.subject(lost, lost[0], best_of(lost)) is None  # 9 % slower: beyond 8 %
    pinned = [timed(base, 9200, 10.0), waiting(probe(1, 1010.0, pin_memory=True), 0.13)]
    assert evidence.subject(pinned, pinned[0], best_of(pinned)) is None  # same workers
    launches = [ProbeRecord.from_json({**p.to_json(), "launch": p.id})  # a launch each
                for p in alternated(2, 1000.0, 1090.0, num_workers=2, prefetch_factor=2)]
    checked = records + launches
    decided = evidence.verdict(checked, checked[0], best_of(checked))
    assert decided.pick.id == "p001" and decided.because == because


def test_a_check_that_measured_its_subject_faster_names_it_though_its_steps_tied():
    """accelerate's ``cv_example.py``: its whole run 28 % slower than its steps; another
    worker count tied by steps (1.005x) and was checked in whole launches, which read it
    1.03x, faster beyond noise but under the 5 % a compute-bound script's settings move for.
    The script's settings are kept, and what the check measured is named with its figure,
    not left out because the steps had tied."""
    base = timed(waiting(probe(0, 1000.0, "baseline"), 0.06), 9000, 12.0)
    records = [base, waiting(probe(1, 1005.0, num_workers=2, prefetch_factor=2), 0.05)]
    assert evidence.subject(records, base, best_of(records)).id == "p001"
    launches = [ProbeRecord.from_json({**p.to_json(), "launch": p.id})  # a launch each
                for p in alternated(2, 1000.0, 1030.0, num_workers=2, prefetch_factor=2)]
    checked = records + launches
    decided = evidence.verdict(checked, base, best_of(checked))
    assert decided.pick.id == "p000" and decided.checked.faster
    assert decided.checked.ratio == pytest.approx(1.03)
    [seen] = evidence.seen(checked, base, decided)
    assert seen.probe == "p001" and seen.ratio == pytest.approx(1.03)
    assert seen.why == evidence.not_established(decided.checked, candidate_of(base),
                                                seen.config)
    assert "faster, but the script's settings move only for a gain above 5%" in seen.why
    assert "wait little for data" in seen.why and "cannot tell" not in seen.why
    tied = records + [p.amended({"throughput": 1005.0}) if p.pair.role == "candidate" else p
                      for p in launches]  # the check read the tie the steps had read
    assert evidence.seen(tied, base, evidence.verdict(tied, base, best_of(tied))) == []


def test_a_check_stops_once_its_interval_lies_below_the_gain_its_verdict_asks():
    """accelerate's ``cv_example.py`` (compute-bound): prefetch 4, faster by steps but not the
    search's best, alternated in launches read 1.00x, the fit 0.98-1.03x after 5: short of
    the 5 % the verdict asks of it, so the check stops there (it went on to 7 launches, of
    100 s each, against the 2 % noise floor). The search's best is asked the noise floor
    alone, and a check whose interval still reaches the asked gain goes on."""
    base = waiting(probe(0, 1000.0, "baseline"), 0.06)
    prefetch = waiting(probe(1, 1030.0, rse=0.03, prefetch_factor=4), 0.05)
    records = [base, prefetch]
    assert best_of(records).id == "p000"
    assert evidence.asked_gain(base, prefetch, best_of(records)) == pytest.approx(0.05)
    assert evidence.asked_gain(base, prefetch, prefetch) == pytest.approx(0.02)
    assert evidence.asked_gain(waiting(base, 0.5), prefetch, base) == pytest.approx(0.02)
    rates = (1000.0, 1012.0, 990.0, 1008.0, 1000.0)  # A B A B A: 1.01x, its fit about ±2.5 %
    launches = [ProbeRecord.from_json({**p.to_json(), "launch": p.id, "throughput": rate})
                for p, rate in zip(alternated(2, 1000.0, 1000.0, prefetch_factor=4), rates)]
    checked = records + launches
    claim = evidence.paired(checked, launches, DEFAULTS.interval_confidence,
                            DEFAULTS.launch_sd)
    assert not claim.faster and 1.02 < claim.bounds[1] < 1.05
    assert alternation_open(checked, launches, DEFAULTS)  # against the noise floor
    assert not alternation_open(checked, launches, DEFAULTS,
                                asked=evidence.asked_gain(base, prefetch, base))
    assert alternation_open(checked, launches, DEFAULTS,
                            asked=evidence.asked_gain(base, prefetch, prefetch))


def test_a_check_that_read_no_gain_is_never_worded_as_one():
    """The words for a check that did not establish its subject follow what it read: a gain
    it cannot tell from none (at or above 1), no gain where it read the subject slower within
    its noise, slower beyond noise where the interval it prints lies below 1."""
    from ddp_profile.profiler.decide.paired import PairedClaim

    own = candidate_of(probe(0, 1000.0, "baseline"))
    config = candidate_of(probe(1, 1200.0, num_workers=2)).config

    def why(ratio: float, interval: tuple, estimate: Any = None) -> str:
        claim = PairedClaim(ratio=ratio, interval=interval, probes=("p007", "p011"),
                            candidates=2, launches=5, estimate=estimate)
        return evidence.not_established(claim, own, config)

    assert why(1.04, (0.9, 1.2)).endswith(": a gain this check cannot tell from none")
    assert why(0.84, (0.65, 1.08)).endswith(": no gain (slower, within its noise)")
    assert "0.84x [0.65-1.08] (p007-p011)" in why(0.84, (0.65, 1.08))
    # the interval printed decides, never the narrower fit of the launches alone: the words
    # never contradict the figures beside them
    assert why(0.84, (0.65, 1.08), (0.75, 0.94)).endswith(": no gain (slower, within its noise)")
    assert why(0.84, (0.7, 0.95)).endswith(": slower, beyond its noise")


def test_a_faster_configuration_left_unchecked_names_the_one_checked():
    """Where the check went to another configuration than a faster one (the choice takes the
    cheapest within noise of the fastest: timm's ``train.py`` checked no workers at batch 32
    while 2 workers at batch 32 read faster in a short window), the faster one's why names
    the checked one and its figure, never "the configuration that measured fastest"."""
    searched = [probe(0, 1000.0, "baseline"), probe(1, 1330.0, batch_size=128),
                probe(2, 1470.0, rse=0.08, num_workers=2, batch_size=128)]
    records = searched + alternated(3, 1000.0, 960.0, "claim-a", batch_size=128)
    base = records[0]
    decided = evidence.verdict(records, base, records[1])
    assert decided.pick.id == "p000" and decided.checked_probe.id == "p001"
    [seen] = [s for s in evidence.seen(records, base, decided) if s.probe == "p002"]
    assert "the check went to w=0" in seen.why and "bs=128 (1.33x in the search)" in seen.why
    assert "measured fastest" not in seen.why
