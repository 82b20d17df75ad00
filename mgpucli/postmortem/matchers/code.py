"""Failures of the training itself: a NaN loss, an error mgpu reported, an exception in the user's code."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from mgpucli.postmortem.lines import LogLine, by_rank, find_all
from mgpucli.postmortem.matchers.base import Match, following, hit_ranks
from mgpucli.postmortem.tracebacks import last_exception

# ------------------------------------------------------------------------------------------ NaN loss
_NAN = re.compile(r"the loss became NaN or inf at step (?P<step>\d+)|"
                  r"\bloss\b.{0,30}\b(?:became|is|was)\b.{0,20}\b(?:nan|inf|infinite|non-finite)\b"
                  r"(?:.{0,40}?(?:iteration|step)\D{0,3}(?P<step2>\d+))?|"
                  r"returned nan values in its \d+(?:st|nd|rd|th) output", re.IGNORECASE)
_NAN_FIX = ("Lower optim.lr (or add warmup), set trainer.clip_grad_norm=1.0, or use trainer.precision=bf16 "
            "instead of fp16; then continue from the last checkpoint with --resume auto (it holds no NaN: "
            "mgpu checks before every save).")


def nan_loss(lines: Sequence[LogLine]) -> Match | None:
    hits = find_all(lines, _NAN)
    if not hits:
        return None
    anchor, found = hits[0]
    step_text = found["step"] or found["step2"]
    step = int(step_text) if step_text else None
    hint = following(lines, anchor, 1)
    mgpu_hint = hint[0].text.strip() if hint and re.match(r"^(Lower|Set|Use)\b", hint[0].text.strip()) else None
    at = f" at step {step}" if step is not None else ""
    return Match("nan_loss", f"the loss became NaN or inf{at}", anchor.rank,
                 [anchor, *([hint[0]] if mgpu_hint else [])], _NAN_FIX, step=step,
                 details={"ranks": hit_ranks(hits)})


# ------------------------------------------------------------------------------------ mgpu's own errors
_MGPU_ERROR = re.compile(r"^error:\s+(?:\[rank (?P<rank>\d+)\]\s*)?(?P<msg>\S.*)$")
_RECIPE = re.compile(r"\bproblem\(s\) in recipe\b")
_NOT_A_CAUSE = re.compile(r"failed with an unexpected error|lost its connection to another rank|"
                          r"a collective timed out")


def mgpu_error(lines: Sequence[LogLine]) -> Match | None:
    """An error mgpu itself reported (``error: [rank N] message``, its indented detail lines, then its hint): it
    already says what to do. A problem in the recipe (a component that failed to build, a bad value) is named as
    such: bad input every rank refused, not a crash."""
    for line in lines:
        found = _MGPU_ERROR.match(line.text)
        if not found or _NOT_A_CAUSE.search(found["msg"]):
            continue
        after = following(lines, line, 40)
        details = []
        for nxt in after:
            if not nxt.text.startswith((" ", "\t")) or _MGPU_ERROR.match(nxt.text):
                break
            details.append(nxt)
        rest = after[len(details):len(details) + 1]
        hint = rest if rest and not _MGPU_ERROR.match(rest[0].text) and not rest[0].text.startswith(
            ("Traceback", "[")) else []
        fix = hint[0].text.strip() if hint else "See the message: mgpu names the problem and the setting to change."
        message = found["msg"].strip()
        stopped = re.match(r"stopped by (SIG\w+)", message)
        if stopped:
            return Match("stopped", message, line.rank, [line], fix, cause=False, details={"message": message})
        problems = [d.text.strip().removeprefix("- ") for d in details]
        if _RECIPE.search(message) and problems:
            title = f"a problem in the recipe, not a crash: {problems[0]}" + (
                f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            return Match("recipe_problem", title, line.rank, [line, *details[:3], *hint], fix,
                         details={"message": message, "problems": problems})
        return Match("mgpu_error", message, line.rank, [line, *details[:3], *hint], fix,
                     details={"message": message, "lines": problems})
    return None


# ------------------------------------------------------------------------------------ Python exception
_DISTRIBUTED = re.compile(r"Connection (?:closed|reset) by peer|Broken pipe|DistBackendError|DistNetworkError|"
                          r"DistStoreError|ProcessGroup|NCCL|gloo|[Tt]imed? ?out|SignalException|ChildFailedError")


def python_exception(lines: Sequence[LogLine]) -> Match | None:
    """A traceback ending in an ordinary exception: a bug in the training code or its data, not the job."""
    order = {id(line): i for i, line in enumerate(lines)}
    found = []
    for rank, own in by_rank(lines).items():
        tb = last_exception(own)
        if tb is None or tb.exc_line is None or _DISTRIBUTED.search(tb.exc_type + ": " + tb.message):
            continue
        if tb.short_type not in ("KeyboardInterrupt", "SystemExit"):
            found.append((order[id(tb.exc_line)], rank, tb))
    for _, rank, tb in sorted(found, key=lambda f: f[0])[:1]:
        frame = tb.user_frame()
        evidence = [tb.exc_line]
        details: dict[str, Any] = {"exception": tb.exc_type, "message": tb.message}
        if frame is not None:
            evidence = [frame.where, *([frame.code] if frame.code else []), tb.exc_line]
            details.update(file=frame.file, line=frame.line, function=frame.func)
        where = f" (in {frame.func}, {frame.file}:{frame.line})" if frame else ""
        fix = ("This is an ordinary Python exception in the training code (the model, the data, a transform or a "
               "callback), not a distributed problem: the other ranks only stopped because this one did. Fix it "
               "where the traceback points; it reproduces on one process with `mgpu train` (trainer.device=cpu).")
        text = f"{tb.short_type}: {tb.message}" if tb.message else tb.short_type
        return Match("python_exception", f"an exception in the training code, not a distributed problem: {text}"
                     f"{where}", rank, evidence, fix, details=details)
    return None
