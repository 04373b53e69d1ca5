"""Training: determinism, the NaN guard, callbacks, the transformer, bad input."""

import math

import pytest
import torch

import fp8lab.training.layers
from fp8lab.training.models import MarkovTask, TeacherTask, make_model
from fp8lab.training.train import BASELINES, LESSON, train


def test_same_seed_same_history_and_runs_share_data_and_init():
    a = train(("fp32", "tensorwise"), steps=6, seed=3, progress=False).history
    b = train(("fp32", "tensorwise"), steps=6, seed=3, progress=False).history
    assert a.equals(b)
    c = train(("fp32",), steps=6, seed=4, progress=False).history
    assert not a[a.run == "fp32"]["loss"].reset_index(drop=True).equals(c["loss"])
    # every run starts from the same weights on the same batch: step-0 losses agree to FP8 error
    first = a[a.step == 0].set_index("run")["loss"]
    assert abs(first["tensorwise"] - first["fp32"]) / first["fp32"] < 0.02


def test_a_nan_stops_one_run_and_the_others_go_on(monkeypatch):
    real_mm = fp8lab.training.layers._mm

    def poisoned(state, a_q, b_q, gemm):
        out = real_mm(state, a_q, b_q, gemm)
        return out * math.nan if state.recipe.name == "mxfp8" else out

    monkeypatch.setattr(fp8lab.training.layers, "_mm", poisoned)
    res = train(("fp32", "mxfp8", "tensorwise"), steps=5, progress=False)
    assert any("mxfp8 stopped at step 0: loss is nan" in m for m in res.messages)
    h = res.history
    assert h[h.run == "mxfp8"]["loss"].isna().all() and len(h[h.run == "mxfp8"]) == 1
    assert h[h.run == "tensorwise"]["loss"].notna().all() and len(h[h.run == "tensorwise"]) == 5
    assert res.final_loss()["mxfp8"] == math.inf


def test_callback_every_n_steps_and_stop():
    seen = []

    def cb(result, step):
        seen.append((step, len(result.history)))
        return step < 5

    res = train(("fp32",), steps=20, every=3, callback=cb, progress=False)
    assert [s for s, _ in seen] == [2, 5]
    assert res.history["step"].max() == 5 and "stopped by the callback at step 5" in res.messages
    stop_after = iter([False, False, True])
    res = train(("fp32",), steps=20, should_stop=lambda: next(stop_after), progress=False)
    assert res.history["step"].max() == 2


def test_monitor_frame_has_every_run_and_layer():
    res = train(("fp32", "blockwise", "delayed"), steps=4, monitor_every=2, progress=False)
    m = res.monitor
    assert set(m["run"]) == {"blockwise", "delayed"} and set(m["step"]) == {0, 2}
    assert set(m["layer"]) == {"fc1", "fc2", "fc3"}


def test_transformer_trains_in_fp8():
    res = train(("fp32", "tensorwise", "mxfp8"), model="transformer", steps=40, batch=16, lr=3e-3,
                progress=False, monitor_every=None)
    h = res.history.pivot(index="step", columns="run", values="loss")
    start, end = h.iloc[:3].mean(), h.iloc[-5:].mean()
    assert (end < 0.8 * start).all()  # every run learns the Markov chain
    assert (abs(end - end["fp32"]) / end["fp32"] < 0.05).all()


def test_tasks_are_deterministic_and_sized():
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    x1, y1 = TeacherTask().batch(g1, 4)
    x2, y2 = TeacherTask().batch(g2, 4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and y1.shape == (4, 8)
    t, nxt = MarkovTask().batch(torch.Generator().manual_seed(0), 3)
    assert t.shape == nxt.shape == (3, 32) and torch.equal(t[:, 1:], nxt[:, :-1])


def test_sinks_leave_fp32_alone():
    # the sink channels' next-layer weights are zero: fp32 gives the same output with or without
    x = torch.randn(8, 256)
    plain = make_model("mlp", 0, sink_magnitude=0.0)
    sunk = make_model("mlp", 0, sink_magnitude=LESSON.sink_magnitude)
    torch.testing.assert_close(plain(x), sunk(x))
    plain.gain = sunk.gain = 1e-5  # and the gain is invisible to exact arithmetic
    torch.testing.assert_close(plain(x), make_model("mlp", 0)(x), rtol=1e-4, atol=1e-6)


def test_bad_input():
    with pytest.raises(ValueError, match="valid: mlp, transformer"):
        train(("fp32",), model="cnn", steps=1, progress=False)
    with pytest.raises(ValueError, match="valid recipes"):
        train(("fp16",), steps=1, progress=False)
    with pytest.raises(ValueError, match="each recipe once"):
        train(("fp32", "fp32"), steps=1, progress=False)
    with pytest.raises(ValueError, match="gain_schedule needs the mlp"):
        train(("fp32",), model="transformer", gain_schedule=lambda s: 1.0, steps=1, progress=False)
    assert BASELINES == ("fp32", "bf16")
