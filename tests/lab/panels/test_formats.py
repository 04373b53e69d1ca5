"""fp8lab.lab.panels.formats: notebook 01's bit panel and number line, computed against torch's own FP8 dtypes
and the formats' definitions, and what a typed value moves in place."""

from __future__ import annotations

import math

import torch

from fp8lab.lab.panels.formats import BitsPanel, NumberLinePanel
from tests.lab.drawings import whole_drawings


def test_a_code_decodes_as_torch_reads_it_with_its_formula():
    panel = BitsPanel()
    for code in (0x38, 0x01, 0xC0, 0x7F):
        d = panel.compute(fmt="e4m3", code=code, value=1.0)
        want = float(torch.tensor([code], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        assert (math.isnan(d["value"]) and math.isnan(want)) or d["value"] == want
        assert d["bits"] == format(code, "08b")
    assert panel.compute(fmt="e4m3", code=0x38, value=1.0)["formula"] == "(-1)^0 x 2^(7-7) x (1 + 0/8)"
    assert "subnormal" in panel.compute(fmt="e4m3", code=0x01, value=1.0)["formula"]
    assert panel.compute(fmt="e4m3", code=0x7F, value=1.0)["formula"] == "special code"
    e5m2 = panel.compute(fmt="e5m2", code=0x3C, value=1.0)
    assert e5m2["value"] == float(torch.tensor([0x3C], dtype=torch.uint8).view(torch.float8_e5m2).float()) == 1.0


def test_a_code_wraps_to_the_formats_width():
    d = BitsPanel().compute(fmt="e2m1", code=0x13, value=1.0)
    assert d["code"] == 0x3 and d["bits"] == "0011" and d["value"] == 1.5  # E2M1 0 01 1: 2^0 * 1.5


def test_the_number_line_counts_each_formats_values_in_the_window():
    d = NumberLinePanel().compute(formats=["e4m3", "e5m2"], window=(0, 1))
    # [1, 2]: E4M3 has 8 values per binade (3 mantissa bits) plus 2 itself; E5M2 has 4 plus 2
    assert d["rows"]["e4m3"]["values in range"] == 9 and d["rows"]["e5m2"]["values in range"] == 5
    assert d["rows"]["e4m3"]["max"] == 448 and d["rows"]["e5m2"]["max"] == 57344
    assert d["rows"]["e4m3"]["min subnormal"] == 2.0 ** -9


def test_a_typed_value_moves_the_marked_line_in_place_and_another_format_draws_anew():
    panel = BitsPanel()
    panel.refresh()
    whole = whole_drawings(panel)
    panel.update(value=3.0)
    ax = panel._figure[1]
    assert list(ax.lines[0].get_xdata()) == [math.log2(3.0)] * 2
    assert ax.get_legend().get_texts()[0].get_text() == "3"
    assert whole == []
    panel.update(fmt="e5m2")
    assert whole == [1]
