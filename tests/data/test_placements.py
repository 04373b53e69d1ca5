"""Outliers by placement: the sinks in every token's channels (LLM.int8()'s outlier features), in a few tokens'
channels (Sun et al.'s massive activations), or both; which scales each placement breaks, in the forward GEMM
(x along K: a token's channels) and the weight-gradient GEMM (x along M: a channel's tokens)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8lab.data.synthetic import OUTLIER_TOKENS, sample
from fp8lab.numerics.metrics import channel_sqnr, flushed_fraction, quantization_report
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.scaling import PerTensor
from fp8lab.training.models import PLACEMENTS, SINK_TOKENS, SinkChannels, make_model


def _fc2_input(model, x: torch.Tensor) -> torch.Tensor:
    seen = {}
    handle = model.fc2.register_forward_pre_hook(lambda _, args: seen.setdefault("h", args[0].detach().clone()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen["h"]


# ---- where the sinks sit -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(128, 64), (4, 32, 64)])  # the MLP's (tokens, channels), a transformer's (B, T, C)
def test_token_sinks_sit_only_in_the_first_tokens_chosen_channels(shape):
    """placement "tokens": the magnitude in the first SINK_TOKENS tokens (of each sequence) x the sink channels,
    and nowhere else; every other value is the input's, unchanged. (Mutation: the sinks moved back to every token
    in the token placement fails this.)"""
    sink = SinkChannels(shape[-1], count=4, magnitude=1e5, placement="tokens")
    h = torch.randn(shape)
    out = sink(h)
    where = torch.zeros(shape, dtype=torch.bool)
    where[..., :SINK_TOKENS, :4] = True  # adjacent channels 0..3, the first 2 tokens
    assert torch.equal(sink.mask(shape), where)
    assert bool((out[where] == 1e5).all())
    assert torch.equal(out[~where], h[~where])
    assert int((out == 1e5).sum()) == int(where.sum()) == (shape[0] if len(shape) == 3 else 1) * SINK_TOKENS * 4


def test_channel_sinks_sit_in_every_token_and_both_adds_token_sinks_in_other_channels():
    h = torch.randn(16, 64)
    channels = SinkChannels(64, 4, 7.0, placement="channels")
    assert torch.equal(channels(h) == 7.0, channels.mask(h.shape))
    assert bool((channels(h)[:, :4] == 7.0).all()) and channels.token_index.numel() == 0
    both = SinkChannels(64, 4, 7.0, placement="both")
    out = both(h)
    assert bool((out[:, :4] == 7.0).all())  # channel sinks: every token
    assert bool((out[:SINK_TOKENS, 4:8] == 7.0).all()) and torch.equal(out[SINK_TOKENS:, 4:8], h[SINK_TOKENS:, 4:8])
    assert both.index.tolist() == list(range(8))  # every sink channel: the next layer's weights zero them all
    assert torch.equal(out == 7.0, both.mask(h.shape))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_fp32_never_sees_the_sinks_in_any_placement(placement):
    """The lesson MLP's fc2 holds its sink channels' weights at zero: with the sinks at 1e6 in any placement the
    fp32 model's output is the no-sink model's, bit for bit; fc2's input holds the sinks where the placement says."""
    x = torch.randn(128, 256, generator=torch.Generator().manual_seed(0))
    plain, sunk = make_model("mlp", 0, 0.0, placement=placement), make_model("mlp", 0, 1e6, placement=placement)
    with torch.no_grad():
        assert torch.equal(plain(x), sunk(x))
    h = _fc2_input(sunk, x)
    assert torch.equal(h == 1e6, sunk.sink.mask(h.shape))
    if placement == "tokens":
        assert bool((h[SINK_TOKENS:, sunk.sink.index] != 1e6).all())
        assert torch.equal(h[SINK_TOKENS:], F.gelu(sunk.fc1(x) + sunk.b1)[SINK_TOKENS:].detach())


