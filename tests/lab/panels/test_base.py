"""The "sync" drawing mode (fp8lab.lab.panels.base.draw_mode): for front ends that drop or delay what
other threads send, the kernel's own thread redraws and trains. The widget tests that do not depend
on how a redraw is scheduled run again here in that mode, and the mode's own guarantees are checked:
a change is drawn before its handler returns, sliders send one value per release, a run happens in
the foreground and the kernel's interrupt stops it."""

import re
import sys
import threading

import pytest
import torch

import fp8lab.lab.panels.base as base
from fp8lab.lab.panels import PANELS, AccumulationPanel, PerTensorPanel, TrainingPanel
from tests.defaults import torch_defaults
from tests.lab import test_widgets as widgets
from tests.lab.drawings import whole_drawings


@pytest.fixture
def sync(monkeypatch):
    monkeypatch.setattr(base, "draw_mode", lambda: "sync")


# the widget tests whose outcome does not depend on how redraws are scheduled, run in sync mode
@pytest.mark.parametrize("name", list(PANELS))
def test_every_control_changes_what_the_learner_sees(sync, name):
    widgets.test_every_control_changes_what_the_learner_sees(name)


@pytest.mark.parametrize("name", list(PANELS))
def test_a_redraw_shows_what_a_whole_fresh_drawing_shows(sync, name):
    widgets.test_a_redraw_shows_what_a_whole_fresh_drawing_shows(name)


@pytest.mark.parametrize("test", [widgets.test_run_controls_are_named_over_the_plot_until_start,
                                  widgets.test_training_panel_applies_history_margin_and_the_input_drop,
                                  widgets.test_impossible_settings_are_explained_not_raised,
                                  widgets.test_bits_toggle_and_typed_value,
                                  widgets.test_a_change_after_the_redraws_end_draws_again],
                         ids=lambda t: t.__name__.removeprefix("test_"))
def test_the_widget_tests_pass_in_sync_mode(sync, test):
    test()


# what the mode itself guarantees


def test_a_change_is_drawn_before_its_handler_returns(sync):
    panel = PerTensorPanel()
    panel.refresh()
    before = threading.active_count()
    panel.controls["margin"].value = 3  # as the browser's message sets it
    assert panel.redraws == 1 and panel.drawn_values["margin"] == 3 and panel.data["margin"] == 3
    assert panel._drawer is None and threading.active_count() == before  # no drawing thread
    assert panel.wait_redrawn(1)


def test_sliders_send_their_value_on_release(sync):
    for name, make in PANELS.items():
        panel = make()
        assert all(not c.continuous_update for c in panel.controls.values() if hasattr(c, "continuous_update")), name


def test_start_trains_in_the_foreground_and_the_plot_updates_meanwhile(sync):
    panel = TrainingPanel()
    panel.update(steps=40, recipes=("fp32", "tensorwise"))
    frames = []
    panel.image.observe(lambda change: frames.append(threading.current_thread()), names="value")
    panel.start.click()  # the button's handler: in sync mode it returns when the run has ended
    assert panel.result is not None and panel.result.history["step"].max() == 39
    assert len(frames) >= 3 and all(t is threading.current_thread() for t in frames)
    assert panel.start.disabled is False


def test_the_kernels_interrupt_stops_a_run_in_sync_mode(sync, monkeypatch):
    panel = TrainingPanel()
    panel.update(steps=400, recipes=("fp32",))
    calls = []

    def interrupted(*args, **kwargs):  # the kernel's interrupt arrives as KeyboardInterrupt mid-run
        calls.append(1)
        raise KeyboardInterrupt

    import fp8lab.lab.panels.training as panel_module  # the name the panel calls

    monkeypatch.setattr(panel_module, "train", interrupted)
    panel.start.click()
    assert calls and "Stopped" in panel.text.value and panel.start.disabled is False


def test_a_failed_redraw_still_draws_a_change_that_arrived_meanwhile(monkeypatch):
    """In thread mode: a redraw that fails (not a ValueError: an unexpected error) while a new value
    arrives is followed by a redraw of that value."""
    panel = AccumulationPanel()
    panel.refresh()
    gate, started = threading.Event(), threading.Event()
    original = AccumulationPanel.compute

    def fails_first(self, **values):
        if values["bits"] == 10:
            started.set()
            assert gate.wait(30)
            raise RuntimeError("a redraw that fails")
        return original(self, **values)

    monkeypatch.setattr(AccumulationPanel, "compute", fails_first)
    hook = threading.excepthook
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the failing thread's report
    panel.controls["bits"].value = 10
    assert started.wait(30)
    panel.controls["bits"].value = 20  # arrives while the first redraw runs
    gate.set()
    assert panel.wait_redrawn(60)
    assert panel.wait_redrawn(60)  # the redraw started after the failure
    assert panel.data.get("bits") == 20 and "20-bit" in panel.text.value
    threading.excepthook = hook


