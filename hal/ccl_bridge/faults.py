"""Fault injection for the bridge's own fault tests: kill or freeze this rank at a named point.

`arm("all_reduce.rail.cross", "kill", after=0)` makes the next time this process reaches that point
inside a collective `os._exit(17)` (a rank dying mid-collective) or, with "freeze", sleep for
`seconds` (a rank hanging mid-collective, its connections still open). Unarmed, `point()` is one
dict lookup on an empty dict. Points: all_reduce.leader.cross, all_reduce.rail.cross,
all_to_all.rail.cross (after the intra hand-off, before the rail exchange),
collective.start.
"""
from __future__ import annotations

import os
import time

_ARMED: dict[str, list] = {}


def arm(point_name: str, action: str, after: int = 0, seconds: float = 60.0) -> None:
    if action not in ("kill", "freeze"):
        raise ValueError(f"fault action {action!r}: expected 'kill' or 'freeze'")
    _ARMED[point_name] = [action, after, seconds]


def disarm() -> None:
    _ARMED.clear()


def point(name: str) -> None:
    if not _ARMED:
        return
    entry = _ARMED.get(name)
    if entry is None:
        return
    if entry[1] > 0:
        entry[1] -= 1
        return
    action, _, seconds = _ARMED.pop(name)
    if action == "kill":
        os._exit(17)
    time.sleep(seconds)
