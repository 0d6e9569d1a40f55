"""The pluggy markers of the HAL contract: `hookspec` for the contract, `hookimpl` for plugins."""
import pluggy

PROJECT = "hal"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
