"""The chip catalog: validated, sourced `ChipProfile`s of the chip models users have (data in hal/data/catalog/*.toml).

One TOML file per chip name (`cuda`, `ascend`, `kunlun`); each model entry becomes a `ChipProfile`
whose every figure carries its public source, or is `unknown` with a note (never guessed). The
generic `cpu` chip is not here: its figures are host-dependent and `hal_cpu.profile.cpu_profile()`
builds it (measured later by the conformance perf level).

    hal.core.catalog.profiles("cuda")                 # {"H100": ChipProfile, "H800": ..., ...}
    hal.core.catalog.get("cuda", "H800")              # by key, alias or reported device name
    hal.core.catalog.match("cuda", "NVIDIA H100 80GB HBM3")   # -> H100 profile, None if unknown
    hal.core.catalog.default("ascend")                # -> 910B2
    hal.core.catalog.matrix("cuda", "H100")           # its efficiency matrix (hal.core.chip_matrix)
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Optional

from pydantic import ValidationError

from hal.contract.chips import DTYPE_KEYS, ChipProfile, Figure, FigureUnit
from hal.contract.errors import HalError, UnknownChipError
from hal.core.chip_matrix import ChipMatrix, ChipMatrixError, matrix_from_table

_FIELD_UNITS: dict[str, FigureUnit] = {"memory_bytes": "B", "memory_bandwidth": "B/s", "intra_node_bandwidth": "B/s",
                                        "nic_bandwidth": "B/s"}
_ENTRY_KEYS = {"model", "aliases", "match", "notes", "peak_flops"} | set(_FIELD_UNITS)


class CatalogError(HalError, ValueError):
    """A catalog data file is malformed; the message names the file, the model and the field."""


class UnknownModelError(UnknownChipError):
    """A chip model the catalog does not know; the message lists the models it knows."""


@dataclass(frozen=True)
class _Entry:
    key: str
    profile: ChipProfile
    aliases: tuple[str, ...]
    patterns: tuple[re.Pattern, ...]


@dataclass(frozen=True)
class _ChipCatalog:
    chip: str
    default: str
    entries: dict[str, _Entry]
    file: str
    # [efficiency.<model key>] and [efficiency.default]: the chip efficiency matrices
    matrices: dict[str, ChipMatrix]


def chips() -> list[str]:
    """Chip names the catalog has data for."""
    return sorted(_all())


def profiles(chip: str) -> dict[str, ChipProfile]:
    """Every catalogued model of `chip`: model key -> profile."""
    return {k: e.profile for k, e in _chip(chip).entries.items()}


def get(chip: str, model: str) -> ChipProfile:
    """The profile of `model`: a model key or alias (case-insensitive), else a device name that
    `match` recognises. Raises `UnknownModelError` naming the known models."""
    cat = _chip(chip)
    entry = _lookup(cat, model)
    if entry is None:
        found = match(chip, model)
        if found is not None:
            return found
        known = ", ".join(f"{k} ({e.profile.model})" for k, e in cat.entries.items())
        raise UnknownModelError(f"chip {chip!r} has no catalogued model {model!r}; known models: {known} "
                                f"(data: {cat.file})")
    return entry.profile


def match(chip: str, device_name: str) -> Optional[ChipProfile]:
    """The profile whose `match` patterns recognise the name the device reports, or None."""
    cat = _chip(chip)
    if not device_name:
        return None
    entry = _lookup(cat, device_name)
    if entry is not None:
        return entry.profile
    for e in cat.entries.values():
        if any(p.search(device_name) for p in e.patterns):
            return e.profile
    return None


def default(chip: str) -> ChipProfile:
    """The profile used when nothing names a model (cuda: H100, ascend: 910B2, kunlun: P800)."""
    cat = _chip(chip)
    return cat.entries[cat.default].profile


def profile_for(chip: str, model: Optional[str], unknown_dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16"),
                notes: str = "") -> ChipProfile:
    """What a vendor plugin's `hal_chip_profile` returns: `model` None -> the default; a catalog key,
    alias or device name (`NVIDIA H100 80GB HBM3`, `Ascend910B3`) -> that profile; anything else ->
    `unknown_profile` (never invented figures)."""
    if model is None:
        return default(chip)
    try:
        return get(chip, model)
    except UnknownChipError:  # UnknownModelError
        return unknown_profile(chip, model, unknown_dtypes, notes)


def unknown_profile(chip: str, model: str, dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16"),
                    notes: str = "") -> ChipProfile:
    """Every figure unknown for a model the catalog lacks; the conformance perf level measures them."""
    from hal.contract.chips import unknown
    why = f"unknown model {model!r}: not in the HAL catalog; figures are measured later by the perf level"
    return ChipProfile(
        chip=chip, model=model, peak_flops={d: unknown("FLOP/s", why) for d in dtypes},
        memory_bytes=unknown("B", why), memory_bandwidth=unknown("B/s", why),
        intra_node_bandwidth=unknown("B/s", why), nic_bandwidth=unknown("B/s", why),
        notes=why + (f"; {notes}" if notes else ""))


def matrix(chip: str, model: Optional[str] = None) -> ChipMatrix:
    """The efficiency matrix of `model` (a key, alias or device name; None: the chip's default model):
    its own `[efficiency.<key>]` table, else the chip file's `[efficiency.default]`."""
    cat = _chip(chip)
    entry = _lookup(cat, model) if model else cat.entries[cat.default]
    if entry is None and model:
        found = match(chip, model)
        entry = next((e for e in cat.entries.values() if e.profile is found), None)
    key = entry.key if entry is not None else None
    if key in cat.matrices:
        return cat.matrices[key]
    if "default" not in cat.matrices:
        raise CatalogError(f"{cat.file}: no [efficiency.{key}] and no [efficiency.default] table for {chip} {model}")
    return cat.matrices["default"]


def default_key(chip: str) -> str:
    return _chip(chip).default


# ---- loading and validation (once per process) ------------------------------------------------
def _normal(name: str) -> str:
    return re.sub(r"[\s_-]+", "", name).lower()


def _lookup(cat: _ChipCatalog, name: str) -> Optional[_Entry]:
    want = _normal(name)
    for key, e in cat.entries.items():
        if want == _normal(key) or want in (_normal(a) for a in e.aliases):
            return e
    return None


def _chip(chip: str) -> _ChipCatalog:
    cats = _all()
    if chip not in cats:
        raise UnknownChipError(f"the chip catalog has no chip {chip!r}; catalogued chips: {sorted(cats)} "
                               f"(the 'cpu' profile is built by hal_cpu.profile.cpu_profile(), not catalogued)")
    return cats[chip]


@lru_cache(maxsize=None)
def _all() -> dict[str, _ChipCatalog]:
    out: dict[str, _ChipCatalog] = {}
    folder = resources.files("hal") / "data" / "catalog"
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".toml"):
            cat = load_catalog_text(item.read_text(encoding="utf-8"), f"hal/data/catalog/{item.name}")
            if cat.chip in out:
                raise CatalogError(f"{cat.file}: chip {cat.chip!r} is already catalogued in {out[cat.chip].file}")
            out[cat.chip] = cat
    return out


