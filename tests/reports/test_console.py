"""Console output marks short probes: in the progress line by their steps, with the advice to
run more epochs once, in the end-of-run summary."""

from __future__ import annotations

import io

from ddp_profile.profiler.store.probes import ProbeRecord
from ddp_profile.reports.console import ConsoleProgress, step_parts, summary_lines

SHORT = {"id": "p000", "kind": "baseline", "status": "ok", "throughput": 100.0,
         "data_wait_fraction": 0.1, "config": {"num_workers": 0}, "steps": 10,
         "steps_measured": 1, "short": True,
         "short_reason": "the script ended after 1 measured step(s) of the 10 asked: run more"}


def record(line: dict) -> ProbeRecord:
    """A probe as the sweep reports it (an ok one of its own settings where ``line`` is
    silent)."""
    return ProbeRecord.from_json({"id": "p000", "status": "ok", **line})


def joined(lines: list[str]) -> str:
    """The lines as one text, their wrapping undone."""
    return " ".join(line.strip() for line in lines)


def test_progress_line_marks_a_short_probe():
    stream = io.StringIO()
    ConsoleProgress(stream=stream)("done", {"entry": record(SHORT)})
    line = stream.getvalue()
    assert "short: 1 of 10 steps, the script ended first" in line
    assert "run more" not in line  # the advice is the summary's, once (grouped_warnings)
    stream = io.StringIO()
    ConsoleProgress(stream=stream)("done", {"entry": record({**SHORT, "short": False})})
    assert "short" not in stream.getvalue()


def test_an_alternations_launch_that_the_script_ended_gets_no_advice():
    """The claim's check of a short script runs each launch to the script's end on purpose:
    its progress line says so, with no advice to run more epochs, and the summary does not
    list it among the short probes."""
    paired = {**SHORT, "id": "p003", "kind": "paired",
              "pair": {"role": "candidate", "index": 1, "group": "claim-002"}}
    stream = io.StringIO()
    ConsoleProgress(stream=stream)("done", {"entry": record(paired)})
    assert "(ran to the script's end)" in stream.getvalue()
    assert "short:" not in stream.getvalue() and "run more" not in stream.getvalue()
    summary = {"script": "train.py", "world_size": 2, "device": "cpu", "gpu_available": True,
               "probes": [SHORT, paired], "baseline": {"num_workers": 0},
               "recommended": {"num_workers": 0}, "findings": [], "recommendation": {}}
    listed = [line for line in summary_lines(summary, "out", verbose=True) if " short (" in line]
    assert [line.split()[1] for line in listed] == ["p000"]
    warned = [line for line in summary_lines(summary, "out") if "ran short" in line]
    assert len(warned) == 1 and "p000 (1 of 10 steps)" in warned[0] and "p003" not in warned[0]


def test_summary_lists_short_probes_and_the_note_on_them():
    """By default one warning line lists the short probes; ``verbose`` each, and the
    notes."""
    note = "The baseline probe p000 is short, its figures rest on 1 step(s): the script ended."
    summary = {"script": "train.py", "world_size": 2, "device": "cpu", "gpu_available": True,
               "probes": [SHORT], "baseline": {"num_workers": 0},
               "recommended": {"num_workers": 0}, "findings": [],
               "recommendation": {"notes": [note, "another note"]}}
    lines = summary_lines(summary, "out")
    assert [line for line in lines if line.startswith("Warning: 1 probe ran short")]
    assert not [line for line in lines if "note:" in line]
    lines = summary_lines(summary, "out", verbose=True)
    assert any(line.startswith("    probe p000 short (1 of 10 steps): the script ended")
               for line in lines)
    assert "    note: another note" in lines
    assert all(len(line) <= 100 for line in lines)


