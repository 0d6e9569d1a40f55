"""The plugin under test: load it alone into a fresh plugin manager, pick its chip, say how it runs.

`--plugin` takes what `HAL_PLUGINS` takes (an entry-point name of group `hal.plugins`, or an
importable module path), so a vendor's package and a test's module are found the same way. The
suite never touches the process-wide plugin manager: it builds its own here (for the contract
level) and in every worker (`hal.conformance.worker`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hal.contract.errors import ChipUnavailableError, HalError, UnknownChipError
from hal.core.plugin_manager import PluginManager, PluginRecord


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker binds before running a check (picklable; compared to reuse a binding).

    `chips` gives each rank's chip when ranks differ (the bridge level: plugin chip + cpu); empty
    means every rank binds `chip`. `emulated_chips` lists the chips run emulated."""

    plugins: tuple[str, ...]
    chip: str
    emulated: bool
    seed: int = 1234
    group_timeout_s: float = 60.0
    chips: tuple[str, ...] = ()
    addon: str = ""                  # the add-on under test (a plugin that declares no chip), if any

    def chip_for(self, rank: int) -> str:
        return self.chips[rank] if self.chips else self.chip


@dataclass
class Target:
    """The plugin under test as the suite sees it (built by `load_target`)."""

    plugin: str                      # as the user named it (entry point or module path)
    chip: str
    emulated: bool
    nproc: int = 2
    pm: Optional[PluginManager] = field(default=None, repr=False)
    record: Optional[PluginRecord] = field(default=None, repr=False)
    load_error: Optional[str] = None
    native_available: bool = False
    group_timeout_s: float = 60.0
    seed: int = 1234
    # An add-on under test (declares no chip: kernels, wrappers): the owner of `chip` is loaded with it,
    # `owner` names that plugin (importable module) and `plugins` is what every worker loads.
    owner: Optional[str] = None

    @property
    def is_addon(self) -> bool:
        return self.owner is not None

    @property
    def plugins(self) -> tuple[str, ...]:
        return (self.owner, self.plugin) if self.owner else (self.plugin,)

    @property
    def plugin_name(self) -> str:
        return self.record.name if self.record else self.plugin

    @property
    def plugin_version(self) -> Optional[str]:
        return self.record.info.version if self.record else None

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """The world sizes the collectives level checks: 2, 3 (odd) and 4 where --nproc allows, and
        --nproc itself; every one runs in the one pool of --nproc ranks (subgroups of its first ranks)."""
        return tuple(sorted({w for w in (2, 3, 4, self.nproc) if 2 <= w <= self.nproc}))

    def spec(self) -> WorkerSpec:
        return WorkerSpec(plugins=self.plugins, chip=self.chip, emulated=self.emulated, seed=self.seed,
                          group_timeout_s=self.group_timeout_s, addon=self.plugin_name if self.owner else "")

    def overrides(self) -> dict[str, list[str]]:
        """op -> kernels this plugin offers for its chip (as bound: emulated or native), best first."""
        if self.pm is None or self.record is None:
            return {}
        out: dict[str, list[str]] = {}
        for k in self.pm.op_kernels(self.chip, self.emulated):
            out.setdefault(k.op, []).append(k.describe())
        return out

    def addon_kernels(self) -> dict[str, list[str]]:
        """op -> kernels the add-on under test offers for `chip` (empty for a chip's own plugin)."""
        if not self.owner or self.pm is None:
            return {}
        out: dict[str, list[str]] = {}
        for k in self.pm.op_kernels(self.chip, self.emulated):
            if k.plugin == self.plugin_name:
                out.setdefault(k.op, []).append(k.describe())
        return out

    def capabilities(self) -> Any:
        """The capability matrix collectives are checked against: the plugin's, or for an emulated
        chip the plugin's intersected with what the CPU fabric does (as the accelerator binds it)."""
        if self.pm is None:
            return None
        caps = self.pm.capabilities(self.chip)
        if self.emulated:
            from hal.emulation.emulate import emulated_capabilities
            caps = emulated_capabilities(caps)
        return caps


def on_host(target: "Target") -> bool:
    """The chip's ranks share the host and hold no device: its tensors are host tensors, or it runs
    emulated (or the plugin did not load: nothing binds a device)."""
    if target.emulated or target.record is None:
        return True
    if target.pm is None:
        return False
    try:
        return target.pm.chip(target.chip).torch_device_type == "cpu"
    except Exception:
        return False


def default_nproc(target: "Target") -> int:
    """--nproc when none is given: 4 ranks (world sizes 2, 3 and 4) where ranks share the host (the chip's
    tensors are host tensors, or it runs emulated), else 2 (one device per rank on a node: a vendor
    passes --nproc up to its device count, 4 or more to cover an odd world size)."""
    return 4 if on_host(target) else 2