def load_catalog_text(text: str, file: str) -> _ChipCatalog:
    """Parse and validate one catalog file's text (exposed for tests of the validation)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{file}: not valid TOML: {exc}") from exc
    chip, dflt = data.get("chip"), data.get("default")
    if not isinstance(chip, str) or not chip:
        raise CatalogError(f"{file}: top-level 'chip' must name the chip, got {chip!r}")
    sources = data.get("sources", {})
    models = data.get("models", {})
    if not models:
        raise CatalogError(f"{file}: no [models.*] entries")
    entries = {key: _entry(file, chip, key, raw, sources) for key, raw in models.items()}
    if dflt not in entries:
        raise CatalogError(f"{file}: default = {dflt!r} is not one of its models {sorted(entries)}")
    matrices = {}
    for key, raw in data.get("efficiency", {}).items():
        if key != "default" and key not in entries:
            raise CatalogError(f"{file}: [efficiency.{key}] names no model; models: {sorted(entries)} or 'default'")
        model = entries[key].profile.model if key in entries else f"{chip} (default)"
        try:
            matrices[key] = matrix_from_table(chip, model, raw, sources, f"{file}: efficiency.{key}")
        except ChipMatrixError as exc:
            raise CatalogError(str(exc)) from None
    return _ChipCatalog(chip=chip, default=dflt, entries=entries, file=file, matrices=matrices)


def _entry(file: str, chip: str, key: str, raw: dict, sources: dict) -> _Entry:
    where = f"{file}: models.{key}"
    extra = set(raw) - _ENTRY_KEYS
    if extra:
        raise CatalogError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {sorted(_ENTRY_KEYS)}")
    flops = raw.get("peak_flops", {})
    bad = set(flops) - set(DTYPE_KEYS)
    if bad:
        raise CatalogError(f"{where}.peak_flops: unknown dtype key(s) {sorted(bad)}; allowed: {DTYPE_KEYS}")
    try:
        profile = ChipProfile(
            chip=chip, model=raw.get("model", key), notes=raw.get("notes", ""),
            peak_flops={d: _figure(f"{where}.peak_flops.{d}", v, "FLOP/s", sources) for d, v in flops.items()},
            **{f: _figure(f"{where}.{f}", raw.get(f), unit, sources) for f, unit in _FIELD_UNITS.items()})
    except ValidationError as exc:
        raise CatalogError(f"{where}: does not validate as a ChipProfile: {exc}") from exc
    try:
        patterns = tuple(re.compile(p, re.IGNORECASE) for p in raw.get("match", []))
    except re.error as exc:
        raise CatalogError(f"{where}.match: bad regular expression: {exc}") from exc
    return _Entry(key=key, profile=profile, aliases=tuple(raw.get("aliases", [])), patterns=patterns)


def _figure(where: str, raw: Any, unit: FigureUnit, sources: dict) -> Figure:
    """`{value, src, where, note}` or `{unknown = "why"}` -> a Figure with its full source text."""
    if raw is None:
        raise CatalogError(f"{where}: missing; give a sourced value or `{{ unknown = \"why\" }}`")
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: expected an inline table, got {raw!r}")
    if "unknown" in raw:
        if set(raw) != {"unknown"}:
            raise CatalogError(f"{where}: an unknown figure takes only `unknown = \"why\"`, got {sorted(raw)}")
        return Figure(value=None, unit=unit, note=str(raw["unknown"]))
    extra = set(raw) - {"value", "src", "where", "note"}
    if extra or "value" not in raw:
        raise CatalogError(f"{where}: expected keys value, src, where, note; got {sorted(raw)}")
    src = raw.get("src")
    if src not in sources:
        raise CatalogError(f"{where}: src = {src!r} is not in [sources] ({sorted(sources)})")
    text = sources[src] + (f"; at: {raw['where']}" if raw.get("where") else "")
    try:
        return Figure(value=float(raw["value"]), unit=unit, source=text, note=raw.get("note", ""))
    except (ValidationError, TypeError, ValueError) as exc:
        raise CatalogError(f"{where}: value {raw['value']!r} does not validate: {exc}") from exc