def test_the_mode_is_asked_once_and_auto_means_sync_on_colab(monkeypatch):
    base.draw_mode.cache_clear()
    try:
        monkeypatch.setenv("FP8LAB_DRAW", "sync")
        assert base.draw_mode() == "sync"
        monkeypatch.setenv("FP8LAB_DRAW", "thread")
        assert base.draw_mode() == "sync"  # decided once per process
        base.draw_mode.cache_clear()
        assert base.draw_mode() == "thread"
        base.draw_mode.cache_clear()
        monkeypatch.setenv("FP8LAB_DRAW", "auto")
        monkeypatch.setitem(sys.modules, "google.colab", object())
        assert base.draw_mode() == "sync"
        base.draw_mode.cache_clear()
        monkeypatch.delitem(sys.modules, "google.colab")
        assert base.draw_mode() == "thread"
        base.draw_mode.cache_clear()
        monkeypatch.setenv("FP8LAB_DRAW", "later")
        with pytest.raises(ValueError, match="valid: auto, thread, sync"):
            base.draw_mode()
    finally:
        base.draw_mode.cache_clear()


def test_a_drag_on_a_loaded_machine_never_queues_stale_frames(monkeypatch):
    """In thread mode, with every redraw slowed (as on a busy machine) and values arriving far faster than
    redraws end: the handler never redraws; every frame sent read the controls after the values before it
    (no frame of a value already replaced when its redraw began); frames go out in the values' order, at
    most one per redraw slot; the last frame shows the last value, and the panel's text and data agree."""
    import time

    monkeypatch.setattr(base, "draw_mode", lambda: "thread")
    panel = PerTensorPanel()
    panel.refresh()
    ctl = panel.controls["outliers"]
    options = [o[1] for o in ctl.options]
    path = (options[1:] + options[::-1][1:]) * 3  # three sweeps across and back, as a brisk drag
    arrived: list[int] = []  # index into path of the newest value, when each redraw read the controls
    handler = threading.current_thread()
    in_handler = []
    original_values, original_compute = PerTensorPanel.values, PerTensorPanel.compute

    def reading(self):
        arrived.append(len(sent))
        return original_values(self)

    def loaded(self, **values):
        in_handler.append(threading.current_thread() is handler)
        time.sleep(0.03)  # a redraw slowed by the machine's other work
        return original_compute(self, **values)

    sent: list = []
    frames: list[tuple[int, object]] = []
    panel.image.observe(lambda change: frames.append((arrived[-1], panel.drawn_values["outliers"])), names="value")
    monkeypatch.setattr(PerTensorPanel, "values", reading)
    monkeypatch.setattr(PerTensorPanel, "compute", loaded)
    for value in path:
        sent.append(value)
        ctl.value = value  # as the kernel's message handler sets it
        time.sleep(0.002)
    assert panel.wait_redrawn(60)
    assert not any(in_handler), "a value was drawn in the change handler"
    reads = [read for read, _ in frames]
    assert reads == sorted(reads), "frames went out of the values' order"
    for read, shown in frames:
        assert shown == sent[read - 1], "a frame showed a value other than the newest when its redraw began"
    assert len(frames) < len(path) / 3, f"{len(frames)} frames for {len(path)} values: redraws were queued"
    # the last redraw read every value; its frame is the last one, or no frame at all where its picture is the
    # one already shown (a drag that ends where an earlier redraw drew: the image does not change)
    assert arrived[-1] == len(path), "the last redraw did not read the last value"
    assert frames[-1][1] == path[-1], "the last frame does not show the last value"
    assert panel.drawn_values["outliers"] == path[-1] and "error" not in panel.data
    monkeypatch.setattr(PerTensorPanel, "compute", original_compute)
    fresh = PerTensorPanel()
    fresh.update(outliers=path[-1])
    assert fresh.text.value == panel.text.value and fresh.image.value == panel.image.value


