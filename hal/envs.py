"""Every `HAL_*` environment variable, declared once: name, type, default and what it does.

Code reads a variable through its declaration, at call time (tests and launchers set variables per
process, so nothing is cached):

    from hal import envs
    envs.HAL_CPU_CCL.get()              # 'auto' | 'shm' | 'gloo' (the default when unset or blank)
    envs.HAL_BRIDGE_CHUNK_BYTES.get(env)  # from a given mapping instead of os.environ
    envs.HAL_CLUSTER.text(env)          # the stripped raw text, '' when unset
    envs.HAL_EMULATE_TIME_SCALE.get(error=TimedEmulationError)  # a bad value raises that type instead

A value that does not parse raises `EnvVarError` (or the `error=` type a module documents), whose
message names the variable and the value: `HAL_EMULATE_TIME_SCALE='abc' is not a number ...`.
Blank means unset for every variable. `VARIABLES` lists them in declaration order; `help_text()` is
the environment section of `hal --help` and `markdown_table()` the table of docs/environment.md
(`python -m hal.envs` prints it; tests/test_envs.py checks the page against it).

Variables read outside Python (`HAL_BUILD_SHM` by setup.py, `HAL_VENV` by scripts/venv.sh,
`HAL_CONFORMANCE_LEVELS` by a generated plugin's tests) are declared here too, so the listing is whole.
This module imports nothing of ours but the contract's errors, so `hal --help` stays cheap.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Callable, Generic, Mapping, Optional, TypeVar

from hal.contract.errors import HalError

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class EnvVarError(HalError, ValueError):
    """An environment variable holds a value its declaration does not accept; names variable and value."""

    def __init__(self, message: str, name: str = "", value: str = ""):
        self.name, self.value = name, value
        super().__init__(message)


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable: `parse` turns the stripped, non-blank text into a value (raising ValueError with a
    reason); `check` (predicate, requirement) bounds the parsed value; `default` is the value when
    unset. `kind` and `default_text` are what the listings show; `in_help` puts it in `hal --help`
    as `NAME=example  brief` (brief defaults to doc)."""

    name: str
    kind: str
    default: T
    doc: str
    parse: Callable[[str], T]
    default_text: str = ""
    check: Optional[tuple[Callable[[T], bool], str]] = None
    in_help: bool = False
    example: str = ""
    brief: str = ""

    def text(self, env: Optional[Mapping[str, str]] = None) -> str:
        """The stripped text of the variable in `env` (default os.environ); '' when unset or blank."""
        env = os.environ if env is None else env
        return (env.get(self.name) or "").strip()

    def is_set(self, env: Optional[Mapping[str, str]] = None) -> bool:
        return bool(self.text(env))

    def get(self, env: Optional[Mapping[str, str]] = None, *,
            error: Callable[[str], Exception] = EnvVarError) -> T:
        """The parsed value in `env` (default os.environ), else `default`; a value that does not parse
        or fails `check` raises `error(message)` (EnvVarError by default) naming variable and value."""
        text = self.text(env)
        if not text:
            return self.default
        try:
            value = self.parse(text)
        except ValueError as exc:
            reason = f"{exc}{self._default_note(str(exc))}"
            raise self._error(error, f"{self.name}={text!r}{_sep(reason)}{reason}", text) from None
        if self.check is not None and not self.check[0](value):
            raise self._error(error, f"{self.name}={text!r} {self.check[1]}{self._default_note('')}", text)
        return value

    def _default_note(self, reason: str) -> str:
        shown = self.shown_default
        return "" if "default" in reason or shown == "(unset)" else f" (default {shown})"

    def _error(self, error: Callable[[str], Exception], message: str, text: str) -> Exception:
        return EnvVarError(message, self.name, text) if error is EnvVarError else error(message)

    @property
    def shown_default(self) -> str:
        if self.default_text:
            return self.default_text
        if self.default is None or self.default == "" or self.default == ():
            return "(unset)"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return str(self.default)


