"""The static book: every notebook executed and rendered as HTML, widgets as they were drawn.

    python tools/book.py [--out build/book] [--smoke] [--only 00 05]    (`make book`: workshop size)

Each notebook runs top to bottom with nbclient (a fresh kernel, FP8LAB_SMOKE=0 unless --smoke, panels
drawing in the cell that changes them: FP8LAB_DRAW=sync), with the widgets' state kept (nbclient's
store_widget_state). Panels that train on a button (notebook 06's live training, notebook 07's
distributed run) then run once with the controls they show (TRAIN_AT_BUILD, a cell added after the
notebook's own and taken out again), so that the page shows a trained state, not empty axes; the
page says so beside them. A kernel-less page cannot run the widgets'
JavaScript, so each widget output is replaced by static HTML made from that state: the panel's last
PNG (an ipywidgets.Image: its bytes are in the state), its text, the controls with their values,
progress bars and Output widgets' contents. nbconvert's HTMLExporter (lab template) then writes one
page per notebook, images inline as data URIs, plus index.html and answers.html (notebooks/ANSWERS.md).
Why nbconvert and not Jupyter Book: it is already installed with JupyterLab, builds offline from
PyPI packages alone (Jupyter Book 2 needs Node.js and fetches its theme at build time), and the
widget state is turned into HTML here either way. docs/install.md says how to use it.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
BOXES = {"VBoxModel", "BoxModel", "GridBoxModel", "AccordionModel", "TabModel", "StackModel"}
STYLE = """<style>
.fp8lab-static { border-left: 3px solid #0072b2; padding: 4px 0 4px 10px; margin: 4px 0; }
.fp8lab-static .row { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center; }
.fp8lab-static .control { font-size: 12px; color: #333; }
.fp8lab-static .control b { font-weight: 600; }
.fp8lab-static .button { font-size: 12px; border: 1px solid #bbb; border-radius: 3px; padding: 1px 8px; color: #555; }
.fp8lab-static img { max-width: 100%; }
.fp8lab-static pre { font-size: 11px; max-height: 12em; overflow: auto; }
.fp8lab-static .note { font-size: 11px; color: #777; }
</style>"""


# ---- widgets -> static HTML ---------------------------------------------------------------------------------


def _ref(value: str) -> str:
    return value.removeprefix("IPY_MODEL_")


def _control(state: dict) -> str | None:
    """A control's description and current value ("block rows 128"), or None for what is not a control."""
    desc = state.get("description", "")
    if "_options_labels" in state:  # Dropdown, ToggleButtons, RadioButtons, SelectionSlider, Select(Multiple)
        labels, index = state["_options_labels"], state.get("index")
        chosen = [labels[i] for i in (index if isinstance(index, list) else [index]) if i is not None]
        value = ", ".join(chosen) or "-"
    elif "value" in state and isinstance(state["value"], bool | int | float | list) and "max" not in state.get(
            "_model_name", "Progress"):
        value = state["value"]
        if isinstance(value, list):  # a range slider
            value = " to ".join(str(v) for v in value)
    else:
        return None
    return f"<span class='control'><b>{html.escape(str(desc))}</b> {html.escape(str(value))}</span>"


def widget_html(models: dict, model_id: str) -> str:
    """Static HTML for widget `model_id` and its children, from the saved widget state `models`."""
    model = models.get(model_id)
    if model is None:
        return ""
    name, state = model.get("model_name", ""), model.get("state", {})
    buffers = {tuple(b["path"]): b["data"] for b in model.get("buffers", [])}
    if name in BOXES or name == "HBoxModel":
        parts = [widget_html(models, _ref(c)) for c in state.get("children", [])]
        parts = [p for p in parts if p]
        if name == "HBoxModel":
            return "<div class='row'>" + "".join(parts) + "</div>"
        return "<div>" + "".join(parts) + "</div>"
    if name == "ImageModel":
        data = buffers.get(("value",))
        if not data:
            return ""
        width = f" width='{html.escape(str(state['width']))}'" if state.get("width") else ""
        return f"<img src='data:image/{state.get('format', 'png')};base64,{data}'{width}>"
    if name in ("HTMLModel", "HTMLMathModel"):
        desc = state.get("description", "")
        return (f"<span class='control'><b>{html.escape(desc)}</b></span> " if desc else "") + state.get("value", "")
    if name == "LabelModel":
        return f"<span class='control'>{html.escape(state.get('value', ''))}</span>"
    if name == "ButtonModel":
        return f"<span class='button'>{html.escape(state.get('description', ''))}</span>"
    if name in ("IntProgressModel", "FloatProgressModel"):
        return f"<progress value='{state.get('value', 0)}' max='{state.get('max', 100)}'></progress>"
    if name in ("TextareaModel", "TextModel"):
        value = state.get("value", "")
        return f"<pre>{html.escape(value)}</pre>" if value else ""
    if name == "OutputModel":
        return "".join(output_html(models, o) for o in state.get("outputs", []))
    return _control(state) or ""


def output_html(models: dict, output: dict) -> str:
    """One nbformat output as static HTML (used inside Output widgets)."""
    kind = output.get("output_type")
    if kind == "stream":
        return f"<pre>{html.escape(''.join(output.get('text', '')))}</pre>"
    if kind == "error":
        return f"<pre>{html.escape(output.get('ename', ''))}: {html.escape(output.get('evalue', ''))}</pre>"
    data = output.get("data", {})
    if WIDGET_VIEW in data:
        return widget_html(models, data[WIDGET_VIEW]["model_id"])
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            return f"<img src='data:{mime};base64,{''.join(data[mime]).strip()}'>"
    if "text/html" in data:
        return "".join(data["text/html"])
    if "text/plain" in data:
        return f"<pre>{html.escape(''.join(data['text/plain']))}</pre>"
    return ""


def static_widgets(nb) -> int:
    """Replace each widget output of `nb` by static HTML from its saved state; drop the state. Returns how
    many widget outputs were replaced."""
    models = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    replaced = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW not in data:
                continue
            body = widget_html(models, data[WIDGET_VIEW]["model_id"])
            if not body:
                body = "<span class='note'>(an interactive widget: run the notebook to use it)</span>"
            output["data"] = {"text/html": f"<div class='fp8lab-static'>{body}</div>",
                              "text/plain": data.get("text/plain", "")}
            replaced += 1
    nb.metadata.pop("widgets", None)
    return replaced


# ---- execute and render --------------------------------------------------------------------------------------

# run after a notebook's own cells, in its kernel: every panel that trains on a button and has not trained yet
# trains once, with the controls it shows (the widget state saved afterwards holds the trained picture)
TRAIN_AT_BUILD = """\
import gc as _gc
from fp8lab.lab.panels import DistributedPanel as _Distributed, TrainingPanel as _Training
for _panel in [o for o in _gc.get_objects() if type(o) in (_Training, _Distributed)]:  # (not proxies)
    if getattr(_panel, "result", None) is None:
        _panel.run(blocking=True)
        _panel.text.value += ("<p><i>The static book ran this panel once when it was built, with the controls "
                              "shown: open the notebook in JupyterLab to train with your own.</i></p>")
        print("TRAINED", type(_panel).__name__, _panel.result is not None)
"""


def execute(path: Path, smoke: bool, timeout: int = 900):
    """`path` run top to bottom in a fresh kernel (cwd: its folder), widget state kept; errors stay in the
    outputs (allow_errors) so that a page shows them and the caller can count them."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # the kernel inherits these: the size, and panels that redraw in the cell that changed them (FP8LAB_DRAW=sync),
    # so that each widget's saved state is its drawing at the end of the cell
    settings = {"FP8LAB_SMOKE": "1" if smoke else "0", "FP8LAB_DRAW": os.environ.get("FP8LAB_DRAW", "sync")}
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        nb.cells.append(nbformat.v4.new_code_cell(TRAIN_AT_BUILD))
        NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True, store_widget_state=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        trained = nb.cells.pop()
        nb.metadata["fp8lab_trained_at_build"] = [line.split()[1] for line in "".join(
            o.get("text", "") for o in trained.outputs if o.get("output_type") == "stream").splitlines()
            if line.startswith("TRAINED ") and line.endswith("True")]
        nb.metadata["fp8lab_build_errors"] = [f"{o.get('ename')}: {o.get('evalue')}" for o in trained.outputs
                                              if o.get("output_type") == "error"]
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return nb


def errors(nb) -> list[str]:
    return [f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells for o in c.get("outputs", [])
            if o.get("output_type") == "error"] + list(nb.metadata.get("fp8lab_build_errors", []))


def title(nb, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (m := re.search(r"^#\s+(.+)$", cell.source, re.M)):
            return m[1].strip()
    return fallback


def render(nb, page_title: str) -> str:
    """The notebook as one HTML page (nbconvert, lab template), links between notebooks to their pages."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": page_title}})
    body = re.sub(r'href="(\d\d_[A-Za-z0-9_]+)\.ipynb', r'href="\1.html', body)
    # require.js and MathJax from a CDN: the static widgets need no JavaScript and the notebooks no TeX,
    # so a page loads nothing from the network
    body = re.sub(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>', "", body)
    return body.replace("</head>", STYLE + "\n</head>", 1)


def _page(head: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(head)}</title>"
            "<style>body{font-family:system-ui,sans-serif;max-width:52em;margin:2em auto;padding:0 1em;"
            "line-height:1.5}</style></head><body>" + body + "</body></html>\n")


def build(out: Path, smoke: bool = False, only: list[str] | None = None, log=print) -> dict:
    """Execute and render the notebooks into `out`; returns {"pages": {stem: path}, "errors": {stem: [...]},
    "seconds": {stem: s}, "widgets": {stem: n}, "trained": {stem: [panel class names trained at build]}}."""
    import nbformat
    from nbconvert.filters import markdown2html

    out.mkdir(parents=True, exist_ok=True)
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(o) for o in only)]
        if not paths:
            raise ValueError(f"--only {' '.join(only)} matches no notebook; valid: "
                             f"{', '.join(p.stem[:2] for p in sorted(NOTEBOOKS.glob('*.ipynb')))}")
    report = {"pages": {}, "errors": {}, "seconds": {}, "widgets": {}, "titles": {}, "trained": {}}
    for path in paths:
        t0 = time.perf_counter()
        nb = execute(path, smoke)
        report["errors"][path.stem] = errors(nb)
        report["trained"][path.stem] = nb.metadata.pop("fp8lab_trained_at_build", [])
        nb.metadata.pop("fp8lab_build_errors", None)
        report["widgets"][path.stem] = static_widgets(nb)
        report["titles"][path.stem] = title(nb, path.stem)
        page = out / f"{path.stem}.html"
        page.write_text(render(nb, report["titles"][path.stem]))
        nbformat.write(nb, out / path.name)  # the executed notebook too, widgets as static HTML
        report["pages"][path.stem] = page
        report["seconds"][path.stem] = time.perf_counter() - t0
        log(f"{path.stem}: {report['seconds'][path.stem]:.0f} s, {report['widgets'][path.stem]} widgets drawn, "
            f"{len(report['errors'][path.stem])} errors")
    answers = NOTEBOOKS / "ANSWERS.md"
    (out / "answers.html").write_text(_page("fp8lab: answer key", markdown2html(answers.read_text())))
    size = "smoke size (FP8LAB_SMOKE=1)" if smoke else "workshop size"
    items = "".join(f"<li><a href='{p.name}'>{html.escape(report['titles'][s])}</a></li>"
                    for s, p in report["pages"].items())
    (out / "index.html").write_text(_page("fp8lab: the lab without a kernel", (
        "<h1>fp8lab: the lab without a kernel</h1>"
        f"<p>Every notebook executed top to bottom at {size}; each widget is shown as it was drawn at the end of "
        "its cell (its picture, text and control values). To move the sliders, open the notebooks in "
        "JupyterLab (<code>fp8lab lab</code>).</p>"
        f"<ol start='0'>{items}</ol><p><a href='answers.html'>The answer key</a></p>")))
    (out / "book.json").write_text(json.dumps({k: {s: (str(v) if isinstance(v, Path) else v) for s, v in d.items()}
                                               for k, d in report.items()}, indent=1))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Execute every notebook and render the static book (HTML).")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="where the pages go")
    parser.add_argument("--smoke", action="store_true", help="small sizes (FP8LAB_SMOKE=1), for tests")
    parser.add_argument("--only", nargs="+", metavar="NN", help="only these notebooks (by number: 00 05)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        report = build(args.out, args.smoke, args.only)
    except ValueError as err:
        parser.error(str(err))
    failed = {s: e for s, e in report["errors"].items() if e}
    print(f"book: {len(report['pages'])} pages in {args.out} ({time.perf_counter() - t0:.0f} s); "
          f"open {args.out / 'index.html'}")
    if failed:
        print(f"book: errors in {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
