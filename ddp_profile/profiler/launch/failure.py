"""How a probe's launch ended: ok, or why not (``classify``: status, reason, error, the rank
at the root of it), from its ranks' records and the launcher's log.

A timeout names the rank that stopped recording first, unless a rank recorded an exception
before it (its peers waited on it: the exception is the cause); an exception recorded by a rank
is the cause, unless it is a symptom (a peer's connection lost: the log may name the real cause); an
exit code without a recorded error is read from the log (torchrun's ``[rankN]:`` prefixes);
a script that built no DataLoader, took no batch or ended within the warm-up is a crash of its
own reason. Out-of-memory errors and CUDA-only scripts on a machine without CUDA are told apart.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from ddp_profile.profiler.launch.ranks import LaunchOutcome
from ddp_profile.profiler.settings import ProbePlan
from ddp_profile.profiler.store.probedir import RankData
from ddp_profile.profiler.store.probes import Status

OOM_PATTERNS = ("out of memory", "can't allocate memory", "cannot allocate memory",
                "outofmemoryerror", "memoryerror")
SYMPTOM_PATTERNS = ("connection closed by peer", "connection reset", "broken pipe",
                    "connectionreseterror", "brokenpipeerror")
NEEDS_CUDA_PATTERNS = ("doesn't have nccl built in", "nccl", "torch not compiled with cuda",
                       "no cuda gpus are available", "found no nvidia driver",
                       "cuda driver initialization failed", "cuda is not available",
                       "has no attribute '_cuda_")  # torch.cuda.set_device on a CPU build
_RANK_RE = re.compile(r"\brank\s*:?\s*(\d+)")
_ERROR_LINE_RE = re.compile(r"^\s*(?:\[(?:rank(\d+))?[^\]]*\]:?\s*)?"
                            r"([A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*|\S+: error: .*)$")


def classify(ranks: list[RankData], outcome: LaunchOutcome, plan: ProbePlan,
             timeout_s: float) -> tuple[Status, Optional[str], Optional[str], Optional[int]]:
    errors = sorted((r.error for r in ranks if r.error),
                    key=lambda e: (_is_symptom(e), e.get("t_ns") or 0))
    after = ""
    if outcome.timed_out:
        if not errors or _is_symptom(errors[0]):
            root = _stalled_rank(ranks)
            where = f"; rank {root} stopped recording first" if root is not None else ""
            return Status.TIMEOUT, "timeout", f"no result within {timeout_s:.0f} s{where}", root
        # a rank raised, and its peers waited on it in a collective until the deadline: the
        # exception is the cause (a killed DataLoader worker on a busy machine, near 15 s)
        after = f"; the launch then ran out its {timeout_s:.0f} s, its other ranks waiting"
    if errors:
        first = errors[0]
        if _is_symptom(first):  # every recorded error is a symptom: the log may name the cause
            rank, line = _failure_from_log(outcome.log_path, skip_symptoms=True)
            if line is not None:
                first = {"rank": rank, "last_line": line, "message": line}
        oom = first.get("oom") or _looks_oom(first.get("last_line", ""))
        causes = first.get("causes") or []
        during = f" (raised while handling: {causes[-1]})" if causes else ""
        if first.get("origin") == "data_loader" and _lost_connection(first):
            during += " (raised by the DataLoader: a DataLoader worker process died, killed " \
                      "or out of memory, while sending a batch)"
        text = f"rank {first.get('rank')}: {first.get('last_line')}{during}{after}"
        if _needs_cuda(first, ranks):
            return (Status.CRASH, "needs_cuda", "the script needs CUDA (it hard-codes nccl or "
                    "torch.cuda), and this machine has none: " + text, first.get("rank"))
        return (Status.OOM if oom else Status.CRASH, "exception", text, first.get("rank"))
    if outcome.returncode not in (0, None):
        rank, line = _failure_from_log(outcome.log_path)
        oom = _looks_oom(line or "")
        return (Status.OOM if oom else Status.CRASH, "exit_code",
                f"exit code {outcome.returncode}" + (f", rank {rank}" if rank is not None else "")
                + (f": {line}" if line else ""), rank)
    if not any(r.loaders for r in ranks):
        return (Status.CRASH, "no_dataloader",
                "the script finished without iterating a DataLoader", None)
    steps = max((len(r.training_steps()) for r in ranks), default=0)
    if steps == 0:
        return (Status.CRASH, "no_dataloader",
                "the script built a DataLoader but finished without taking a batch from it",
                None)
    if not any(s.get("measured") for r in ranks for s in r.training_steps()):
        if all(s.get("ahead") for r in ranks for s in r.training_steps()):
            return (Status.CRASH, "too_few_steps",
                    "each epoch held one batch a rank, which the loop takes before it trains "
                    "on it (it fetches a batch ahead): no step can be timed; give each rank "
                    "two or more batches an epoch", None)
        return (Status.CRASH, "too_few_steps",
                f"the script ended after {steps} step(s), before the {plan.warmup} warm-up "
                f"steps were over: lower --warmup or let it run longer", None)
    return Status.OK, None, None, None


def _is_symptom(error: dict[str, Any]) -> bool:
    """A collective failing because a peer died is a symptom; the peer's error is the cause.

    A connection the rank's own DataLoader lost (to a worker that died) is a cause."""
    return error.get("origin") != "data_loader" and _lost_connection(error)


def _lost_connection(error: dict[str, Any]) -> bool:
    text = f"{error.get('exc_type', '')} {error.get('message', '')}".lower()
    return any(p in text for p in SYMPTOM_PATTERNS)


def _needs_cuda(error: dict[str, Any], ranks: list[RankData]) -> bool:
    """A CUDA-only script on a machine without CUDA (no rank saw a GPU)."""
    if any(r.context.get("device") == "cuda" for r in ranks):
        return False
    text = f"{error.get('message', '')} {error.get('last_line', '')}".lower()
    return any(p in text for p in NEEDS_CUDA_PATTERNS)


def _looks_oom(text: str) -> bool:
    lowered = text.lower()
    return any(p in lowered for p in OOM_PATTERNS)


def _stalled_rank(ranks: list[RankData]) -> Optional[int]:
    last = {r.rank: max((s.get("t_ns") or 0 for s in r.steps), default=0) for r in ranks}
    if len(last) < 2:
        return None
    ordered = sorted(last.items(), key=lambda kv: kv[1])
    return ordered[0][0] if ordered[0][1] < ordered[1][1] else None


def _failure_from_log(log_path: str, skip_symptoms: bool = False
                      ) -> tuple[Optional[int], Optional[str]]:
    """The failing rank and the error's last line, from the launcher's log.

    torchrun prefixes each rank's output with ``[rankN]:``; that names the rank of the line.
    With ``skip_symptoms``, a peer's "connection closed" is passed over for the real cause.
    """
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()[-400:]
    except OSError:
        return None, None
    for match in map(_ERROR_LINE_RE.match, reversed(lines)):
        if not match or "ChildFailedError" in match.group(2):
            continue
        text = match.group(2).strip()
        if skip_symptoms and _is_symptom({"message": text}):
            continue
        rank = int(match.group(1)) if match.group(1) else next(
            (int(m.group(1)) for m in map(_RANK_RE.search, reversed(lines)) if m), None)
        return rank, text[:500]
    return None, None
