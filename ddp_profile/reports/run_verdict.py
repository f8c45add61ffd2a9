"""The verdict a person reads first, shaped once from summary.json for the console and the
HTML report: what holds the job back (the cause, from the findings), what to change (the
snippet), how much it gains and how sure (speedup, interval, how it was checked, in a short
phrase), what was measured but not established, and the run's warnings grouped one line
per kind. Plain data, no markup; the method's detail stays in summary.json, the report's
lower sections and ``--verbose``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

from ddp_profile.profiler.settings import SETTING_KEYS
from ddp_profile.profiler.store.probes import Kind, ProbeRecord

# Probes of an alternation: one that the script ended is no advice to run more epochs (a
# check of a short script runs each launch to its end on purpose, and is read as such)
ALTERNATED = (Kind.PAIRED, Kind.PERSISTENT)
PROBE_REFERENCE = re.compile(r"\s*\((?:probes? )?p\d{3,}\b[^()]*\)")
SENTENCE_END = re.compile(r"(?<=[a-z0-9%)\]])\.\s+(?=[A-Z])")
TORN = re.compile(r"^probe (\S+) rank (\S+): skipped (\d+) unreadable line\(s\)$")


def without_probe_ids(text: str) -> str:
    """``text`` without its parenthesised probe references ("(p002)", "(probes p011-p017)"):
    they belong in the per-probe table, not in a sentence a reader needs."""
    return PROBE_REFERENCE.sub("", text)


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` (all of it where it has one), with its full stop."""
    first = SENTENCE_END.split(text.strip(), maxsplit=1)[0].rstrip()
    return first if not first or first.endswith((".", "!", "?")) else first + "."


def value_text(value: Any) -> str:
    if value is None:
        return "default"
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class ThreadsChange:
    """The intra-op threads per rank the run measured faster beyond noise
    (``recommendation.threads``), in the verdict's words."""

    threads: int  # per rank, what fits the CPUs
    script_threads: Optional[int]
    setting: str  # "OMP_NUM_THREADS=1"
    speedup: Optional[float]
    interval: Optional[tuple[float, float]]
    check: str  # how it was measured, in a short phrase
    measured_with: str  # the loader settings both sides ran with, in words

    def text(self, arrow: str = "→") -> str:
        """``intra-op threads per rank 2 → 1 (OMP_NUM_THREADS=1)``."""
        old = self.script_threads if self.script_threads is not None else "default"
        return f"intra-op threads per rank {old} {arrow} {self.threads} ({self.setting})"


@dataclass(frozen=True)
class Verdict:
    """What the first screen and the first console lines say."""

    cause_title: str  # "Training waits on the DataLoader", or that nothing was found
    cause_text: str  # one sentence of the cause's evidence ("" without a finding)
    cause_rule: Optional[str]  # the finding's rule id (the Findings section has the rest)
    severity: Optional[str]
    changes: tuple[tuple[str, str, str], ...]  # (setting, the script's, the recommended)
    snippet: str  # the DataLoader(...) call to use
    speedup: Optional[float]
    interval: Optional[tuple[float, float]]
    check: str  # how the speedup was measured, in a short phrase
    not_established: tuple[dict[str, str], ...] = ()  # text, settle (the command that would)
    warnings: tuple[str, ...] = field(default=())  # one line per kind
    threads: Optional[ThreadsChange] = None  # a measured threads change, beside the loader's

    @property
    def moves(self) -> bool:
        """The recommendation changes the script's settings."""
        return bool(self.changes)

    def change_text(self, arrow: str = "→") -> str:
        """``num_workers 0 → 1, prefetch_factor default → 2``; "" where nothing moves."""
        return ", ".join(f"{key} {old} {arrow} {new}" for key, old, new in self.changes)