def test_adaptive_progress_shows_no_made_up_total():
    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream)
    progress("axes", {"grid": [1, 2, 3, 4, 5], "counted": False})
    progress("done", {"entry": record({**SHORT, "short": False})})
    assert stream.getvalue().startswith("[1] p000")
    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream)
    progress("axes", {"grid": [1, 2, 3, 4, 5], "counted": True})
    progress("done", {"entry": record({**SHORT, "short": False})})
    assert stream.getvalue().startswith("[1/7] p000")


def test_the_sweeps_capacity_model_is_worded_here_as_a_progress_note():
    stream = io.StringIO()
    capacity = {"cpu_per_sample_s": 2e-3, "wait_per_sample_s": 5e-5, "runq": None}
    ConsoleProgress(stream=stream)("loading", {"capacity": capacity, "predicted": 3})
    assert joined(stream.getvalue().splitlines()) == (
        "loading: 2.00 ms CPU + 0.05 ms waiting per sample; 3 worker(s) per rank predicted to "
        "meet the loop's demand")


def test_a_short_probes_line_and_a_long_note_are_wrapped_to_the_console():
    """A short probe's line, with what its loading read and the launch it is of the plan,
    wraps at 100 characters (later lines indented) and says it is short after a semicolon;
    a note longer than a line (the page cache's) wraps the same way."""
    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream)
    progress.usual, progress.launches = 3, 2
    entry = {**SHORT, "id": "p001", "kind": "sweep", "steps": 30, "steps_measured": 20,
             "config": {"num_workers": 1, "pin_memory": False, "prefetch_factor": 2,
                        "batch_size": 16},
             "loading": {"read_per_sample_bytes": 10_000, "storage_share": 0.0}}
    progress("done", {"entry": record(entry)})
    progress("note", {"text": "page cache: warm (one epoch reads 0.00 GB, within half the "
                              "24.52 GB available: the job reads it from the page cache from "
                              "its second epoch on)"})
    lines = stream.getvalue().splitlines()
    assert all(len(line) <= 100 for line in lines), lines
    assert lines[0].startswith("[1] p001 sweep w=1") and lines[1].startswith("  ")
    text = joined(lines)
    assert ("0.01 MB read per sample, 0% from storage; short: 20 of 30 steps, the script ended "
            "first | 0:00 in, launch 2 of about 3 page cache: warm") in text, text


def test_summary_shows_the_loading_and_runnable_time_only_where_notable():
    capacity = {"bound": "cpu", "cpu_per_sample_s": 2e-3, "wait_per_sample_s": 5e-5,
                "runq": {"per_sample_s": 6e-3, "share": 0.75, "workers": 6, "notable": True}}
    summary = {"script": "train.py", "probes": [], "findings": [], "capacity": capacity}
    assert ("loading: 2.00 ms CPU + 0.05 ms waiting + 6.00 ms runnable (CPUs busy, 6 workers) "
            "per sample (CPU-bound)") in joined(summary_lines(summary, "out", verbose=True))
    capacity["runq"] = {**capacity["runq"], "share": 0.05, "notable": False}
    assert "  loading: 2.00 ms CPU + 0.05 ms waiting per sample (CPU-bound)" in summary_lines(
        summary, "out", verbose=True)


def test_a_probe_line_says_what_the_wait_cost_the_gpu_and_where_its_bytes_came_from():
    cuda = step_parts(record({"data_wait_fraction": 0.63, "gpu_starved_fraction": 0.0,
                              "comm_fraction": 0.02}))
    assert cuda == ", data wait 63% (GPU idle for it 0%), exposed comm 2%"
    files = step_parts(record({"data_wait_fraction": 0.5, "loading": {
        "read_per_sample_bytes": 131072, "storage_share": 0.95}}))
    assert files == ", data wait 50%, 0.13 MB read per sample, 95% from storage"
    assert step_parts(record({"data_wait_fraction": 0.5, "loading": {
        "read_per_sample_bytes": 8, "storage_share": None}})) == ", data wait 50%"