def test_the_transformers_token_sinks_sit_at_each_sequences_first_positions():
    model = make_model("transformer", 0, 1e4, placement="tokens")
    seen = {}
    block = model.blocks[0]
    handle = block.down.register_forward_pre_hook(lambda _, args: seen.setdefault("h", args[0].detach()))
    with torch.no_grad():
        model(torch.randint(64, (3, 32), generator=torch.Generator().manual_seed(0)))
    handle.remove()
    h = seen["h"]  # (B, T, 4D)
    assert torch.equal(h == 1e4, block.sink.mask(h.shape))
    assert bool((h[:, :SINK_TOKENS, block.sink.index] == 1e4).all())
    assert not bool((h[:, SINK_TOKENS:, :] == 1e4).any())


def test_bad_placements_are_refused_naming_the_valid_ones():
    from fp8lab.training.measured import cliff_rows
    from fp8lab.training.operands import placement_flush
    from fp8lab.training.train import train

    calls = [lambda: SinkChannels(64, placement="rows"), lambda: make_model("mlp", 0, 1e3, placement="rows"),
             lambda: make_model("transformer", 0, 1e3, placement="rows"),
             lambda: train("tensorwise", steps=1, placement="rows", progress=False),
             lambda: placement_flush(placements=("rows",)), lambda: cliff_rows("rows")]
    for call in calls:
        with pytest.raises(ValueError, match="unknown placement 'rows'; valid: channels, tokens, both"):
            call()
    with pytest.raises(ValueError, match="unknown placement 'rows'; valid: channels, tokens"):
        sample("normal", (8, 16), 10.0, placement="rows")
    with pytest.raises(ValueError, match="valid: adjacent, spread"):
        SinkChannels(64, channel_layout="middle")
    for tokens in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tokens is how many tokens"):
            SinkChannels(64, placement="tokens", tokens=tokens)


# ---- the metrics: an outlier mask ----------------------------------------------------------------------------------


def test_a_mask_of_whole_columns_measures_what_the_channel_indices_measure():
    x, idx = sample("normal", (64, 256), 1e5, return_outliers=True)
    q = quantize(x, granularity=PerTensor())
    mask = torch.zeros_like(x, dtype=torch.bool)
    mask[:, idx] = True
    assert flushed_fraction(x, q, mask) == flushed_fraction(x, q, idx)
    assert channel_sqnr(x, q, mask) == pytest.approx(channel_sqnr(x, q, idx), rel=1e-12)
    a, b = quantization_report(x, q, mask), quantization_report(x, q, idx)
    assert a["ordinary_underflow"] == b["ordinary_underflow"]
    assert a["ordinary_sqnr_db"] == pytest.approx(b["ordinary_sqnr_db"], rel=1e-12)


def test_token_outliers_leave_their_channels_other_tokens_ordinary():
    x, mask = sample("normal", (64, 256), 1e5, return_outliers=True, placement="tokens")
    assert mask.dtype == torch.bool and int(mask.sum()) == OUTLIER_TOKENS * 4
    assert bool(mask[:OUTLIER_TOKENS].any(0).eq(mask.any(0)).all()) and not bool(mask[OUTLIER_TOKENS:].any())
    q = quantize(x, granularity=PerTensor())
    lost = (x != 0) & (q.dequantize() == 0) & ~mask
    assert flushed_fraction(x, q, mask) == pytest.approx(float(lost.sum()) / float((~mask).sum()))
    with pytest.raises(ValueError, match="an outlier mask has x's shape"):
        flushed_fraction(x, q, mask[:10])


# ---- which scales each placement breaks (fc2's input in the lesson MLP, 1e5 x the median) --------------------------


@pytest.fixture(scope="module")
def flushed():
    from fp8lab.training.operands import placement_flush

    return placement_flush(1e5).set_index(["placement", "gemm", "recipe"])


def test_channel_sinks_break_per_token_scales_in_fprop_and_per_channel_scales_confine_them_in_wgrad(flushed):
    """Measured (seed 0): fprop tensorwise 9.2%, rowwise 17.8%, 1x128 1.1%; wgrad tensorwise 9.2%, rowwise and
    128x1 under 0.001%. Every token holds the sinks, so each token's scale is theirs."""
    f = flushed.loc["channels"]["flushed"]
    assert f["fprop", "rowwise"] > f["fprop", "tensorwise"] > 5 * f["fprop", "blockwise"] > 0
    assert f["fprop", "rowwise"] > 0.1
    assert f["wgrad", "rowwise"] < 1e-4 and f["wgrad", "blockwise"] < 1e-4
    assert f["wgrad", "tensorwise"] == f["fprop", "tensorwise"]  # one scale: the same codes both ways