def test_a_drawing_that_fails_midway_leaves_nothing_for_a_drag_to_move():
    """A whole drawing that raises (a ValueError, explained in the text) after the axes were cleared: the next
    change draws whole again, never moves the artists of the drawing before, which are off the axes."""
    panel = PerTensorPanel()
    panel.refresh()
    assert panel._drawn is not None
    panel.draw_in_place = lambda data: False  # this change is drawn whole ...

    def fails(data, axes):  # ... and the drawing fails after the axes were cleared
        raise ValueError("a drawing that fails")

    panel.draw = fails
    outliers = [v for _, v in panel.controls["outliers"].options]
    panel.update(outliers=outliers[-1])
    assert "Not possible" in panel.text.value and panel._drawn is None
    del panel.draw_in_place, panel.draw
    whole = whole_drawings(panel)
    panel.update(outliers=outliers[-2])
    assert whole == [1]


def test_memo_makes_a_value_once_and_starts_again_at_its_limit():
    cache, made = {}, []

    def make(k):
        return lambda: made.append(k) or 10 * k

    assert base.memo(cache, 1, make(1), limit=2) == 10 and base.memo(cache, 1, make(1), limit=2) == 10
    assert made == [1]
    base.memo(cache, 2, make(2), limit=2)
    assert base.memo(cache, 3, make(3), limit=2) == 30
    assert made == [1, 2, 3] and cache == {3: 30}


def test_a_redraw_says_what_its_parts_cost_and_a_failed_one_says_nothing():
    """cpu_parts: the CPU seconds of compute, draw and render, which add up to at most the redraw's own; a redraw
    that ends in an explained error measures no parts (bench widgets leaves it out of its medians)."""
    panel = PerTensorPanel()
    began = base.time.thread_time()
    panel.refresh()
    whole = base.time.thread_time() - began
    parts = panel.cpu_parts
    assert set(parts) == {"compute", "draw", "render"} and all(v >= 0 for v in parts.values())
    assert parts["render"] > 0 and sum(parts.values()) <= whole
    panel.compute = lambda **values: (_ for _ in ()).throw(ValueError("no such combination"))
    panel.refresh()
    assert "Not possible" in panel.text.value and panel.cpu_parts == {}


# panels whose pictures show times measured as they draw: that they draw is what compares
MEASURED_PANELS = ("timing", "cost")


def _unmeasured(text: str) -> str:
    """A panel's text without the seconds a run took (the training panels' "seconds" row)."""
    return re.sub(r"(seconds</td><td><b>)[^<]*", r"\1", text)


@pytest.mark.parametrize("name", list(PANELS))
def test_every_panel_draws_the_labs_picture_whatever_torchs_defaults(sync, name):
    """A notebook that called torch.set_default_dtype (float64 for a reference, a half type by mistake) or
    set_default_device ("meta" to size a model) sees each panel as the lab draws it: the picture and the text of
    the float32 CPU defaults, byte for byte (the lab's models, data and tensors are named float32 CPU ones, and a
    panel computes on the CPU whatever device its thread defaults to). Both set at once, float16 on "meta": a
    tensor made in either default changes the picture or fails."""
    want = widgets._panel(name)
    with torch_defaults(torch.float16, "meta"):
        got = widgets._panel(name)
    widgets._no_error(got, got.data, name)
    if name not in MEASURED_PANELS:
        assert got.image.value == want.image.value and _unmeasured(got.text.value) == _unmeasured(want.text.value)


def test_a_panel_computes_on_the_cpu_whatever_device_its_thread_defaults_to(sync):
    """A tensor a panel's code makes without naming a device lies on the CPU in a redraw and in a run the kernel's
    thread waits for, where the notebook's thread defaults to "meta" (torch.set_default_device, per thread); outside
    them the notebook's default stands."""

    class Devices(base.Panel):
        title = "devices"

        def compute(self, **values) -> dict:
            return {"device": torch.zeros(2).device.type}

        def draw(self, data, axes) -> None:
            axes.plot([0, 1])

    panel, ran = Devices(), []
    with torch_defaults(torch.float32, "meta"):
        assert panel.refresh()["device"] == "cpu"
        panel._launch(lambda: ran.append(torch.zeros(1).device.type), blocking=True)
        assert torch.zeros(1).device.type == "meta"
    assert ran == ["cpu"]
