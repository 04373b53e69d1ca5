"""Every notebook in a real browser: it runs top to bottom, its widgets render and respond.

The lab is started by fp8lab.lab.launch (what `make lab` runs) at workshop size, its token on,
on 127.0.0.1, with every Jupyter directory isolated in a temporary directory. Debian's
chromium, driven headless by Playwright, opens each notebook in a fresh workspace, runs all
cells, checks that no cell failed and that the kernel stayed under 1.5 GB,
and what the notebook claims (tests/notebook_checks.py: the checks test_notebooks' nbclient run
makes without a browser), that every widget rendered; it moves a slider the way a person would
and waits for its plot to change, drags every live panel's slider; in 06 it presses Start and
watches the loss plot update. Screenshots and timings go to artifacts/screenshots/. `make test`
installs chromium and Playwright (`make browser-deps`); run alone with `python -m pytest -m browser`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fp8lab.lab.launcher import FIRST_NOTEBOOK, REPO
from tests.labserver import Lab, running_lab
from tests.notebook_checks import after_run_code, check_after_run

pytestmark = pytest.mark.browser

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
FIXTURE = REPO / "tests" / "fixtures" / "browser_fixture.ipynb"
SCREENSHOTS = REPO / "artifacts" / "screenshots"

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
# Hang guards, in seconds: several times what a quiet 2-core machine needs (page to idle kernel ~4 s,
# a notebook's Run All 4-40 s, a redraw ~0.1 s), so that the test passes while other processes load
# both cores and fails only on a hang. How fast is a benchmark's question: `python -m fp8lab bench notebooks`.
PAGE_TIMEOUT = 180
RUN_ALL_TIMEOUT = 600
WIDGET_TIMEOUT = 60
REDRAW_TIMEOUT = 60
LIVE_TIMEOUT = 180


@dataclass(frozen=True)
class Expect:
    """What a notebook must show in the browser, beyond running cleanly.

    widgets: at least one widget renders (every widget a cell outputs must render in any case).
    control_redraws: moving a slider (else picking another dropdown option) changes a plot
        drawn in the same cell's output.
    live_training: pressing "Start" makes a plot in that cell change at least twice while it runs.
    drags: each live panel's first slider is dragged across its range with the mouse (live_cells).
    """

    widgets: bool = True
    control_redraws: bool = True
    live_training: bool = False
    drags: bool = True


# Per-notebook expectations, keyed by file stem; a notebook not listed gets Expect().
# 06's and 07's controls set up the next run (only Start / Run train; 07's export panel is
# text): moving them need not change a plot.
EXPECT = {
    "06_training_live": Expect(control_redraws=False, live_training=True),
    "07_beyond_one_machine": Expect(control_redraws=False),
    "browser_fixture": Expect(live_training=True),
}

# Dragging a live panel's slider: its plot must change at least DRAG_MIN_FRAMES times while the mouse
# holds the slider (the drag goes on, back and forth, until it has or DRAG_GUARD_S passes), and show
# the final value after the release. The time from the release to the last frame is recorded
# (artifacts/screenshots/timings.json), not judged: a loaded machine is slower, not wrong.
DRAG_STEPS, DRAG_STEP_S, DRAG_MIN_FRAMES, DRAG_GUARD_S = 24, 0.08, 3, 60.0


def live_cells(path: Path) -> list[int]:
    """The cells of a notebook that display a live panel with a slider (fp8lab.lab.panels.LIVE_PANELS)."""
    from fp8lab.lab.panels import LIVE_PANELS, PANELS
    from fp8lab.lab.panels.base import SLIDERS

    live = {}
    for name in LIVE_PANELS:
        panel = PANELS[name]()
        if any(isinstance(c, SLIDERS) for c in panel.controls.values()):
            live[type(panel).__name__] = name
    cells = json.loads(path.read_text())["cells"]
    return [i for i, c in enumerate(cells) if c["cell_type"] == "code"
            and any(re.search(rf"\b{cls}\(", "".join(c["source"])) for cls in live)]


# The notebook's state from JupyterLab's own model (window.jupyterapp, exposed by
# --LabApp.expose_app_in_browser): each cell's node is tagged data-fp8lab-cell=<index> so that
# selectors can be scoped to one cell's output.
STATE_JS = r"""() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  if (!w || !w.content || !w.content.model || !w.sessionContext) return {ready: false};
  const pending = [], errors = [], widgetCells = [];
  Array.from(w.content.model.cells).forEach((c, i) => {
    const view = w.content.widgets[i];
    if (view) view.node.setAttribute('data-fp8lab-cell', String(i));
    if (c.type !== 'code') return;
    if (c.sharedModel.getSource().trim() && c.executionCount == null) pending.push(i);
    for (const o of c.outputs.toJSON()) {
      const text = [].concat(o.text || []).join('');
      if (o.output_type === 'error') errors.push(`cell ${i}: ${o.ename}: ${o.evalue}\n` +
                                                [].concat(o.traceback || []).join('\n'));
      else if (o.output_type === 'stream' && o.name === 'stderr' && /Traceback/.test(text))
        errors.push(`cell ${i} (stderr): ${text}`);
      else if (o.data && o.data['application/vnd.jupyter.widget-view+json'] && !widgetCells.includes(i))
        widgetCells.push(i);
    }
  });
  const texts = Array.from(document.querySelectorAll('.jp-StatusBar-TextItem')).map(e => e.textContent.trim());
  return {
    ready: true,
    panels: document.querySelectorAll('.jp-NotebookPanel').length,
    kernel: w.sessionContext.session?.kernel?.status ?? null,
    statusBar: texts.find(t => /\|\s*\w+$/.test(t) || /No Kernel/.test(t)) || null,
    busyPrompts: Array.from(w.node.querySelectorAll('.jp-InputPrompt')).filter(p => p.textContent.includes('*')).length,
    pending, errors, widgetCells,
  };
}"""

# Every error the kernel reports, wherever it lands: an exception in a widget callback outside
# `with out:`, or in a background thread, reaches no cell but does reach the kernel's IOPub.
LISTEN_JS = r"""() => {
  window.__fp8labKernelErrors = [];
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  kernel.iopubMessage.connect((_, msg) => {
    const type = msg.header.msg_type, c = msg.content;
    if (type === 'error') window.__fp8labKernelErrors.push(`${c.ename}: ${c.evalue}`);
    else if (type === 'stream' && c.name === 'stderr' && /Traceback/.test(c.text))
      window.__fp8labKernelErrors.push(c.text.slice(-3000));
  });
}"""

# Error text anywhere in the notebook's rendered outputs, including inside Output widgets
# (where an exception in a widget callback lands).
DOM_ERRORS_JS = r"""() => {
  const found = [];
  for (const el of document.querySelectorAll('.jp-NotebookPanel .jp-OutputArea-output')) {
    const text = el.innerText || '';
    if (/Traceback|Error displaying widget/.test(text)) found.push(text.slice(0, 3000));
  }
  return found;
}"""

# A plot is a PNG in an Output widget (matplotlib inline: <img src="data:...">), a PNG in an
# ipywidgets.Image (<img class="widget-image" src="blob:...">, a new blob URL on every update,
# so its pixels are hashed) or a canvas (ipympl).
PLOTS = ".widget-output img, .widget-output canvas, img.widget-image"
PLOT_HELPERS_JS = r"""selector => {
  const hashes = new Map();
  const pixels = img => {
    if (!img.complete || !img.naturalWidth) return null;
    if (!hashes.has(img.src)) {
      const c = document.createElement('canvas');
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      const g = c.getContext('2d');
      g.drawImage(img, 0, 0);
      const d = g.getImageData(0, 0, c.width, c.height).data;
      let h = 2166136261;
      for (let k = 0; k < d.length; k += 4) {
        h ^= d[k] | (d[k + 1] << 8) | (d[k + 2] << 16);
        h = Math.imul(h, 16777619);
      }
      hashes.set(img.src, `${c.width}x${c.height}:${h >>> 0}`);
    }
    return hashes.get(img.src);
  };
  const one = e => e.tagName === 'CANVAS' ? e.toDataURL() : (e.src.startsWith('data:') ? e.src : pixels(e));
  // the signature of every plot in `cell`; null while an image is still loading
  window.__fp8labPlots = cell => {
    const parts = Array.from(cell.querySelectorAll(selector)).map(one);
    return parts.includes(null) ? null : parts.join('|');
  };
  window.__fp8labPlotCount = cell => cell.querySelectorAll(selector).length;
}"""

# Record every distinct plot signature the cell shows from now on (a live plot's updates).
WATCH_JS = r"""cell => {
  window.__fp8labSeen = [];
  let last = window.__fp8labPlots(cell);
  window.__fp8labWatch = setInterval(() => {
    const s = window.__fp8labPlots(cell);
    if (s === null) return;
    if (s !== last && !window.__fp8labSeen.includes(s)) window.__fp8labSeen.push(s);
    last = s;
  }, 40);
}"""


# Every plot signature the cell shows from now on, with the time it appeared (a drag's frames).
DRAG_WATCH_JS = r"""cell => {
  window.__fp8labFrames = [];
  let last = window.__fp8labPlots(cell);
  clearInterval(window.__fp8labDragWatch);
  window.__fp8labDragWatch = setInterval(() => {
    const s = window.__fp8labPlots(cell);
    if (s === null || s === last) return;
    window.__fp8labFrames.push({t: performance.now(), s});
    last = s;
  }, 20);
}"""

# Run code in the notebook's kernel; resolve with its stdout (and any error).
KERNEL_EXEC_JS = r"""code => new Promise(resolve => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({code, silent: false, store_history: false});
  let out = '';
  future.onIOPub = msg => {
    const c = msg.content;
    if (msg.header.msg_type === 'stream') out += c.text;
    else if (msg.header.msg_type === 'error') out += `ERROR ${c.ename}: ${c.evalue}`;
  };
  future.done.then(() => resolve(out), e => resolve(`ERROR ${e}`));
})"""

# In the kernel: after the redraws end, every panel's plot shows its controls' values.
DRAWN_CHECK = """
import gc as _gc
from fp8lab.lab.panels import Panel as _Panel
def _is_panel(o):
    try:
        return isinstance(o, _Panel)
    except ReferenceError:  # a weakref.proxy whose object is gone (torch keeps some)
        return False
