"""docs/writing-a-plugin.md's ops reference lists every HAL op with its exact signature (and no other
op), and states what the docstrings alone used to: which half of swiglu's input is gated."""
from __future__ import annotations

import re
from pathlib import Path

from hal.contract.kernel import OP_NAMES, OP_SIGNATURES

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-plugin.md"


def _rows() -> dict[str, tuple[str, str]]:
    text = DOC.read_text()
    block = text[text.index("<!-- ops-reference: begin -->"):text.index("<!-- ops-reference: end -->")]
    rows = {}
    for line in block.splitlines():
        m = re.match(r"\| `(\w+)` \| `(\(.*?\))` \| (.+) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_every_op_is_in_the_reference_with_its_signature():
    rows = _rows()
    assert list(rows) == list(OP_NAMES)
    for op, (signature, meaning) in rows.items():
        assert signature == OP_SIGNATURES[op], op
        assert len(meaning) > 10, op


def test_swiglu_states_its_halves():
    meaning = _rows()["swiglu"][1]
    assert "**first** n" in meaning and "**second** n" in meaning and "silu(a) * b" in meaning
