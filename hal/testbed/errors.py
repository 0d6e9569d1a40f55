"""Typed errors of the test bed: a bad spec, a missing kernel or tool feature, a failed setup step."""
from __future__ import annotations

from hal.contract.errors import HalError


class TestbedError(HalError):
    """Base of every test-bed error (a HalError, so `hal testbed` prints it as one line)."""

    __test__ = False  # not a pytest test class


class TestbedSpecError(TestbedError, ValueError):
    """A spec value out of range; the message names the field and the value."""


class TestbedUnavailable(TestbedError):
    """This machine cannot build the bed (not root, no netns/veth/bridge/tbf, no iptables for loss);
    the message says which step failed and why. Tests skip on it."""


class TestbedSetupError(TestbedError):
    """A command that builds or changes the bed failed (command, exit code, stderr)."""
