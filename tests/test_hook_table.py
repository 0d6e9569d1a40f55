"""The hook table of docs/writing-a-plugin.md is the one generated from the hook specifications, and
every spec says who is called and how the answers combine, consistently with its pluggy marker."""
from __future__ import annotations

from pathlib import Path

import pytest

from hal.contract import hooktable

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md"


def test_the_documented_hook_table_is_the_generated_one():
    documented = hooktable.table_in(DOC.read_text())
    generated = hooktable.render_hook_table()
    assert documented == generated, ("docs/writing-a-plugin.md's hook table differs from the hookspecs; paste "
                                     "the output of `python -m hal.contract.hooktable` between its markers")


def test_every_hook_states_who_is_called_and_how_answers_combine():
    specs = hooktable.hook_specs()
    assert [n for n, _ in specs][:2] == ["hal_plugin_info", "hal_chips"] and len(specs) == 8
    for name, fn in specs:
        fields = hooktable.spec_fields(name, fn)
        first = bool(hooktable.spec_options(fn).get("firstresult"))
        combined = fields["combined"]
        # the sentence agrees with the marker: a firstresult hook takes one answer, a collected one merges
        assert ("first non-None" in combined) == first, (name, combined)
        assert ("collected" in combined) == (not first), (name, combined)
        if "chip" in fn.__code__.co_varnames[:fn.__code__.co_argcount] and first:
            assert "never the owners of other chips" in fields["called"], (name, fields["called"])
    kernels = dict(specs)["hal_op_kernels"]
    assert "owners of other chips included" in hooktable.spec_fields("hal_op_kernels", kernels)["called"]


def test_a_spec_without_the_fields_is_refused():
    def hal_bogus(chip):
        """No fields."""
    with pytest.raises(ValueError, match="hal_bogus.*lacks the table field"):
        hooktable.spec_fields("hal_bogus", hal_bogus)
