"""Finds, validates and answers for plugins: entry points (group `hal.plugins`) plus explicit register.

Every hook is dispatched by pluggy (`pm.hook.<name>(...)`, or pluggy's `subset_hook_caller` of it),
so `firstresult`, `tryfirst`/`trylast` and (hook)wrappers behave as pluggy documents them; which
plugins take part in which call is described in `hal.contract.hookspecs`. Routing happens here, once:
a chip-scoped hook reaches the owner of the chip it names (and add-ons), never another chip's owner,
so an owner's hooks (those `hal.sdk.plugin` generates from a `hal.sdk.Chip`) need not check `chip`.

A plugin is whatever pluggy registers (a module, an object with hook methods), or a `hal.sdk.Chip`
subclass or instance, which `register` turns into its hooks with `hal.sdk.plugin` (so an entry point
may name the class: `acme = "hal_acme:AcmeChip"`).

Switches, in the spirit of pytest's:
- `HAL_DISABLE_PLUGIN_AUTOLOAD=1`: load no entry points (only `HAL_PLUGINS` and `register()`).
- `HAL_PLUGINS=a,b`: load exactly these (entry-point names, or importable module paths) instead of
  every entry point.
Every refusal is a `PluginValidationError` (or subclass) naming plugin, hook and what was wrong.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Mapping, Optional

import pluggy
from pydantic import ValidationError

from hal import envs
from hal.contract import hookspecs
from hal.contract.capabilities import CapabilityMatrix
from hal.contract.chip import Chip, plugin as chip_plugin
from hal.contract.chips import ChipProfile, ChipSpec
from hal.contract.version import CONTRACT_VERSION, PluginInfo, compatible
from hal.contract.errors import (ContractVersionError, DuplicateChipError, HalError, PluginHookError,
                     PluginValidationError, ProfileValidationError, UnknownChipError)
from hal.contract.markers import PROJECT
from hal.contract.kernel import OP_NAMES, OpKernel

ENTRY_POINT_GROUP = "hal.plugins"
REQUIRED_HOOKS = ("hal_plugin_info", "hal_chips")
REQUIRED_PER_CHIP = ("hal_native_available", "hal_chip_profile", "hal_device_runtime",
                     "hal_create_process_group", "hal_collective_capabilities")


@dataclass
class PluginRecord:
    """A registered plugin: its metadata, where it came from and which chips it owns."""

    name: str
    info: PluginInfo
    module: Any = field(repr=False)
    distribution: Optional[str] = None
    chips: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"name": self.name, "version": self.info.version,
                "contract_version": self.info.contract_version,
                "distribution": self.distribution, "chips": list(self.chips)}


def _definition(obj: Any) -> str:
    """`def name(args)` of a hook implementation, for error messages."""
    try:
        return f"def {obj.__name__}{inspect.signature(obj)}"
    except (TypeError, ValueError, AttributeError):
        return repr(obj)


class PluginManager:
    """The HAL's pluggy manager plus validation and chip-scoped calls (owner plugin only)."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginRecord] = {}
        self.chips: dict[str, tuple[ChipSpec, str]] = {}  # chip name -> (spec, owning plugin name)
        self.load_errors: list[str] = []

    # ---- discovery -------------------------------------------------------------------------
    def load_entry_points(self, env: Optional[Mapping[str, str]] = None) -> None:
        """Load plugins as the switches say. A broken plugin raises: it is never skipped silently."""
        explicit = envs.HAL_PLUGINS.get(env)
        eps = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
        if explicit:
            for name in explicit:
                if name in eps:
                    self._load_entry_point(eps[name])
                else:
                    try:
                        module = importlib.import_module(name)
                    except ImportError as exc:
                        raise PluginValidationError(name, None, f"HAL_PLUGINS names {name!r}, which is neither "
                                                    f"an entry point of group {ENTRY_POINT_GROUP!r} "
                                                    f"({sorted(eps)}) nor importable: {exc}") from exc
                    self.register(module)
            return
        if envs.HAL_DISABLE_PLUGIN_AUTOLOAD.get(env):
            return
        for ep in sorted(eps.values(), key=lambda e: e.name):
            self._load_entry_point(ep)

    def _load_entry_point(self, ep: metadata.EntryPoint) -> None:
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else None
        try:
            module = ep.load()
        except Exception as exc:
            raise PluginValidationError(ep.name, None, f"entry point {ep.value!r} failed to import: "
                                        f"{type(exc).__name__}: {exc}") from exc
        self.register(module, distribution=dist)

    # ---- registration and validation -------------------------------------------------------
    def register(self, plugin: Any, name: Optional[str] = None, distribution: Optional[str] = None) -> PluginRecord:
        """Register and validate a plugin (module, class instance or namespace with hookimpls, or a
        `Chip` subclass or instance, registered as its `ChipPlugin`)."""
        if isinstance(plugin, Chip) or (isinstance(plugin, type) and issubclass(plugin, Chip)):
            try:
                plugin = chip_plugin(plugin)
            except TypeError as exc:
                label = str(name or getattr(plugin, "__name__", repr(plugin)))
                raise PluginValidationError(label, None, str(exc)) from exc
        label = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        self._check_hook_names(plugin, label)
        try:
            self.pm.register(plugin, name=label)
        except pluggy.PluginValidationError as exc:
            hook = _hook_in_message(str(exc))
            raise PluginValidationError(label, hook, str(exc).replace("\n", "; ")) from exc
        except ValueError as exc:  # already registered
            raise PluginValidationError(label, None, str(exc)) from exc
        try:
            return self._validate(plugin, label, distribution)
        except Exception:
            self.pm.unregister(plugin)
            raise

    def _check_hook_names(self, plugin: Any, label: str) -> None:
        for attr in dir(plugin):
            opts = self.pm.parse_hookimpl_opts(plugin, attr)
            if opts is not None and not hasattr(hookspecs, attr):
                fn = getattr(plugin, attr)
                raise PluginValidationError(label, attr, f"unknown hook {attr!r} (no such hookspec in "
                                            f"contract {CONTRACT_VERSION}): {_definition(fn)}")
        for hook in REQUIRED_HOOKS:
            if self.pm.parse_hookimpl_opts(plugin, hook) is None:
                raise PluginValidationError(label, hook, f"required hook {hook!r} is not implemented")

    # ---- dispatch (always through pluggy) ----------------------------------------------------
    def _caller(self, hook: str, keep: Any = None, keep_non_owners: bool = True) -> Any:
        """pluggy's caller of `hook` (`pm.hook.<hook>`), restricted with pluggy's own
        `subset_hook_caller`: without the plugins that declare chips, except `keep`; plugins that
        declare no chip (add-ons, wrappers) stay unless `keep_non_owners` is False."""
        caller = getattr(self.pm.hook, hook)
        remove = [p for p in self.pm.get_plugins()
                  if p is not keep and (not keep_non_owners or self._owns_chips(p))]
        return self.pm.subset_hook_caller(hook, remove) if remove else caller

    def _owns_chips(self, plugin: Any) -> bool:
        return any(rec.module is plugin and rec.chips for rec in self.plugins.values())

    def _call_own(self, plugin: Any, hook: str, **kwargs: Any) -> Any:
        """`hook` answered by `plugin` alone (its own implementations and wrappers), through pluggy;
        used at registration, to validate what this plugin says."""
        return self._caller(hook, keep=plugin, keep_non_owners=False)(**self._spec_args(hook, kwargs))

    def _spec_args(self, hook: str, kwargs: dict) -> dict:
        """Every argument the spec names (pluggy warns about missing ones; None when not given)."""
        names = getattr(self.pm.hook, hook).spec.argnames
        return {k: kwargs.get(k) for k in names}

    def _call_checked(self, plugin: Any, label: str, hook: str, **kwargs: Any) -> Any:
        """`_call_own` while validating: a hook that raises refuses the plugin with an error naming
        plugin and hook (not a bare traceback from inside the plugin)."""
        try:
            return self._call_own(plugin, hook, **kwargs)
        except HalError:
            raise
        except Exception as exc:
            chip = f"chip {kwargs['chip']!r}: " if "chip" in kwargs else ""
            raise PluginValidationError(label, hook, f"{chip}raised {type(exc).__name__}: {exc}") from exc

    def _validate(self, plugin: Any, label: str, distribution: Optional[str]) -> PluginRecord:
        info = self._call_checked(plugin, label, "hal_plugin_info")
        if isinstance(info, dict):
            try:
                info = PluginInfo(**info)
            except ValidationError as exc:
                raise PluginValidationError(label, "hal_plugin_info", f"invalid PluginInfo: {exc}") from exc
        if not isinstance(info, PluginInfo):
            raise PluginValidationError(label, "hal_plugin_info", f"returned {info!r}, expected hal.PluginInfo")
        if not compatible(info.contract_version):
            raise ContractVersionError(label, "hal_plugin_info",
                                       f"implements contract {info.contract_version}, this HAL implements "
                                       f"{CONTRACT_VERSION} (same major version and a minor version <= "
                                       f"{CONTRACT_VERSION.split('.')[1]} required)")
        if info.name in self.plugins:
            raise PluginValidationError(label, "hal_plugin_info", f"a plugin named {info.name!r} is already "
                                        f"registered (from {self.plugins[info.name].distribution})")
        chips = self._call_checked(plugin, label, "hal_chips") or []
        if not isinstance(chips, (list, tuple)) or not all(isinstance(c, ChipSpec) for c in chips):
            raise PluginValidationError(label, "hal_chips", f"returned {chips!r}, expected a list of hal.ChipSpec")
        if chips:
            for hook in REQUIRED_PER_CHIP:
                if self.pm.parse_hookimpl_opts(plugin, hook) is None:
                    raise PluginValidationError(label, hook, f"required hook {hook!r} is not implemented "
                                                f"(the plugin declares chips {[c.name for c in chips]})")
        for chip in chips:
            if chip.name in self.chips:
                owner = self.chips[chip.name][1]
                raise DuplicateChipError(label, "hal_chips", f"chip {chip.name!r} is already provided by "
                                         f"plugin {owner!r}")
            self._validate_profile(plugin, label, chip.name)
            caps = self._call_checked(plugin, label, "hal_collective_capabilities", chip=chip.name)
            if not isinstance(caps, CapabilityMatrix):
                raise PluginValidationError(label, "hal_collective_capabilities",
                                            f"chip {chip.name!r}: returned {caps!r}, expected hal.CapabilityMatrix")
        record = PluginRecord(name=info.name, info=info, module=plugin, distribution=distribution,
                              chips=[c.name for c in chips])
        # Kernels are checked for every chip known so far (emulated: no vendor import needed).
        for chip_name in [c.name for c in chips] + list(self.chips):
            self._kernels_from(plugin, label, chip_name, emulated=True)
        for chip in chips:
            self.chips[chip.name] = (chip, info.name)
        self.plugins[info.name] = record
        return record

    def _validate_profile(self, plugin: Any, label: str, chip: str, model: Optional[str] = None,
                          bound: bool = False) -> ChipProfile:
        """The profile of `chip`, checked. At registration only `plugin` answers; once `bound`
        (bind time), the call is dispatched like every chip-scoped hook (add-ons take part)."""
        try:
            # A profile the hook builds itself fails inside the hook: that is still a profile that
            # does not validate (ProfileValidationError), not a crash of the hook.
            try:
                if bound:
                    prof = self._caller("hal_chip_profile", keep=plugin)(chip=chip, model=model)
                else:
                    prof = self._call_own(plugin, "hal_chip_profile", chip=chip, model=model)
            except (ValidationError, HalError):
                raise
            except Exception as exc:
                raise PluginValidationError(label, "hal_chip_profile", f"chip {chip!r}: raised "
                                            f"{type(exc).__name__}: {exc}") from exc
            if isinstance(prof, dict):
                prof = ChipProfile(**prof)
        except ValidationError as exc:
            raise ProfileValidationError(label, "hal_chip_profile", f"chip {chip!r}: profile does not "
                                         f"validate: {exc}") from exc
        if not isinstance(prof, ChipProfile):
            raise ProfileValidationError(label, "hal_chip_profile", f"chip {chip!r}: returned {prof!r}, "
                                         f"expected hal.ChipProfile")
        if prof.chip != chip:
            raise ProfileValidationError(label, "hal_chip_profile", f"chip {chip!r}: profile is for chip "
                                         f"{prof.chip!r}")
        return prof

    def _kernels_from(self, plugin: Any, label: str, chip: str, emulated: bool) -> list[OpKernel]:
        """`plugin`'s own kernels for `chip` (validation at registration)."""
        if self.pm.parse_hookimpl_opts(plugin, "hal_op_kernels") is None:
            return []
        results = self._call_checked(plugin, label, "hal_op_kernels", chip=chip, emulated=emulated) or []
        return self._checked_kernels(results, plugin, label, chip)

    def _checked_kernels(self, results: Any, plugin: Any, label: str, chip: str) -> list[OpKernel]:
        """Flatten pluggy's list of per-implementation results and check every kernel."""
        if not isinstance(results, list):
            raise PluginValidationError(label, "hal_op_kernels", f"chip {chip!r}: returned {results!r}, "
                                        f"expected a list of hal.OpKernel")
        kernels: list[OpKernel] = []
        for r in results:
            if r is None:
                continue
            if not isinstance(r, (list, tuple)):
                raise PluginValidationError(label, "hal_op_kernels", f"chip {chip!r}: returned {r!r}, "
                                            f"expected a list of hal.OpKernel")
            kernels.extend(r)
        out = []
        for k in kernels:
            if not isinstance(k, OpKernel):
                raise PluginValidationError(label, "hal_op_kernels", f"chip {chip!r}: returned {k!r}, "
                                            f"expected hal.OpKernel")
            if k.op not in OP_NAMES:
                raise PluginValidationError(label, "hal_op_kernels", f"chip {chip!r}: unknown op {k.op!r} in "
                                            f"{k!r}; HAL ops are {list(OP_NAMES)}")
            if not callable(k.fn):
                raise PluginValidationError(label, "hal_op_kernels", f"op {k.op!r}: kernel {k.fn!r} is not callable")
            out.append(OpKernel(op=k.op, fn=k.fn, priority=k.priority, name=k.name,
                                plugin=self._name_of(plugin, label)))
        return out

    def _name_of(self, plugin: Any, label: str) -> str:
        for rec in self.plugins.values():
            if rec.module is plugin:
                return rec.name
        return label

    # ---- answers (bind time, never hot path) ------------------------------------------------
    def chip(self, name: str) -> ChipSpec:
        return self._owner(name)[0]

    def _owner(self, chip: str) -> tuple[ChipSpec, PluginRecord]:
        try:
            spec, plugin = self.chips[chip]
        except KeyError:
            raise UnknownChipError(f"no registered plugin provides chip {chip!r}; known chips: "
                                   f"{sorted(self.chips)} (plugins: {sorted(self.plugins)})") from None
        return spec, self.plugins[plugin]

    def call_owner(self, chip: str, hook: str, **kwargs: Any) -> Any:
        """Dispatch chip-scoped `hook` through pluggy: the owner of `chip` plus every plugin that
        declares no chip (add-ons: wrappers, tryfirst overrides), without the other chips' owners.
        Errors name the owner and the hook."""
        _, rec = self._owner(chip)
        try:
            return self._caller(hook, keep=rec.module)(**self._spec_args(hook, dict(kwargs, chip=chip)))
        except HalError:
            raise
        except Exception as exc:
            raise PluginHookError(rec.name, hook, f"chip {chip!r}: {type(exc).__name__}: {exc}") from exc

    def native_available(self, chip: str) -> bool:
        try:
            return bool(self.call_owner(chip, "hal_native_available"))
        except Exception:  # a probe must never raise; treat a broken probe as absent
            return False

    def profile(self, chip: str, model: Optional[str] = None) -> ChipProfile:
        _, rec = self._owner(chip)
        return self._validate_profile(rec.module, rec.name, chip, model, bound=True)

    def capabilities(self, chip: str) -> CapabilityMatrix:
        return self.call_owner(chip, "hal_collective_capabilities")

    def op_kernels(self, chip: str, emulated: bool) -> list[OpKernel]:
        """All plugins' kernels for `chip`, highest priority first (stable by registration).

        Each provider is asked through pluggy with the other providers removed (wrapper-only
        plugins stay), so every kernel is attributed to the plugin that returned it."""
        kernels: list[OpKernel] = []
        providers = [rec for rec in self.plugins.values() if self._provides(rec.module, "hal_op_kernels")]
        for rec in providers:
            others = [p.module for p in providers if p is not rec]
            caller = self.pm.subset_hook_caller("hal_op_kernels", others) if others else self.pm.hook.hal_op_kernels
            kernels.extend(self._checked_kernels(caller(chip=chip, emulated=emulated), rec.module, rec.name,
                                                 chip))
        return sorted(kernels, key=lambda k: -k.priority)

    def _provides(self, plugin: Any, hook: str) -> bool:
        """Whether `plugin` has a plain (non-wrapper) implementation of `hook`."""
        opts = self.pm.parse_hookimpl_opts(plugin, hook)
        return opts is not None and not (opts.get("wrapper") or opts.get("hookwrapper"))

    def plugin_of(self, chip: str) -> PluginRecord:
        return self._owner(chip)[1]


def _hook_in_message(text: str) -> Optional[str]:
    # pluggy: "Plugin 'x' for hook 'hal_chips'\nhookimpl definition: ..."
    marker = "for hook '"
    if marker in text:
        return text.split(marker, 1)[1].split("'", 1)[0]
    return None


_DEFAULT: Optional[PluginManager] = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, loading entry points on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        pm = PluginManager()
        pm.load_entry_points()
        _DEFAULT = pm
    return _DEFAULT


def set_plugin_manager(pm: Optional[PluginManager]) -> None:
    """Replace (or with None, forget) the process-wide manager; for tests and notebooks."""
    global _DEFAULT
    _DEFAULT = pm
