"""Deliberately broken plugins, each with one realistic bug, that the conformance suite must catch.

Every module is a complete plugin (register it with HAL_PLUGINS=tests.broken_plugins.<name>); see
`_base.py` for how a bug is injected and what each module declares (BUG, CAUGHT_BY, ...).
"""