def test_the_summary_says_what_the_speedup_was_measured_from_and_why_no_ceiling():
    summary = {"script": "t.py", "world_size": 2, "device": "cpu", "probes": [],
               "recommended": {"num_workers": 4}, "expected_speedup": 2.2,
               "expected_speedup_interval": [2.0, 2.4],
               "recommendation": {"speedup_basis": "the script's settings and the "
                                  "recommendation alternated, 3 of each between the other's, "
                                  "windows of one launch (p008-p014)"},
               "ceiling_throughput": None,
               "ceiling_failed": "p005: replaying cached batches ran 900.0 samples/s, below"}
    lines = summary_lines(summary, "out")
    assert lines[1] == "Change num_workers default -> 4: 2.20x as fast [2.00-2.40]"
    assert not [line for line in lines if "measured from" in line or "p005" in line]
    lines = summary_lines(summary, "out", verbose=True)
    assert "  recommended w=4: 2.20x [2.00-2.40] vs baseline" in lines
    assert any(line.startswith("    measured from the script's settings and the recommendation "
                               "alternated") for line in lines)
    assert "  compute-only ceiling: none (p005: replaying cached batches ran 900.0 samples/s, " \
           "below)" in lines


def test_a_recommendation_that_keeps_its_workers_alive_says_so_and_prints_its_snippet():
    snippet = "DataLoader(dataset, batch_size=32, num_workers=3, persistent_workers=True)"
    basis = ("the script's settings and the recommendation with persistent_workers=True "
             "alternated, 2 of each between the other's, 5 launches (p014-p018)")
    summary = {"script": "train.py", "probes": [], "findings": [],
               "baseline": {"num_workers": 0, "batch_size": 32},
               "recommended": {"num_workers": 3, "batch_size": 32}, "expected_speedup": 1.5,
               "recommendation": {"snippet": snippet, "persistent_workers": True,
                                  "persistent_in_speedup": True, "speedup_basis": basis}}
    lines = summary_lines(summary, "out")
    assert lines[1] == "Change num_workers 0 -> 3, persistent_workers false -> true: 1.50x as fast"
    assert lines[2:4] == ["  DataLoader(dataset, batch_size=32, num_workers=3,",
                          "  persistent_workers=True)"] or f"  {snippet}" in lines
    verbose = summary_lines(summary, "out", verbose=True)
    assert "  recommended w=3 bs=32 persistent_workers: 1.50x vs baseline" in verbose
    assert any(line.startswith("    measured from the script's settings and the "
                               "recommendation with persistent_workers") for line in verbose)
    # kept alive on top of the recommendation: not in its figure, and the note says so
    on_top = "persistent_workers=True on top of it ran 1.17x [1.05-1.31] (probes p022-p026)"
    summary.update(baseline={"num_workers": 3, "batch_size": 32})
    summary["recommendation"].update(speedup_basis=None, persistent_in_speedup=False,
                                     notes=[on_top])
    lines = summary_lines(summary, "out")
    assert lines[1] == "Change persistent_workers false -> true: 1.50x as fast"
    assert f"  {snippet}" in lines
    assert f"    note: {on_top}" in summary_lines(summary, "out", verbose=True)
    summary["recommendation"].update(persistent_workers=False, notes=[])
    lines = summary_lines(summary, "out")
    assert f"  {snippet}" not in lines and lines[1].startswith("Keep the script's settings")


THREADS = {"threads": 1, "script_threads": 2, "setting": "OMP_NUM_THREADS=1",
           "config": {"num_workers": 0, "batch_size": 64}, "speedup": 3.0224,
           "interval": [2.3419, 3.9007], "probes": ["p013", "p019"],
           "check": {"alternated": True, "launches": 1, "rounds": 3, "windows": True}}


