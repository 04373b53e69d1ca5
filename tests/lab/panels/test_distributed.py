"""fp8lab.lab.panels.distributed: the export panel's text is fp8lab.export's (the distributed runs are tested with
fp8lab.training.distributed)."""

from __future__ import annotations

import html

from fp8lab.lab.panels.distributed import ExportPanel
from fp8lab.training.export import export


def test_the_export_panel_shows_the_recipe_written_for_its_target():
    panel = ExportPanel()
    d = panel.compute(recipe="mxfp8", target="torchao")
    e = export("mxfp8", "torchao")
    assert (d["recipe"], d["target"], d["text"], d["available"]) == (e.recipe, e.target, e.text, e.available)
    shown = panel.describe(d)
    assert html.escape(e.text) in shown and html.escape(e.source) in shown  # escaped, never injected


def test_another_choice_rewrites_the_line_drawn():
    panel = ExportPanel()
    panel.update(recipe="tensorwise")
    ax = panel._figure[1]
    line = ax.texts[0]
    panel.update(recipe="mxfp8", target="torchtitan")
    assert list(ax.texts) == [line] and line.get_text().startswith("mxfp8 -> torchtitan: ")
