"""The root cause of a rank's failure as one line: what `hal train` / `hal testbed run` print on the
console for the first failing rank (hal.launch.check.report_rank_failure writes it).

A failure deep in a library arrives wrapped: torch DCP gathers every rank's exception into one
`CheckpointException` whose text is every rank's traceback (torch/distributed/checkpoint/api.py,
torch 2.13: `failures` maps rank -> (exception, stack)); a `raise X from exc` keeps the cause in
`__cause__`. `root_cause` follows both to the innermost exception (e.g. `OSError: [Errno 28] No space
left on device`); `one_line` names the outer error when it says something of its own, then the root.
"""
from __future__ import annotations

MAX_CHARS = 500


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception: DCP's per-rank failures (the lowest rank's) and `raise ... from` causes."""
    seen = {id(exc)}
    while True:
        failures = getattr(exc, "failures", None)
        inner = None
        if isinstance(failures, dict) and failures:
            first = failures[min(failures)]
            inner = first[0] if isinstance(first, tuple) and first else first
        if not isinstance(inner, BaseException):
            inner = exc.__cause__
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner


def _text(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def one_line(exc: BaseException) -> str:
    """'Type: message' of `exc`; when its root cause is another exception, the root first, then the
    outer error: 'OSError: [Errno 28] No space left on device (raised as CheckpointError: saving step 4
    ...)'. An outer error whose text is a dump of tracebacks (DCP's) is named by its type only."""
    root = root_cause(exc)
    own = _text(exc)
    if root is exc:
        return f"{type(exc).__name__}: {own}"[:MAX_CHARS]
    line = f"{type(root).__name__}: {_text(root)}"[:MAX_CHARS]
    outer = type(exc).__name__ if ("Traceback" in own or not own) else f"{type(exc).__name__}: {own}"
    room = MAX_CHARS - len(line) - len(" (raised as )")
    if room > 20:
        line += f" (raised as {outer if len(outer) <= room else outer[:room - 3] + '...'})"
    return line