def load_plugin(plugin: str,
                owner: Optional[str] = None) -> tuple[PluginManager, Optional[PluginRecord], Optional[str]]:
    """A fresh manager holding only `plugin` (after `owner`, the owner of the chip an add-on is
    tested on); (manager, record of `plugin`, None) or (manager, None, error). Bounded: an import
    or registration hook that never returns is reported, not waited for."""
    from .bounds import LOAD_TIMEOUT_S, Hung, call_bounded
    pm = PluginManager()
    names = f"{owner},{plugin}" if owner else plugin
    try:
        call_bounded(lambda: pm.load_entry_points(env={"HAL_PLUGINS": names}), LOAD_TIMEOUT_S,
                     f"loading plugin {names!r} (its import and registration hooks)")
    except Hung as exc:
        return PluginManager(), None, f"Hung: {exc}"
    except HalError as exc:
        return pm, None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # an import that fails in an unexpected way is still a load failure
        return pm, None, f"{type(exc).__name__}: {exc}"
    if not pm.plugins:
        return pm, None, f"HAL_PLUGINS={plugin!r} registered no plugin"
    return pm, list(pm.plugins.values())[-1], None


def chip_owners() -> dict[str, str]:
    """chip -> importable module of the installed plugin that declares it (entry points of group
    hal.plugins; a plugin that fails to load is left out here and reported when tested itself)."""
    from importlib import metadata

    from .bounds import LOAD_TIMEOUT_S, Hung, call_bounded
    owners: dict[str, str] = {}
    for ep in sorted(metadata.entry_points(group="hal.plugins"), key=lambda e: e.name):
        pm = PluginManager()
        try:
            call_bounded(lambda: pm.load_entry_points(env={"HAL_PLUGINS": ep.name}), LOAD_TIMEOUT_S,
                         f"loading plugin {ep.name!r}")
        except (Hung, Exception):
            continue
        for rec in pm.plugins.values():
            for chip in rec.chips:
                owners.setdefault(chip, getattr(rec.module, "__name__", ep.name))
    return owners


def _addon_owner(record: PluginRecord, chip: Optional[str]) -> str:
    """The plugin to load under an add-on (a plugin that declares no chip) tested on `chip`."""
    owners = chip_owners()
    listing = ", ".join(f"{c} ({m})" for c, m in sorted(owners.items())) or "none"
    if chip is None:
        raise UnknownChipError(f"plugin {record.name!r} declares no chip (an add-on: kernels or wrappers for "
                               f"other plugins' chips); name the chip to certify it on with --chip "
                               f"(installed chips: {listing})")
    if chip not in owners:
        raise UnknownChipError(f"--chip {chip!r}: no installed plugin declares it, so add-on {record.name!r} "
                               f"cannot be tested on it (installed chips: {listing})")
    return owners[chip]


def load_target(plugin: str, chip: Optional[str] = None, emulate: bool = False, nproc: int = 2,
                group_timeout_s: float = 60.0, require_runnable: bool = True) -> Target:
    """Load `plugin`, choose its chip (`chip`, else the plugin's only/first chip) and check that it
    can run as asked. With `require_runnable`, a chip that is neither native here nor emulated raises
    `ChipUnavailableError` (every runtime check would fail for the same reason); a plugin that does
    not load is returned with `load_error` set (the contract level reports it)."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    pm, record, error = load_plugin(plugin)
    if record is None:
        return Target(plugin=plugin, chip=chip or plugin.rsplit(".", 1)[-1], emulated=emulate, nproc=nproc,
                      pm=pm, load_error=error, group_timeout_s=group_timeout_s)
    owner = None
    if not record.chips:  # an add-on: test it on top of the chip's owner, as it runs in a real install
        owner = _addon_owner(record, chip)
        pm, record, error = load_plugin(plugin, owner=owner)
        if record is None:
            return Target(plugin=plugin, chip=chip or "?", emulated=emulate, nproc=nproc, pm=pm, load_error=error,
                          group_timeout_s=group_timeout_s, owner=owner)
    if chip is None:
        chip = record.chips[0]
    elif chip not in pm.chips:
        raise UnknownChipError(f"plugin {record.name!r} does not declare chip {chip!r}; it declares "
                               f"{record.chips}")
    from .bounds import LOCAL_CHECK_TIMEOUT_S, Hung, call_bounded
    try:
        native = bool(call_bounded(lambda: pm.native_available(chip), LOCAL_CHECK_TIMEOUT_S,
                                   f"hal_native_available({chip!r})"))
    except Hung:
        native = False  # contract.native_probe reports the hang; the workers' binding is bounded too
        require_runnable = False
    except Exception:
        native = False  # contract.native_probe reports what it raised
    if require_runnable and not emulate and not native:
        raise ChipUnavailableError(f"chip {chip!r} (plugin {record.name!r}) is not natively available on "
                                   f"this machine; run it emulated with --emulate")
    return Target(plugin=plugin, chip=chip, emulated=emulate, nproc=nproc, pm=pm, record=record,
                  native_available=native, group_timeout_s=group_timeout_s, owner=owner)


@dataclass
class LocalContext:
    """What a check run in the calling process sees: the target and the results so far (the perf
    level's last check assembles the figures the earlier perf checks measured)."""

    target: Target
    results: dict = field(default_factory=dict)