_stale = []
for _p in [o for o in _gc.get_objects() if _is_panel(o)]:
    if not _p.wait_redrawn(20):
        _stale.append(f"{type(_p).__name__}: still redrawing")
    elif _p.drawn_values is not None and _p.drawn_values != _p.values():
        _stale.append(f"{type(_p).__name__}: shows {_p.drawn_values}, controls {_p.values()}")
print("DRAWN", "ok" if not _stale else _stale)
"""


# ---------------------------------------------------------------- the server and the browser


SHUTDOWNS: list[threading.Thread] = []


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    home = tmp_path_factory.mktemp("jupyter")
    with running_lab(home, env={"FP8LAB_SMOKE": "0"}, extra=["--LabApp.expose_app_in_browser=True"]) as server:
        yield server
        for thread in SHUTDOWNS:  # kernels shut down in the background, before the server stops
            thread.join(30)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is not installed: run `make browser-deps` (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: run `make setup` (it is in the `test` extra)")
    home = tmp_path_factory.mktemp("chromium")
    env = {**os.environ, "XDG_CONFIG_HOME": str(home / "config"), "XDG_CACHE_HOME": str(home / "cache")}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, env=env)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def context(browser):
    """One browser context for the module: its HTTP cache makes every page after the first load
    faster. Each notebook still gets its own page and a fresh workspace."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield ctx
    finally:
        ctx.close()