def test_token_sinks_break_only_their_own_tokens_in_fprop_and_their_own_channels_in_wgrad(flushed):
    """Measured (seed 0): fprop tensorwise 9.2%, rowwise 0.28%, 1x128 0.02%; wgrad tensorwise 9.2%, rowwise 0.07%,
    128x1 0.04%. The damage is confined, not absent: the sink tokens lose 19% of their values in rowwise's fprop,
    the sink channels 19% of theirs in its wgrad (a token outlier sets its whole channel's scale there)."""
    f, worst = flushed.loc["tokens"]["flushed"], flushed.loc["tokens"]["worst"]
    for gemm in ("fprop", "wgrad"):
        assert f[gemm, "tensorwise"] > 20 * f[gemm, "rowwise"] and f[gemm, "tensorwise"] > 20 * f[gemm, "blockwise"]
        assert f[gemm, "rowwise"] < 0.01 and f[gemm, "blockwise"] < 0.01
        assert worst[gemm, "rowwise"] > 0.1  # inside the scale the sinks set: broken
    channels = flushed.loc["channels"]
    assert channels.loc[("wgrad", "rowwise"), "worst"] < 0.02 < worst["wgrad", "rowwise"]
    # one scale per tensor does not care where the sinks sit: the amax is the same (measured 9.23% both)
    assert f["fprop", "tensorwise"] == pytest.approx(channels.loc[("fprop", "tensorwise"), "flushed"], abs=0.005)


def test_both_placements_break_what_each_breaks(flushed):
    f, worst = flushed.loc["both"]["flushed"], flushed.loc["both"]["worst"]
    channels, tokens = flushed.loc["channels"], flushed.loc["tokens"]
    assert f["fprop", "rowwise"] == pytest.approx(channels.loc[("fprop", "rowwise"), "flushed"], rel=0.05)
    assert worst["wgrad", "rowwise"] == pytest.approx(tokens.loc[("wgrad", "rowwise"), "worst"], rel=0.2)
    assert f["fprop", "blockwise"] < 0.02 and f["wgrad", "blockwise"] < 0.01


def test_the_placement_panel_reports_placement_flush():
    from fp8lab.lab.panels import PlacementPanel
    from fp8lab.training.operands import placement_flush

    panel = PlacementPanel()
    data = panel.update(placement="tokens", ratio=1e5)
    want = placement_flush(1e5, ("tokens",))
    assert data["df"][["recipe", "gemm", "flushed", "worst"]].equals(want[["recipe", "gemm", "flushed", "worst"]])
    row = want[(want.recipe == "rowwise") & (want.gemm == "fprop")].iloc[0]
    assert f"{100 * row.flushed:.3g}% flushed" in panel.text.value
    assert "first 2 tokens" in panel.text.value


# ---- notebook 02's synthetic tensor: the same geometry -------------------------------------------------------------


def test_the_outlier_cliff_per_placement_and_gemm():
    """Notebook 02's cliff at outliers 1e5: channel outliers flush a share of every token with per-row scales in
    fprop and nothing in wgrad (per channel there); token outliers flush little with per-row scales in either."""
    from fp8lab.lab.panels import CliffPanel

    panel = CliffPanel()
    at = {}
    for placement in ("channels", "tokens"):
        for gemm in ("fprop", "wgrad"):
            t = panel.table("normal", placement, gemm)
            at[placement, gemm] = t[t.outliers == 1e5].set_index("recipe")["ordinary_underflow"]
    assert at["channels", "fprop"]["rowwise"] > 0.1 and at["channels", "wgrad"]["rowwise"] == 0
    assert at["tokens", "fprop"]["rowwise"] < 0.05 < at["tokens", "fprop"]["tensorwise"]
    assert at["tokens", "wgrad"]["rowwise"] < 0.05 < at["tokens", "wgrad"]["tensorwise"]
    data = panel.update(placement="tokens")
    assert set(data["markers"]) == {"massive activations: e.g. 100,000x"}
    data = panel.update(placement="channels")
    assert set(data["markers"]) == {"LLM.int8(): up to 20x", "SmoothQuant: ~100x"}