def test_a_measured_threads_change_leads_the_verdict_beside_the_loaders_settings():
    """The loader's settings kept and a threads change measured: the change to make, its
    figure and its check come first, then the loader's settings kept; after a loader change,
    the threads change follows it with the settings it was measured with."""
    summary = {"script": "mnist.py", "world_size": 2, "device": "cpu", "probes": [],
               "baseline": {"num_workers": 0, "batch_size": 64},
               "recommended": {"num_workers": 0, "batch_size": 64}, "expected_speedup": 1.0,
               "recommendation": {"probe_id": "p000", "baseline_probe_id": "p000",
                                  "threads": THREADS}}
    lines = summary_lines(summary, "out")
    assert lines[1:4] == [
        "Set intra-op threads per rank 2 -> 1 (OMP_NUM_THREADS=1): 3.02x as fast [2.34-3.90]",
        "  checked: alternated with the script's threads, 3 rounds of each in one launch",
        "Keep the script's loader settings (w=0 bs=64): no loader setting beat them beyond "
        "noise"], lines
    summary.update(recommended={"num_workers": 4, "batch_size": 64}, expected_speedup=1.5)
    summary["recommendation"] = {"probe_id": "p003", "baseline_probe_id": "p000",
                                 "check": {"alternated": True, "launches": 1, "rounds": 3},
                                 "threads": dict(THREADS, config={"num_workers": 4,
                                                                  "batch_size": 64})}
    lines = summary_lines(summary, "out")
    assert lines[1] == "Change num_workers 0 -> 4: 1.50x as fast", lines
    at = next(i for i, line in enumerate(lines) if line.startswith("And set"))
    assert at > 1 and joined(lines[at:at + 2]) == (
        "And set intra-op threads per rank 2 -> 1 (OMP_NUM_THREADS=1): 3.02x as fast "
        "[2.34-3.90] with the recommended settings")
    assert not any(line.startswith("Keep") for line in lines)
    del summary["recommendation"]["threads"]
    assert not any("threads per rank" in line for line in summary_lines(summary, "out"))


def test_the_summary_names_what_measured_faster_and_was_not_established():
    """Never silent where probes measured faster: each open gain with its figure, why, and
    the command that would settle it."""
    summary = {"script": "t.py", "world_size": 2, "device": "cpu", "probes": [],
               "recommended": {"num_workers": 0, "batch_size": 64}, "expected_speedup": 1.0,
               "recommendation": {"unsettled": [{
                   "probe": "p014", "ratio": 2.43,
                   "config": {"num_workers": 0, "pin_memory": False, "batch_size": 256},
                   "why": "its probes ran fewer steps than asked (the script ended first)",
                   "settle": "ddp-profile run t.py --batch-size 256 --pairs 5"}]}}
    second = dict(summary["recommendation"]["unsettled"][0], probe="p015", ratio=1.9,
                  config={"num_workers": 2, "pin_memory": False, "batch_size": 64})
    summary["recommendation"]["unsettled"].append(second)
    lines = summary_lines(summary, "out")
    at = next(i for i, line in enumerate(lines) if line.startswith("Not established: "))
    # the first whole, on two lines: the search's figure beside the settings, then why; the
    # next in a line of its own
    assert lines[at:at + 2] == [
        "Not established: num_workers=0, pin_memory=false, batch_size=256 (2.43x in the search): "
        "its probes", "  ran fewer steps than asked (the script ended first)"]
    assert lines[at + 2].startswith("Not established: num_workers=2") \
        and lines[at + 2].endswith(" …") and not lines[at + 3].startswith("  ")
    lines = summary_lines(summary, "out", verbose=True)
    at = lines.index("    not established: w=0 pin=false bs=256 measured 2.43x the script's "
                     "settings (p014): its probes")
    assert lines[at + 2] == "      to settle it: ddp-profile run t.py --batch-size 256 --pairs 5"