TIMINGS: dict[str, dict[str, float]] = {}  # per notebook: seconds from opening to each step
DRAGS: dict[str, list[dict]] = {}  # per notebook: what each drag showed


@pytest.fixture(scope="module", autouse=True)
def write_timings():
    yield
    if TIMINGS:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        (SCREENSHOTS / "timings.json").write_text(json.dumps(TIMINGS, indent=1))
    if DRAGS:
        (SCREENSHOTS / "drags.json").write_text(json.dumps(DRAGS, indent=1))


# ---------------------------------------------------------------- waiting and checking


def wait_until(check: Callable[[], object], timeout: float, what: Callable[[], str] | str, every: float = 0.1):
    """Poll `check` until it returns something truthy; fail after `timeout` s, saying `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"after {timeout:.0f} s: {what() if callable(what) else what}")
        time.sleep(every)


class NotebookPage:
    """One notebook open in a fresh workspace of its own browser context."""

    def __init__(self, context, lab: Lab, relpath: str):
        self.lab, self.relpath, self.stem = lab, relpath, Path(relpath).stem
        self.page = context.new_page()
        self.page.set_default_timeout(PAGE_TIMEOUT * 1000)
        self.console: list[str] = []
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        self.timings: dict[str, float] = {}
        self.drag_report: list[dict] = []
        self.t0 = time.monotonic()

    def mark(self, name: str) -> None:
        self.timings[name] = round(time.monotonic() - self.t0, 2)

    def state(self) -> dict:
        return self.page.evaluate(STATE_JS)

    def context_for_failure(self) -> str:
        return (
            "\n--- browser console errors (last 10):\n"
            + "\n".join(self.console[-10:])
            + f"\n--- server log (tail):\n{self.lab.log_tail()}"
        )

    def cell(self, index: int):
        return self.page.locator(f'[data-fp8lab-cell="{index}"]')

    def button(self, index: int, label: str):
        """The buttons labelled `label` in a cell (an icon's glyph does not count, so not get_by_role)."""
        return self.cell(index).locator("button", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))

    def plots(self, index: int) -> str:
        return self.cell(index).evaluate("cell => window.__fp8labPlots(cell)")

    def plot_count(self, index: int) -> int:
        return self.cell(index).evaluate("cell => window.__fp8labPlotCount(cell)")

    def assert_redrawn_in_place(self, index: int, before: int, what: str) -> None:
        after = self.plot_count(index)
        assert after <= before, (
            f"{self.relpath}: {what} added plots to cell {index} ({before} -> {after}) instead "
            "of redrawing in place (clear the Output, or replace its outputs from a thread)"
        )

    def screenshot(self, suffix: str = "") -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{self.stem}{suffix}.png"
        self.page.screenshot(path=str(path))
        return path

    def close(self) -> None:
        self.page.close()

    # --- the steps

    def open_and_wait_for_kernel(self) -> None:
        self.page.goto(self.lab.open_url(self.relpath))
        state = wait_until(
            lambda: (s := self.state()).get("ready") and s,
            PAGE_TIMEOUT,
            f"JupyterLab did not open {self.relpath} as a notebook" + self.context_for_failure(),
        )
        assert state["panels"] == 1, f"expected exactly one notebook panel, found {state['panels']}"
        wait_until(
            lambda: (s := self.state())["kernel"] == "idle" and (s["statusBar"] or "").endswith("Idle"),
            PAGE_TIMEOUT,
            lambda: f"the kernel did not become idle: {self.state()}" + self.context_for_failure(),
        )
        self.page.evaluate(LISTEN_JS)
        self.page.evaluate(PLOT_HELPERS_JS, PLOTS)
        self.mark("kernel idle")

    def run_all(self) -> dict:
        t0 = time.monotonic()
        self.page.evaluate(
            "() => { window.__fp8labRunError = null; window.jupyterapp.commands"
            ".execute('notebook:run-all-cells').catch(e => { window.__fp8labRunError = String(e); }); }"
        )

        def finished():
            s = self.state()
            if s["errors"]:
                pytest.fail(f"{self.relpath}: a cell failed:\n" + "\n\n".join(s["errors"]))
            run_error = self.page.evaluate("() => window.__fp8labRunError")
            assert not run_error, f"notebook:run-all-cells failed: {run_error}"
            done = not s["pending"] and not s["busyPrompts"] and s["kernel"] == "idle"
            return done and (s["statusBar"] or "").endswith("Idle") and s

        state = wait_until(
            finished,
            RUN_ALL_TIMEOUT,
            lambda: f"{self.relpath}: Run All did not finish: {self.state()}" + self.context_for_failure(),
            every=0.25,
        )
        self.run_seconds = time.monotonic() - t0
        self.mark("ran all cells")
        return state

    def check_the_run(self) -> None:
        """The workshop run's checks (tests/notebook_checks.py), in the notebook's own kernel."""
        output = self.page.evaluate(KERNEL_EXEC_JS, after_run_code(self.stem))
        self.peak_mb = check_after_run(self.stem, output, self.run_seconds)
        self.mark("checked the run")

    def assert_widgets_render(self, widget_cells: list[int], expect: Expect) -> None:
        if expect.widgets:
            assert widget_cells, f"{self.relpath}: no cell displayed a widget"
        for i in widget_cells:
            out = self.cell(i).locator(".jp-Cell-outputWrapper .jupyter-widgets")
            wait_until(
                lambda out=out: out.count() > 0,
                WIDGET_TIMEOUT,
                f"{self.relpath}: cell {i} output a widget that did not render (is the widget extension "
                "installed and its version matched with ipywidgets?)" + self.context_for_failure(),
            )
        if widget_cells:
            controls = self.page.locator(".jp-NotebookPanel").locator(
                ".widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-select-multiple, .jupyter-button"
            )
            assert controls.count() > 0, f"{self.relpath}: widgets rendered but no slider, dropdown or button"
        self.mark("widgets rendered")

    def assert_no_errors(self, when: str) -> None:
        state = self.state()
        assert not state["errors"], f"{self.relpath} ({when}): error output:\n" + "\n\n".join(state["errors"])
        dom = self.page.evaluate(DOM_ERRORS_JS)
        assert not dom, f"{self.relpath} ({when}): error shown in an output:\n" + "\n\n".join(dom)
        kernel = self.page.evaluate("() => window.__fp8labKernelErrors")
        assert not kernel, (
            f"{self.relpath} ({when}): the kernel reported an error that no cell shows (a widget "
            "callback or a background thread?):\n" + "\n\n".join(kernel)
        )

    def wait_plots_settle(self, index: int, quiet: float = 0.5, timeout: float = 10, what: str = "") -> str | None:
        """Wait until the cell's plots have been loaded and unchanged for `quiet` s; return their
        signature. If they never settle: fail saying `what`, or (no `what`) return the last one."""
        last, since = self.plots(index), time.monotonic()
        deadline = since + timeout
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.plots(index)
            if now != last or now is None:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return now
        if what:
            pytest.fail(f"{self.relpath}: {what}: the plots in cell {index} kept changing for {timeout:.0f} s")
        return last

    def change_a_control_and_see_a_redraw(self, widget_cells: list[int]) -> int:
        """Move a slider like a person (click its handle, press an arrow key); where a cell with a
        plot has no slider, pick another dropdown option. Return the cell whose plot changed."""
        tried = []
        for i in widget_cells:
            cell = self.cell(i)
            if not self.plot_count(i):
                continue
            sliders = cell.locator(".widget-slider:not(.mod-disabled)")
            dropdowns = cell.locator(".widget-dropdown select:not([disabled])")
            actions = [("slider", sliders.nth(k)) for k in range(min(sliders.count(), 3))]
            actions += [("dropdown", dropdowns.nth(k)) for k in range(min(dropdowns.count(), 2))]
            for kind, control in actions:
                before = self.wait_plots_settle(i)
                count = self.plot_count(i)
                control.scroll_into_view_if_needed()
                if kind == "slider":
                    self._nudge_slider(control)
                else:
                    options = control.locator("option")
                    current = control.evaluate("s => s.selectedIndex")
                    if options.count() < 2:
                        continue
                    control.select_option(index=(current + 1) % options.count())
                t = time.monotonic()
                while time.monotonic() - t < REDRAW_TIMEOUT:
                    now = self.plots(i)
                    if now is not None and now != before:
                        self.wait_plots_settle(i)
                        self.assert_redrawn_in_place(i, count, f"moving a {kind}")
                        self.mark(f"{kind} redrew the plot")
                        return i
                    time.sleep(0.05)
                tried.append(f"cell {i} {kind}")
        pytest.fail(
            f"{self.relpath}: no slider or dropdown changed a plot in its cell's output "
            f"(tried: {', '.join(tried) or 'nothing: no cell has both a control and a plot'})"
            + self.context_for_failure()
        )

    def _nudge_slider(self, slider) -> None:
        handle = slider.locator(".noUi-handle").first
        readout = slider.locator(".widget-readout")
        value = readout.first.inner_text() if readout.count() else None
        handle.click()
        self.page.keyboard.press("ArrowRight")
        if readout.count():
            t = time.monotonic()
            while time.monotonic() - t < 1.0:
                if readout.first.inner_text() != value:
                    return
                time.sleep(0.05)
            self.page.keyboard.press("ArrowLeft")  # it was at its maximum
            self.page.keyboard.press("ArrowLeft")

    def reach(self, target, what: str) -> dict:
        """Scroll `target` into view until the mouse would hit it: its box stays put between two looks
        and the element under its centre is it (JupyterLab moves cells while the ones above settle)."""
        box = None
        def under_the_mouse() -> bool:
            nonlocal box
            target.scroll_into_view_if_needed()
            time.sleep(0.2)
            first, box = target.bounding_box(), target.bounding_box()
            time.sleep(0.2)
            if not box or box != target.bounding_box() or first != box:
                return False
            centre = [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2]
            return target.evaluate("(el, [x, y]) => el.contains(document.elementFromPoint(x, y))", centre)
        wait_until(under_the_mouse, REDRAW_TIMEOUT,
                   lambda: f"{self.relpath}: {what} is not under the mouse at its place on screen ({box})"
                   + self.context_for_failure())
        return box

    def drag_slider_and_watch(self, index: int) -> None:
        """Drag the first slider of cell `index` with the mouse from its handle to the start of its
        track, then to the end, in steps; release there. While the mouse holds the slider the plot
        must change at least DRAG_MIN_FRAMES times; after the release it must show the final value, and
        the kernel must say its plot shows the controls' values."""
        slider = self.cell(index).locator(".widget-slider:not(.mod-disabled)").first
        handle, track = slider.locator(".noUi-handle").first, slider.locator(".noUi-base, .noUi-target").first
        readout = slider.locator(".widget-readout").first
        before = self.wait_plots_settle(index)
        start = readout.inner_text() if readout.count() else None
        count = self.plot_count(index)
        hb = self.reach(handle, f"cell {index}: the slider's handle")
        tb = track.bounding_box()
        assert tb, f"{self.relpath}: cell {index}: the slider has no track on screen"
        y = hb["y"] + hb["height"] / 2
        x0, left, right = hb["x"] + hb["width"] / 2, tb["x"] + 1, tb["x"] + tb["width"] - 1
        self.cell(index).evaluate(DRAG_WATCH_JS)
        mouse = self.page.mouse
        mouse.move(x0, y)
        mouse.down()
        path = [x0 + (left - x0) * k / (DRAG_STEPS // 3) for k in range(1, DRAG_STEPS // 3 + 1)]
        path += [left + (right - left) * k / DRAG_STEPS for k in range(1, DRAG_STEPS + 1)]
        for x in path:
            mouse.move(x, y)
            time.sleep(DRAG_STEP_S)
        guard = time.monotonic() + DRAG_GUARD_S  # a loaded machine redraws less often: keep dragging
        back = path[::-1]
        while self.page.evaluate("() => window.__fp8labFrames.length") < DRAG_MIN_FRAMES and time.monotonic() < guard:
            for x in back:
                mouse.move(x, y)
                time.sleep(DRAG_STEP_S)
            back = back[::-1]
        released_at = self.page.evaluate("() => performance.now()")  # just before the release: conservative
        mouse.up()
        during = self.page.evaluate("t => window.__fp8labFrames.filter(f => f.t <= t).length", released_at)
        self.wait_plots_settle(index, quiet=1.0, timeout=REDRAW_TIMEOUT, what="after the drag")
        frames = self.page.evaluate("() => { clearInterval(window.__fp8labDragWatch); return window.__fp8labFrames; }")
        final = readout.inner_text() if readout.count() else "?"
        assert during >= DRAG_MIN_FRAMES, (
            f"{self.relpath}: cell {index}: the plot changed {during} time(s) while the slider was dragged "
            f"(up to {DRAG_GUARD_S:g} s), expected at least {DRAG_MIN_FRAMES} (continuous_update?)"
            + self.context_for_failure())
        if final != start:  # (a slider that started at its maximum ends where it started)
            assert frames and frames[-1]["s"] != before, (
                f"{self.relpath}: cell {index}: the drag moved the slider ({start} -> {final}), not the plot")
        late = frames[-1]["t"] - released_at if frames else float("nan")
        shown = self.page.evaluate(KERNEL_EXEC_JS, DRAWN_CHECK)
        assert "DRAWN ok" in shown, f"{self.relpath}: cell {index}: after the drag: {shown}"
        self.assert_redrawn_in_place(index, count, "dragging a slider")
        self.drag_report.append({"cell": index, "frames during drag": during, "final": final,
                                 "final after release ms": round(late)})
        self.mark(f"dragged cell {index}")

    def start_training_and_watch(self, widget_cells: list[int]) -> int:
        """Press Start; the plot in Start's cell must change at least twice while training runs."""
        for i in widget_cells:
            start = self.button(i, "Start")
            if start.count():
                break
        else:
            pytest.fail(f"{self.relpath}: no button named 'Start' in any widget output")
        start = start.first
        self.wait_plots_settle(i)
        self.plots_before_start = self.plot_count(i)
        self.cell(i).evaluate(WATCH_JS)
        start.scroll_into_view_if_needed()
        start.click()
        self.mark("start pressed")
        wait_until(
            lambda: self.page.evaluate("() => window.__fp8labSeen.length") >= 2,
            LIVE_TIMEOUT,
            lambda: (
                f"{self.relpath}: after Start the plot changed "
                f"{self.page.evaluate('() => window.__fp8labSeen.length')} time(s), expected at least twice "
                "while training runs" + self.context_for_failure()
            ),
        )
        self.mark("plot updated twice while training")
        return i

    def stop_training(self, index: int) -> None:
        """Press Stop if it is enabled; then the plot must stop changing."""
        stop = self.button(index, "Stop")
        if stop.count() and stop.first.is_enabled():
            stop.first.click()
        self.wait_plots_settle(index, quiet=1.0, timeout=LIVE_TIMEOUT, what="after Stop (or the end of training)")
        self.page.evaluate("() => clearInterval(window.__fp8labWatch)")
        self.assert_redrawn_in_place(index, self.plots_before_start, "training")
        self.mark("training stopped")


def check_notebook(context, lab: Lab, path: Path, expect: Expect) -> None:
    relpath = path.relative_to(REPO).as_posix()
    nb = NotebookPage(context, lab, relpath)
    try:
        nb.open_and_wait_for_kernel()
        state = nb.run_all()
        nb.assert_no_errors("after Run All")
        nb.check_the_run()
        nb.assert_widgets_render(state["widgetCells"], expect)
        shown = None
        if expect.control_redraws:
            shown = nb.change_a_control_and_see_a_redraw(state["widgetCells"])
            nb.assert_no_errors("after moving a control")
        if expect.drags:
            for index in live_cells(path):
                nb.drag_slider_and_watch(index)
                shown = index
            nb.assert_no_errors("after dragging sliders")
            if nb.drag_report:
                DRAGS[nb.stem] = nb.drag_report
        if expect.live_training:
            shown = nb.start_training_and_watch(state["widgetCells"])
            nb.stop_training(shown)
            nb.assert_no_errors("after training")
        if shown is not None:
            nb.cell(shown).locator(".jp-Cell-outputWrapper").first.scroll_into_view_if_needed()
        nb.screenshot()
        nb.mark("total")
        TIMINGS[nb.stem] = {**nb.timings, "run all s": round(nb.run_seconds, 1), "kernel peak MB": round(nb.peak_mb)}
    except BaseException:
        try:
            nb.screenshot("-FAILED")
        except Exception:
            pass
        raise
    finally:
        nb.close()
        SHUTDOWNS.append(lab.shutdown_kernels(wait=False))  # overlaps with the next notebook's start


# ---------------------------------------------------------------- the tests


def test_fixture_notebook_proves_the_browser_checks(context, lab):
    """The infrastructure on a stand-in notebook: a slider redraws a plot; Start trains live."""
    check_notebook(context, lab, FIXTURE, EXPECT["browser_fixture"])
    timings = TIMINGS["browser_fixture"]
    assert "slider redrew the plot" in timings and "plot updated twice while training" in timings


def test_make_lab_url_opens_notebook_00(browser, lab):
    """The URL `make lab` prints (token included) opens JupyterLab on notebook 00."""
    if not (REPO / FIRST_NOTEBOOK).exists():
        pytest.fail(f"{FIRST_NOTEBOOK} does not exist: `make lab` would open nothing")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(lab.url)
        tab = page.locator(".jp-NotebookPanel")
        wait_until(lambda: tab.count() == 1, PAGE_TIMEOUT, f"{lab.url} opened no notebook\n{lab.log_tail()}")
        title = page.locator(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel", has_text=re.compile(r"\.ipynb$"))
        wait_until(
            lambda: title.count() and title.first.inner_text().strip() == Path(FIRST_NOTEBOOK).name,
            PAGE_TIMEOUT,
            lambda: f"the current tab is not {Path(FIRST_NOTEBOOK).name}",
        )
    finally:
        context.close()
        lab.shutdown_kernels()


@pytest.mark.parametrize(
    "path", NOTEBOOKS or [pytest.param(None, id="no-notebooks")], ids=lambda p: p.stem if p else "none"
)
def test_notebook_in_the_browser(context, lab, path):
    if path is None:
        pytest.fail("no notebooks/*.ipynb found: the browser test has nothing to check")
    check_notebook(context, lab, path, EXPECT.get(path.stem, Expect()))
