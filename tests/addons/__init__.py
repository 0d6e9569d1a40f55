"""Add-ons (plugins that declare no chip) the conformance suite certifies on a chip they do not own
(tests/test_conformance_addon.py)."""