def check_phrase(summary: dict[str, Any]) -> str:
    """How the expected speedup was measured, in a short phrase (``recommendation.check``,
    written by ``rules.recommend.speedup_check``)."""
    rec = summary.get("recommendation") or {}
    check = rec.get("check")
    if summary.get("expected_speedup") is None:
        return "nothing was measured to compare"
    if not check:
        if rec.get("probe_id") is not None and rec.get("probe_id") == rec.get("baseline_probe_id"):
            return "no loader setting beat them beyond noise"  # a threads
            # finding may still have measured a gain: the loader settings are what is kept
        return "see how it was measured"
    return alternation_phrase(check, "the script's settings")


def alternation_phrase(check: dict[str, Any], against: str) -> str:
    """A ``speedup_check`` in a short phrase: alternated with ``against``, how many rounds
    and launches; or two probes, not alternated."""
    if not check.get("alternated"):
        return "from two probes of the search, not alternated"
    launches = check.get("launches") or 1
    rounds = check.get("rounds")
    where = "in one launch" if launches == 1 else f"over {launches} launches"
    each = f"{rounds} rounds of each " if rounds else ""
    whole = ", each a whole run" if check.get("whole_runs") and launches > 1 else ""
    return f"alternated with {against}, {each}{where}{whole}"


def threads_change(summary: dict[str, Any]) -> Optional[ThreadsChange]:
    """The recommendation's measured threads change (``recommendation.threads``), None
    where it has none."""
    measured = (summary.get("recommendation") or {}).get("threads")
    if not isinstance(measured, dict) or measured.get("threads") is None:
        return None
    config = measured.get("config") or {}
    base, chosen = summary.get("baseline") or {}, summary.get("recommended") or {}
    keys = [k for k in SETTING_KEYS if k in config]
    if all(config.get(k) == chosen.get(k) for k in keys):
        with_ = "the recommended settings" if _changes(summary) else "the script's settings"
    elif all(config.get(k) == base.get(k) for k in keys):
        with_ = "the script's settings"
    else:
        with_ = ", ".join(f"{k}={value_text(config.get(k))}" for k in keys)
    interval = measured.get("interval")
    speedup = measured.get("speedup")
    return ThreadsChange(
        threads=int(measured["threads"]), script_threads=measured.get("script_threads"),
        setting=str(measured.get("setting") or f"OMP_NUM_THREADS={measured['threads']}"),
        speedup=float(speedup) if speedup is not None else None,
        interval=(float(interval[0]), float(interval[1]))
        if interval and len(interval) == 2 and None not in interval else None,
        check=alternation_phrase(measured.get("check") or {}, "the script's threads"),
        measured_with=with_)


def _cause(summary: dict[str, Any]) -> tuple[str, str, Optional[str], Optional[str]]:
    findings = [f for f in summary.get("findings") or [] if isinstance(f, dict)]
    rule = summary.get("cause")
    found = next((f for f in findings if f.get("rule") == rule), None) if rule else None
    found = found or (findings[0] if findings else None)
    if found is None:
        kept = not _changes(summary)
        return ("Nothing the rules look for holds this job back" if kept else
                "No finding: the change rests on its measured speedup", "", None, None)
    evidence = found.get("evidence")
    text = first_sentence(without_probe_ids(evidence)) if isinstance(evidence, str) else ""
    return (str(found.get("title") or found.get("rule")), text, str(found.get("rule") or ""),
            str(found.get("severity") or ""))


TORCH_PREFETCH = 2  # DataLoader's own prefetch_factor with workers
KEPT_ON_TOP = "persistent_workers=True on top"  # the recommendation's note where it adds them


def _idle_prefetch(base: dict[str, Any], chosen: dict[str, Any]) -> bool:
    """A prefetch_factor change that is no change to make: no workers on the recommended
    side, or workers started where the script had none at DataLoader's own prefetch."""
    if not chosen.get("num_workers"):
        return True
    return not base.get("num_workers") and chosen.get("prefetch_factor") in (None,
                                                                               TORCH_PREFETCH)