def _sep(reason: str) -> str:
    return " " if reason.startswith(("is ", "must ")) else ": "


# ---- parsers: each raises ValueError(reason) ------------------------------------------------------
def _str(text: str) -> str:
    return text


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("is not a number (an integer)") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a number") from None


def _bool(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected 1/0 (or true/false, yes/no, on/off)")


def _names(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _choice(*choices: str) -> Callable[[str], str]:
    """Lower-cased text that must be one of `choices`; the first is the default (named last in errors)."""
    def parse(text: str) -> str:
        low = text.lower()
        if low not in choices:
            others = " or ".join(repr(c) for c in choices[1:])
            raise ValueError(f"expected {others} (or {choices[0]!r}, the default)")
        return low
    return parse


def _wire_dtype(text: str) -> Optional[str]:
    low = text.lower()
    if low in ("bf16", "bfloat16"):
        return "bfloat16"
    if low in ("none", "off", "fp32", "float32"):
        return None
    raise ValueError("expected 'bf16' or unset")


def _positive(v: float) -> bool:
    return math.isfinite(v) and v > 0


VARIABLES: dict[str, EnvVar] = {}


def _declare(var: EnvVar[T]) -> EnvVar[T]:
    assert var.name not in VARIABLES, var.name
    VARIABLES[var.name] = var
    return var


def _flag(name: str, doc: str, default: bool = False, **kw) -> EnvVar[bool]:
    return _declare(EnvVar(name, "bool", default, doc, _bool, **kw))


# ---- chip selection and plugins (hal.core.selection, hal.core.plugin_manager) ---------------------
HAL_CHIP: EnvVar[str] = _declare(EnvVar(
    "HAL_CHIP", "chip name", "", "bind this chip natively (emulated if HAL_EMULATE also names it)", _str,
    in_help=True, example="NAME", brief="bind this chip (natively)"))
HAL_EMULATE: EnvVar[str] = _declare(EnvVar(
    "HAL_EMULATE", "rank map", "", "emulate chips per global rank in torchrun order (`cuda:2,ascend:2`), or "
    "one chip name for every rank; checked by hal.emulation.emulate", _str, in_help=True,
    example="cuda:2,ascend:2", brief="emulate chips per global rank (or one name for every rank)"))
HAL_CLUSTER: EnvVar[str] = _declare(EnvVar(
    "HAL_CLUSTER", "path", "", "take each rank's chip (and model, emulation) from this cluster spec TOML",
    _str, in_help=True, example="FILE.toml", brief="take each rank's chip from a cluster spec"))
HAL_PLUGINS: EnvVar[tuple[str, ...]] = _declare(EnvVar(
    "HAL_PLUGINS", "names", (), "load exactly these plugins (entry-point names or importable modules, "
    "comma-separated) instead of every installed entry point", _names, in_help=True, example="a,b",
    brief="load exactly these plugins (entry-point names or modules)"))
HAL_DISABLE_PLUGIN_AUTOLOAD = _flag(
    "HAL_DISABLE_PLUGIN_AUTOLOAD", "load no entry-point plugins (only HAL_PLUGINS and register())",
    in_help=True, example="1", brief="load no entry-point plugins")

# ---- emulation (hal.emulation) --------------------------------------------------------------------
HAL_CPU_CCL: EnvVar[str] = _declare(EnvVar(
    "HAL_CPU_CCL", "auto|shm|gloo", "auto", "CPU fabric of the cpu chip and emulated chips: auto picks the "
    "shared-memory fabric (hal.emulation.shm) when a group is on one host, else gloo",
    _choice("auto", "gloo", "shm"), in_help=True, example="auto|shm|gloo",
    brief="CPU fabric for the cpu chip and emulated chips (auto: shm on one host)"))
HAL_EMULATE_DILATION = _flag(
    "HAL_EMULATE_DILATION", "slow each emulated chip in wall time by fastest peer's bf16 peak / its own "
    "(exclusive with HAL_EMULATE_TIMED)")
HAL_EMULATE_TIMED = _flag(
    "HAL_EMULATE_TIMED", "timed emulation (hal.emulation.timed): each emulated chip's ops take its catalog "
    "speed's time x HAL_EMULATE_TIME_SCALE; communication stays the host's CPU fabric", in_help=True,
    example="1", brief="timed emulation: emulated chips' ops take their catalog speed's time")
HAL_EMULATE_TIME_SCALE: EnvVar[float] = _declare(EnvVar(
    "HAL_EMULATE_TIME_SCALE", "float", 3.0e5, "how many times slower than the real chip a timed-emulated "
    "chip runs (so the host keeps up)", _float, default_text="300000",
    check=(_positive, "must be a finite number > 0")))
HAL_EMULATE_TIMED_DTYPE: EnvVar[str] = _declare(EnvVar(
    "HAL_EMULATE_TIMED_DTYPE", "dtype map", "", "timed emulation charges each op at the rate of the dtype it "
    "computes in; this re-maps explicitly: `FROM=TO` (e.g. float32=tf32), `DTYPE` (every op at it), each "
    "optionally `CHIP:` scoped, comma-separated (hal.emulation.timed_cost.charge_plan)", _str,
    default_text="(each op's own dtype)"))
HAL_EMULATE_TIMED_MATRIX: EnvVar[str] = _declare(EnvVar(
    "HAL_EMULATE_TIMED_MATRIX", "path", "", "measured efficiency matrices (a JSON file or a directory of "
    "them) timed emulation charges at instead of peak", _str))
HAL_SHM_SLOT_BYTES: EnvVar[Optional[int]] = _declare(EnvVar(
    "HAL_SHM_SLOT_BYTES", "int", None, "shared-memory fabric: collective chunk per rank, in bytes", _int,
    default_text="1048576", check=(lambda v: v is not None and v > 0, "must be > 0")))
HAL_SHM_P2P_SLOT_BYTES: EnvVar[Optional[int]] = _declare(EnvVar(
    "HAL_SHM_P2P_SLOT_BYTES", "int", None, "shared-memory fabric: send/recv slot, in bytes", _int,
    default_text="262144", check=(lambda v: v is not None and v > 0, "must be > 0")))
HAL_SHM_SPIN_US: EnvVar[Optional[float]] = _declare(EnvVar(
    "HAL_SHM_SPIN_US", "float", None, "shared-memory fabric: microseconds a waiter spins before sleeping",
    _float, default_text="20", check=(lambda v: v is not None and v >= 0, "must be >= 0")))

# ---- the hetero bridge (hal.ccl_bridge.config; every rank must use the same values) ---------------
HAL_BRIDGE_SMALL_BYTES: EnvVar[int] = _declare(EnvVar(
    "HAL_BRIDGE_SMALL_BYTES", "int", 64 * 1024, "all_reduce of at most this many bytes takes the "
    "single-leader path", _int))
HAL_BRIDGE_CHUNK_BYTES: EnvVar[int] = _declare(EnvVar(
    "HAL_BRIDGE_CHUNK_BYTES", "int", 4 * 1024 * 1024, "the rail path moves large messages in chunks of "
    "about this size", _int))
HAL_BRIDGE_PIPELINE_DEPTH: EnvVar[int] = _declare(EnvVar(
    "HAL_BRIDGE_PIPELINE_DEPTH", "int", 2, "chunks in flight at once on the rail path (bounds staging "
    "memory)", _int))
HAL_BRIDGE_WIRE_DTYPE: EnvVar[Optional[str]] = _declare(EnvVar(
    "HAL_BRIDGE_WIRE_DTYPE", "bf16", None, "`bf16`: float32 SUM/AVG cross sub-clusters as bfloat16, "
    "accumulated in float32", _wire_dtype))
HAL_BRIDGE_DEBUG = _flag(
    "HAL_BRIDGE_DEBUG", "check op/dtype/shape/sequence agreement across ranks before each collective")
HAL_BRIDGE_GRACE_S: EnvVar[float] = _declare(EnvVar(
    "HAL_BRIDGE_GRACE_S", "float", 5.0, "seconds a waiter allows beyond the group's timeout before raising "
    "BridgeTimeoutError", _float))
HAL_BRIDGE_FORCE_STAGING = _flag(
    "HAL_BRIDGE_FORCE_STAGING", "copy CPU tensors through host staging too, as for a native chip (tests "
    "the native copy path on emulated chips)")
HAL_BRIDGE_MAX_PARTS: EnvVar[int] = _declare(EnvVar(
    "HAL_BRIDGE_MAX_PARTS", "int", 256, "most parts (lcm of the sub-cluster sizes) for the rail paths; "
    "above it (odd uneven sizes such as 97+64) the group runs leader-only", _int))

# ---- multi-host test bed (hal.testbed) -------------------------------------------------------------
HAL_RANK_NICS: EnvVar[tuple[str, ...]] = _declare(EnvVar(
    "HAL_RANK_NICS", "names", (), "set by the test bed: local rank i binds gloo to the i-th NIC "
    "(hal.testbed.rank_nic)", _names))
HAL_TESTBED_STATE_DIR: EnvVar[str] = _declare(EnvVar(
    "HAL_TESTBED_STATE_DIR", "path", "/run/hal-testbed", "where `hal testbed` keeps the state of the beds "
    "it brought up", _str))

# ---- training -------------------------------------------------------------------------------------
HAL_LAUNCHER_PID: EnvVar[int] = _declare(EnvVar(
    "HAL_LAUNCHER_PID", "int", 0, "set by `hal train` for its ranks: the launcher's pid; a rank ends itself "
    "when that process is gone (hal.launch.watchdog); 0: no watch", _int))
HAL_SHARED_DIR_WAIT_S: EnvVar[float] = _declare(EnvVar(
    "HAL_SHARED_DIR_WAIT_S", "float", 60.0, "seconds each node of a multi-node `hal train` waits to see the "
    "marker rank 0 wrote in the checkpoint folder (a shared file system may show it late; "
    "hal.launch.nodes.check_shared_dir); at most the config's timeout_s", _float))
HAL_TRAIN_PLAIN = _flag(
    "HAL_TRAIN_PLAIN", "`hal train` prints plain lines even on a terminal (no live table)")

# ---- read outside Python --------------------------------------------------------------------------
HAL_BUILD_SHM = _flag(
    "HAL_BUILD_SHM", "build the C++ shared-memory fabric at install (setup.py); 0: a pure-Python install "
    "that needs no compiler", default=True)
HAL_VENV: EnvVar[str] = _declare(EnvVar(
    "HAL_VENV", "path", "", "the virtual environment scripts/venv.sh creates or reuses", _str,
    default_text="<repo>/.venv"))
HAL_CONFORMANCE_LEVELS: EnvVar[str] = _declare(EnvVar(
    "HAL_CONFORMANCE_LEVELS", "levels", "core", "conformance levels a generated plugin's tests run "
    "(`hal new-plugin`'s tests/test_conformance.py)", _str))


def get(name: str, env: Optional[Mapping[str, str]] = None) -> object:
    """The value of the variable called `name` (KeyError for a name that is not declared)."""
    return VARIABLES[name].get(env)


def help_text() -> str:
    """The environment section of `hal --help`: the variables marked `in_help`, one a line."""
    rows = [(f"{v.name}={v.example}", v.brief or v.doc) for v in VARIABLES.values() if v.in_help]
    width = max(len(left) for left, _ in rows)
    lines = ["environment (every variable: docs/environment.md, or `python -m hal.envs`):"]
    lines += [f"  {left:<{width}} {brief}" for left, brief in rows]
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """Every variable as a Markdown table (docs/environment.md holds this text between its markers)."""
    lines = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    for v in VARIABLES.values():
        cells = (f"`{v.name}`", v.kind, v.shown_default, v.doc)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