def test_a_checks_reading_is_not_cut_from_the_first_not_established():
    """What the check read is why the configuration is not established: on timm's train.py
    (2026-12-08) the first line ended "... it measured 1.11x [0.73-1.69]: a gain this check …",
    its reason cut. It reads whole within the first item's two lines."""
    why = ("alternated with the script's settings it measured 1.11x [0.73-1.69] (p009-p015): "
           "a gain this check cannot tell from none")
    summary = {"script": "t.py", "world_size": 1, "device": "cpu", "probes": [],
               "recommended": {"num_workers": 0, "batch_size": 16}, "expected_speedup": 1.0,
               "baseline": {"num_workers": 0, "prefetch_factor": None, "batch_size": 16},
               "recommendation": {"unsettled": [{
                   "probe": "p012", "ratio": 1.35, "why": why,
                   "config": {"num_workers": 1, "prefetch_factor": 2, "batch_size": 32}}]}}
    lines = summary_lines(summary, "out")
    at = next(i for i, line in enumerate(lines) if line.startswith("Not established: "))
    assert " ".join(line.strip() for line in lines[at:at + 2]) == (
        "Not established: num_workers=1, prefetch_factor=2, batch_size=32 (1.35x in the search):"
        " alternated with the script's settings it measured 1.11x [0.73-1.69]: a gain this check"
        " cannot tell from none")
    assert all(len(line) <= 100 for line in lines)


def test_the_plan_the_estimate_and_a_budgets_stop_fit_the_console():
    """Before the first probe the plan in launches; after the baseline the estimate from its
    launch; each probe line the time left of the budget; the budget's stop names what was not
    done. Every line fits 100 characters."""
    from ddp_profile.profiler.sweep.space import SearchSpace
    from ddp_profile.profiler.sweep.state import SweepOptions, plan

    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream)
    steps = plan(SweepOptions(budget_s=120.0), SearchSpace())
    progress("plan", {"plan": steps, "budget_s": 120.0})
    progress("done", {"entry": record({**SHORT, "short": False})})
    progress("estimate", {"plan": steps, "launch_s": 12.0, "budget_s": 120.0})
    progress("ladder", {"text": "worker ladder ended: 1 worker(s) 283 (p001) samples/s against "
                                "the script's 728: more workers than a rung that lost; not "
                                "measured: 3, 6, 12 worker(s) (p001-screen stopped early)"})
    progress("budget", {"launch": "sweep w=4 pin=false pf=2 bs=16", "estimate_s": 12.0,
                        "left_s": 3.0, "not_done": ["the claim's check (A B alternation)",
                                                    "the persistent_workers check"]})
    text = stream.getvalue()
    assert text.startswith("plan: about 3 launches, at most ") and "budget 2:00" in text
    assert "samples/s, data wait 10% | 2:00 left of the budget" in text  # its probe line
    assert "estimate: about 0:36 (3 launches of about 12 s, the baseline's)" in text
    assert "not done: the claim's check" in text.replace("\n  ", " ")
    assert all(len(line) <= 100 for line in text.splitlines()), text


def test_without_a_budget_a_probe_line_says_which_launch_of_the_plan_it_is():
    from ddp_profile.profiler.settings import LoaderSettings
    from ddp_profile.profiler.sweep.space import SearchSpace
    from ddp_profile.profiler.sweep.state import SweepOptions, plan

    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream)
    steps = plan(SweepOptions(), SearchSpace())
    steps_high = sum(step.high for step in steps)
    progress("plan", {"plan": steps, "budget_s": None})
    progress("start", {"probe_id": "p000", "config": LoaderSettings(), "kind": "baseline"})
    progress("estimate", {"plan": steps, "launch_s": 12.0, "budget_s": None})
    progress("done", {"entry": record({**SHORT, "short": False})})
    assert "launch 1 of about 3" in stream.getvalue().splitlines()[-1]
    for n in range(2, 5):  # past the plan's usual launches: how many it may still take
        progress("start", {"probe_id": f"p00{n}", "config": LoaderSettings(), "kind": "sweep"})
        progress("done", {"entry": record({**SHORT, "id": f"p00{n}", "short": False})})
    text = joined(stream.getvalue().splitlines())
    assert "launch 3 of about 3 [4] p004" in text
    assert text.endswith(f"launch 4, past the usual 3, of at most {steps_high}"), text


