"""fp8lab.training.models: the sinks (where they sit, what the next layer's weights hide), the toys' determinism,
the two tasks' definitions."""

from __future__ import annotations

import pytest
import torch

from fp8lab.training.models import (
    PLACEMENTS,
    SINK_TOKENS,
    MarkovTask,
    SinkChannels,
    TeacherTask,
    make_model,
)
from tests.defaults import OTHER_DEFAULTS, torch_defaults


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_the_sinks_sit_where_the_placement_says_and_the_mask_marks_them(placement):
    count, magnitude = 4, 1e4
    sink = SinkChannels(64, count=count, magnitude=magnitude, placement=placement)
    h = torch.zeros(6, 64)  # (T, C)
    out = sink(h)
    written = out == magnitude
    assert torch.equal(written, sink.mask(h.shape))
    expected = torch.zeros(6, 64, dtype=torch.bool)  # by hand: adjacent channels 0.. in order
    if placement == "channels":
        expected[:, :count] = True
    elif placement == "tokens":
        expected[:SINK_TOKENS, :count] = True
    else:  # both: channel sinks in 0..3, token sinks in 4..7
        expected[:, :count] = True
        expected[:SINK_TOKENS, count:2 * count] = True
    assert torch.equal(written, expected)
    assert torch.equal(sink.index, torch.arange(2 * count if placement == "both" else count))
    assert torch.equal(h, torch.zeros(6, 64))  # the input is not written in place


def test_a_zero_magnitude_leaves_h_alone_and_bad_settings_are_refused():
    h = torch.randn(3, 16)
    assert SinkChannels(16, magnitude=0.0)(h) is h
    for kw in ({"placement": "rows"}, {"channel_layout": "diagonal"}, {"tokens": 0}, {"tokens": True}):
        with pytest.raises(ValueError):
            SinkChannels(16, **kw)
    with pytest.raises(ValueError, match="unknown model"):
        make_model("cnn")


def test_spread_sinks_land_in_distinct_channels_from_the_seed():
    a = SinkChannels(1024, count=4, seed=7, channel_layout="spread")
    b = SinkChannels(1024, count=4, seed=7, channel_layout="spread")
    assert torch.equal(a.index, b.index) and len(set(a.index.tolist())) == 4
    assert not torch.equal(a.index, torch.arange(4))  # drawn, not 0..3 (probability of that ~1e-12)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_fp32_never_sees_the_sinks_in_the_mlp(placement):
    """fc2's weight columns for the sink channels are zero: the model's output is the same with and without sinks."""
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(0))
    plain = make_model("mlp", seed=3, placement=placement)
    sunk = make_model("mlp", seed=3, sink_magnitude=1e5, placement=placement)
    assert torch.count_nonzero(sunk.fc2.weight[:, sunk.sink.index]) == 0
    with torch.no_grad():
        assert torch.equal(plain(x), sunk(x))


def test_the_same_seed_gives_the_same_weights_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = make_model("mlp", seed=1), make_model("mlp", seed=1), make_model("mlp", seed=2)
    assert torch.equal(torch.rand(3), expected)  # building models drew nothing from the caller's generator
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.fc1.weight, c.fc1.weight)


def test_the_mlp_gain_is_invisible_to_exact_arithmetic():
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(1))
    model = make_model("mlp", seed=0).double()
    with torch.no_grad():
        before = model(x.double())
        model.gain = 8.0
        after = model(x.double())
    torch.testing.assert_close(after, before, rtol=1e-12, atol=1e-12)


def test_the_transformer_keeps_its_down_weights_zero_for_the_sinks_and_runs():
    model = make_model("transformer", seed=0, sink_magnitude=100.0, d=32, heads=2, seq=8, vocab=16)
    for block in model.blocks:
        assert torch.count_nonzero(block.down.weight[:, block.sink.index]) == 0
    tokens = torch.randint(16, (2, 8), generator=torch.Generator().manual_seed(0))
    assert model(tokens).shape == (2, 8, 16)


def test_the_teacher_task_is_its_formula_in_float64():
    task = TeacherTask(in_dim=32, out_dim=3, hidden=8, seed=5)
    x, y = task.batch(torch.Generator().manual_seed(0), 10)
    ref = torch.tanh(x.double() @ task.w1.double().t()) @ task.w2.double().t()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(TeacherTask(in_dim=32, out_dim=3, hidden=8, seed=5).w1, task.w1)
    assert float(TeacherTask.loss(y, y)) == 0.0


def test_the_markov_task_only_takes_the_chains_edges_and_shifts_targets_by_one():
    task = MarkovTask(vocab=16, seq=12, branching=3, seed=2)
    tokens, target = task.batch(torch.Generator().manual_seed(0), 5)
    assert tokens.shape == target.shape == (5, 12)
    assert torch.equal(tokens[:, 1:], target[:, :-1])
    for prev, nxt in zip(tokens.flatten().tolist(), target.flatten().tolist(), strict=True):
        assert nxt in task.next_tokens[prev].tolist()
    torch.testing.assert_close(task.probs.sum(-1), torch.ones(16))


def test_the_toys_and_tasks_are_the_seeds_float32_cpu_tensors_whatever_torchs_defaults():
    """A notebook that called torch.set_default_dtype (float64 for a reference, a half type by mistake) or
    set_default_device ("meta") still gets the lab's models and tasks: every parameter, buffer and batch the float32
    CPU tensor the seed makes under the defaults, bit for bit (nn.Linear would follow the defaults)."""

    def made() -> list[torch.Tensor]:
        tensors = []
        for kind in ("mlp", "transformer"):
            model = make_model(kind, seed=3, sink_magnitude=50.0, placement="both", channel_layout="spread")
            tensors += [*model.parameters(), *model.buffers()]
        tensors += [*TeacherTask(seed=1).batch(torch.Generator().manual_seed(0), 4)]
        tensors += [*MarkovTask(seed=1).batch(torch.Generator().manual_seed(0), 4)]
        return [*tensors, SinkChannels(32, 2, 1.0, placement="both").mask((3, 4, 32))]

    want = made()
    for dtype, device in OTHER_DEFAULTS:
        with torch_defaults(dtype, device):
            got = made()
        assert all(a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
                   for a, b in zip(got, want, strict=True)), (dtype, device)