def test_both_kinds_of_outliers_sit_in_different_channels_and_keep_the_others_draws():
    """placement "both": the channel outliers of placement "channels" (the same channels, every token) and token
    outliers in as many other channels of the first OUTLIER_TOKENS tokens; every other value as drawn."""
    x0 = sample("normal", (64, 256), 0.0, placement="both")
    x, mask = sample("normal", (64, 256), 1e5, return_outliers=True, placement="both")
    _, channels = sample("normal", (64, 256), 1e5, return_outliers=True, placement="channels")
    every = mask.all(0)  # the channel outliers' columns
    assert every.nonzero().flatten().tolist() == channels.tolist()
    tokens_only = mask.any(0) & ~every
    assert int(tokens_only.sum()) == 4 and bool(mask[:OUTLIER_TOKENS, tokens_only].all())
    assert not bool(mask[OUTLIER_TOKENS:, tokens_only].any())
    assert torch.equal(x[~mask], x0[~mask]) and torch.equal(x[mask], x0[mask] * 1e5)


def test_the_outlier_cliff_with_both_kinds_breaks_what_each_breaks_and_marks_every_source():
    """With both kinds at 1e5, per-row scales flush as with channel outliers in fprop (a token's channels hold
    one) and flush a token outlier's channel in wgrad, where channel outliers alone flush nothing; every published
    ratio is marked (each kind is there)."""
    from fp8lab.lab.panels import CliffPanel
    from fp8lab.training.published import PUBLISHED

    panel = CliffPanel()
    at = {}
    for placement in ("channels", "tokens", "both"):
        for gemm in ("fprop", "wgrad"):
            t = panel.table("normal", placement, gemm)
            at[placement, gemm] = t[t.outliers == 1e5].set_index("recipe")["ordinary_underflow"]
    assert at["both", "fprop"]["rowwise"] > 0.1
    assert at["both", "wgrad"]["rowwise"] > at["channels", "wgrad"]["rowwise"] == 0
    assert at["both", "fprop"]["blockwise"] < 0.1 and at["both", "wgrad"]["blockwise"] < 0.1
    data = panel.update(placement="both")
    assert set(data["markers"]) == {p.label for p in PUBLISHED}


def test_the_training_cliff_ships_every_placement_and_both_breaks_rowwise_as_channel_sinks_do():
    """The training cliff offers every placement with shipped runs; with both kinds of sinks rowwise loses at 1e6
    what it loses with channel sinks (over 100%), far more than with token sinks alone, and blockwise holds."""
    from fp8lab.lab.panels import TrainingCliffPanel
    from fp8lab.training.measured import BOTH_ON, TOKEN_RUNS, TOKEN_SEEDS, cliff_rows

    panel = TrainingCliffPanel()
    assert [v for _, v in panel.controls["placement"].options] == list(PLACEMENTS)
    both = cliff_rows("both")
    assert BOTH_ON and set(both.run) == set(TOKEN_RUNS) and set(both.seed) == set(range(TOKEN_SEEDS))
    change = {}
    for placement in PLACEMENTS:
        mean = cliff_rows(placement).groupby(["run", "sinks"]).loss.mean()
        change[placement] = {r: mean[r, 1e6] / mean[r, 0.0] - 1 for r in ("rowwise", "blockwise")}
    assert change["both"]["rowwise"] > 1 and change["channels"]["rowwise"] > 1
    assert change["both"]["rowwise"] > 5 * change["tokens"]["rowwise"]
    assert abs(change["both"]["blockwise"]) < 0.05
    data = panel.update(placement="both")
    assert data["seeds"] == TOKEN_SEEDS and "error" not in panel.data