def test_the_summary_says_what_a_budget_left_out_or_that_it_left_nothing_out():
    """A budget that left something out: one short line in the summary, the whole list in
    the detail; one that left nothing out, and the ladder's end, in the detail alone."""
    base = {"script": "train.py", "world_size": 2, "device": "cpu", "gpu_available": True,
            "probes": [], "findings": [], "recommendation": {}}
    stopped = {"budget_s": 120.0, "spent_s": 118.0, "stopped": {
        "not_done": ["the claim's check (A B alternation)", "the persistent_workers check"]}}
    lines = summary_lines({**base, "search": {"budget": stopped}}, "out")
    said = [line for line in lines if line.startswith("Budget 2:00 spent, --resume goes on; "
                                                       "not done: the claim's check")]
    assert len(said) == 1 and all(len(line) <= 100 for line in lines)
    text = "\n".join(summary_lines({**base, "search": {"budget": stopped}}, "out",
                                   verbose=True))
    assert "budget 2:00 spent: the answer so far; not done: the claim's check" in text
    assert "the persistent_workers check (--resume goes on)" in text.replace("\n    ", " ")
    assert all(len(line) <= 100 for line in text.splitlines())
    fitted = {"budget_s": 120.0, "spent_s": 41.0, "stopped": None}
    ladder = {"text": "worker ladder ended: 1 worker(s) 283 (p001) samples/s against the "
                      "script's 728: more workers than a rung that lost"}
    quiet = summary_lines({**base, "search": {"budget": fitted, "ladder_stop": ladder}}, "out")
    assert not [line for line in quiet if "budget" in line.lower() or "ladder" in line]
    detail = summary_lines({**base, "search": {"budget": fitted, "ladder_stop": ladder}}, "out",
                           verbose=True)
    assert "    budget 2:00: 0:41 used, nothing left out" in detail
    assert any(line.startswith("    worker ladder ended: 1 worker(s) 283 (p001)")
               for line in detail)


def test_how_each_alternation_in_launches_stopped_is_said_once_in_the_detail_alone():
    base = {"script": "train.py", "world_size": 2, "device": "cpu", "gpu_available": True,
            "probes": [], "findings": [], "recommendation": {}}
    ended = [{"group": "threads-009", "check": "the threads check", "letters": "A B A B A",
              "launches": 5, "stopped": "futile"},
             {"group": "claim-012", "check": "the claim's check", "letters": "A B A B A B A",
              "launches": 7, "stopped": "decided"}]
    quiet = summary_lines({**base, "search": {"alternations": ended}}, "out")
    assert not [line for line in quiet if "stopped" in line]
    detail = "\n".join(summary_lines({**base, "search": {"alternations": ended}}, "out",
                                     verbose=True)).replace("\n    ", " ")
    assert detail.count("the threads check stopped after 5 launches (A B A B A): futile, no "
                        "outcome of the launches left could have made B win") == 1
    assert detail.count("the claim's check stopped after 7 launches (A B A B A B A): decided, "
                        "its interval settled the answer") == 1


def test_the_summary_names_the_report_only_where_one_was_written(tmp_path):
    """``--no-report`` (or a render that failed) leaves no report.html: the last lines name the
    run directory instead of a file that is not there."""
    summary = {"script": "train.py", "world_size": 1, "device": "cpu", "gpu_available": True,
               "probes": [{**SHORT, "short": False}], "baseline": {"num_workers": 0},
               "recommended": {"num_workers": 0}, "findings": [], "recommendation": {}}
    for verbose in (False, True):
        lines = summary_lines(summary, str(tmp_path), verbose=verbose)
        assert not [line for line in lines if line.startswith("Report:")]
        assert len([line for line in lines if line.lower().startswith("run directory:")]) == 1
        assert f"Run directory: {tmp_path} (no report.html)" in joined(lines)
    (tmp_path / "report.html").write_text("<html></html>")
    lines = summary_lines(summary, str(tmp_path))
    assert f"Report: {tmp_path / 'report.html'}" in lines
    assert not [line for line in lines if "no report.html" in line]
