"""The static book (tools/book.py; `make book` builds it at workshop size): a page per notebook with its
figures and its widgets as drawn, no error output, nothing loaded from the network.

The book is built once here at smoke size (FP8LAB_SMOKE=1): every notebook executes in its own
kernel, ~2-3 minutes on 2 cores. The widget converter is also checked on a saved state made here.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NAMES = [p.stem for p in sorted((REPO / "notebooks").glob("*.ipynb"))]
IMG = re.compile(r"<img\b[^>]*\bsrc=[\"']data:image/png;base64,([A-Za-z0-9+/=]{100,})")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(f"tools_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    report = _tool("book").build(out, smoke=True, log=lambda *_: None)
    return out, report


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_notebook_has_a_page_with_its_figures_and_no_error(book, name):
    out, report = book
    page = (out / f"{name}.html").read_text()
    assert report["errors"][name] == [], report["errors"][name]
    executed = json.loads((out / f"{name}.ipynb").read_text())
    assert not [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert "application/vnd.jupyter.stderr" not in page or "Traceback" not in page
    figures = IMG.findall(page)
    assert figures, f"{name}: no figure on its page"
    for data in figures:
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    # the widgets as drawn: static HTML, no widget view left that needs a kernel, no script from the network
    assert report["widgets"][name] >= 1 and "fp8lab-static" in page
    assert "application/vnd.jupyter.widget-view+json" not in page
    assert not re.search(r"<script[^>]+src=\"https?://", page)


@pytest.mark.slow
def test_the_panels_pictures_are_on_their_pages(book):
    """A panel's picture lives only in its ipywidgets.Image: on the page it is inside the static widget."""
    out, _ = book
    for name, title in [("02_per_tensor_scaling", "per-tensor scaling: what lands in the window"),
                        ("04_per_block_scaling", "per-block scaling: scales and error per block")]:
        page = (out / f"{name}.html").read_text()
        start = page.index(title)
        assert IMG.search(page, start), f"{name}: the panel {title!r} shows no picture"


@pytest.mark.slow
def test_the_index_links_every_page_and_the_answer_key(book):
    out, report = book
    index = (out / "index.html").read_text()
    for name in NAMES:
        assert f"href='{name}.html'" in index
    assert "href='answers.html'" in index and (out / "answers.html").stat().st_size > 1000
    assert set(report["pages"]) == set(NAMES)


def _state(models: dict) -> dict:
    return {"application/vnd.jupyter.widget-state+json": {"state": models, "version_major": 2, "version_minor": 0}}


def test_widgets_become_static_html_from_their_saved_state():
    import nbformat

    book_tool = _tool("book")
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"0" * 100).decode()
    models = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_title", "IPY_MODEL_row", "IPY_MODEL_img",
                                                                 "IPY_MODEL_layout"]}},
        "title": {"model_name": "HTMLModel", "state": {"value": "<b>the panel</b>"}},
        "row": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_pick"]}},
        "slider": {"model_name": "IntSliderModel", "state": {"_model_name": "IntSliderModel", "description": "rows",
                                                             "value": 128, "max": 512}},
        "pick": {"model_name": "DropdownModel", "state": {"description": "format", "_options_labels": ["e4m3", "e5m2"],
                                                          "index": 1}},
        "img": {"model_name": "ImageModel", "state": {"format": "png", "width": "480"},
                "buffers": [{"path": ["value"], "data": png, "encoding": "base64"}]},
        "layout": {"model_name": "LayoutModel", "state": {"width": "100%"}},
    }
    nb = nbformat.v4.new_notebook(metadata={"widgets": _state(models)})
    nb.cells.append(nbformat.v4.new_code_cell("panel", outputs=[nbformat.v4.new_output(
        "display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "box", "version_major": 2,
                                                                           "version_minor": 0},
                              "text/plain": "VBox(...)"})]))
    assert book_tool.static_widgets(nb) == 1
    html = nb.cells[0].outputs[0]["data"]["text/html"]
    assert "<b>the panel</b>" in html
    assert "<b>rows</b> 128" in html and "<b>format</b> e5m2" in html
    assert f"src='data:image/png;base64,{png}' width='480'" in html
    assert "widgets" not in nb.metadata, "the widget state is dropped: the page needs no widget manager"


@pytest.mark.slow
def test_the_training_panels_show_a_trained_state_not_empty_axes(book):
    """Notebook 06's live training and notebook 07's distributed run train once at build time: their pages
    show the final losses and a picture that is not the untrained panel's, and say that the book ran them."""
    out, report = book
    assert "TrainingPanel" in report["trained"]["06_training_live"], report["trained"]
    assert "DistributedPanel" in report["trained"]["07_beyond_one_machine"], report["trained"]
    page = (out / "06_training_live.html").read_text()
    start = page.index("live training: recipes side by side")
    end = page.index("</div>\n", page.index("The static book ran this panel once", start))
    panel = page[start:end]
    assert "final loss fp32" in panel and "Press Start to train." not in panel
    from fp8lab.lab.panels import TrainingPanel

    untrained = TrainingPanel()
    untrained.refresh()
    pictures = [base64.b64decode(d) for d in IMG.findall(panel)]
    assert pictures and untrained.image.value not in pictures, "the page shows the untrained panel's empty axes"