def _changes(summary: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """(setting, the script's, the recommended) for each setting the recommendation changes,
    ``persistent_workers`` where it adds them (measured with them, or on top of them)."""
    base, chosen = summary.get("baseline") or {}, summary.get("recommended") or {}
    if not chosen:
        return ()
    rec = summary.get("recommendation") or {}
    changes = [(key, value_text(base.get(key)), value_text(chosen.get(key)))
               for key in SETTING_KEYS if key in chosen and base.get(key) != chosen.get(key)
               and not (key == "prefetch_factor" and _idle_prefetch(base, chosen))]
    if rec.get("persistent_workers") and (rec.get("persistent_in_speedup") or any(
            str(note).startswith(KEPT_ON_TOP) for note in rec.get("notes") or [])):
        changes.append(("persistent_workers", "false", "true"))
    return tuple(changes)


def not_established(summary: dict[str, Any]) -> tuple[dict[str, str], ...]:
    """What measured faster and was not established, one short text each, with the command
    that would settle it."""
    items = []
    base = summary.get("baseline") or {}
    for item in (summary.get("recommendation") or {}).get("unsettled") or []:
        config = item.get("config") or {}
        keys = [k for k in SETTING_KEYS if k in config and config.get(k) != base.get(k)] \
            or [k for k in SETTING_KEYS if k in config]  # what differs from the script's
        settings = ", ".join(f"{k}={value_text(config.get(k))}" for k in keys)
        # the search's figure beside the settings, then why (what the check, where one ran,
        # read): a line the console cuts keeps the reason
        items.append({"text": f"{settings} ({float(item.get('ratio') or 0):.2f}× in the "
                              f"search): {without_probe_ids(str(item.get('why')))}",
                      "settle": str(item.get("settle") or ""), "probe": str(item.get("probe"))})
    return tuple(items)


def grouped_warnings(records: Iterable[ProbeRecord], other: Sequence[str] = ()
                     ) -> tuple[str, ...]:
    """The run's warnings, one line per kind with its probes listed: short probes (not an
    alternation's, which runs to the script's end on purpose), unreadable lines, the rest as
    written (each text once)."""
    lines: list[str] = []
    short = [p for p in records if p.ok and p.short and p.kind not in ALTERNATED]
    if short:
        listed = ", ".join(f"{p.id} ({p.steps_measured} of {p.steps_asked} steps)"
                           for p in short)
        lines.append(f"{len(short)} probe{'s' if len(short) > 1 else ''} ran short, the "
                     f"script ended first: {listed}. Run more epochs (or more data) so that "
                     "a probe reaches --warmup + --steps.")
    torn = [m.groups() for m in map(TORN.match, other) if m]
    if torn:
        lines.append("Unreadable lines skipped: " + ", ".join(
            f"{probe} rank {rank} ({count})" for probe, rank, count in torn) + ".")
    lines.extend(dict.fromkeys(w for w in other if not TORN.match(w)))
    return tuple(lines)


def build_verdict(summary: dict[str, Any], records: Iterable[ProbeRecord],
                  warnings: Sequence[str] = ()) -> Verdict:
    """The verdict of a run's summary (``summary.json``), its probe records and the warnings
    met while reading it."""
    title, text, rule, severity = _cause(summary)
    rec = summary.get("recommendation") or {}
    interval = summary.get("expected_speedup_interval")
    speedup = summary.get("expected_speedup")
    return Verdict(
        cause_title=title, cause_text=text, cause_rule=rule, severity=severity,
        changes=_changes(summary), snippet=str(rec.get("snippet") or ""),
        speedup=float(speedup) if speedup is not None else None,
        interval=(float(interval[0]), float(interval[1]))
        if interval and len(interval) == 2 and None not in interval else None,
        check=check_phrase(summary), not_established=not_established(summary),
        warnings=grouped_warnings(records, warnings), threads=threads_change(summary))
