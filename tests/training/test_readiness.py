"""fp8lab.inspect: what it captures, how it quantizes (exactly as FP8Linear), what it concludes, and that
it leaves the model as it was."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fp8lab
from fp8lab.numerics.metrics import overflow_fraction, sqnr, subnormal_fraction, underflow_fraction
from fp8lab.numerics.recipes import RECIPES, VARIANTS, TensorScaling, get_recipe
from fp8lab.numerics.scaling import PerBlock
from fp8lab.training import capture as captured_pass
from fp8lab.training import layers as fnn
from fp8lab.training import readiness
from fp8lab.training.models import MarkovTask, make_model

ALL_RECIPES = [*RECIPES, *VARIANTS]


class Odd(nn.Module):
    """Shapes that divide no block size, a 3-D input, a bias-free layer, a layer called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(40, 72)
        self.b = nn.Linear(72, 72, bias=False)
        self.c = nn.Linear(72, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.a(x))
        h = F.gelu(self.b(h))
        h = h + 0.5 * self.b(h)  # b again: a second call
        return self.c(h)


def _odd_batch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 11, 40, generator=g)  # batch dims flatten into M = 33
    y = torch.randn(3, 11, 24, generator=g)
    return x, y


def _transformer_case(sinks: float):
    model = make_model("transformer", 0, sink_magnitude=sinks)
    task = MarkovTask()
    x, y = task.batch(torch.Generator().manual_seed(0), 8)
    return model, x, (lambda out: task.loss(out, y))


# ---- the operands are FP8Linear's, bit for bit --------------------------------------------------------------------


def _fp8linear_operands(x, weight, grad_output, recipe):
    """Run an FP8Linear holding `weight` forward on x and backward with grad_output; return the
    operand pairs its GEMMs received, in order (fprop, dgrad, wgrad where quantized)."""
    seen = []
    original = fnn._mm

    def spy(state, a_q, b_q, *args, **kwargs):
        seen.append((a_q, b_q))
        return original(state, a_q, b_q, *args, **kwargs)

    layer = fnn.FP8Linear(weight.shape[1], weight.shape[0], bias=False, recipe=recipe, backend="emulated")
    with torch.no_grad():
        layer.weight.copy_(weight)
    xin = x.clone().requires_grad_(True)
    fnn._mm = spy
    try:
        layer(xin).backward(grad_output.reshape(*x.shape[:-1], weight.shape[0]))
    finally:
        fnn._mm = original
    return seen


def _same_bits(a, b) -> bool:
    return (a.shape == b.shape and torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
            and torch.equal(a.scale, b.scale)
            and ((a.tensor_scale is None and b.tensor_scale is None) or torch.equal(a.tensor_scale, b.tensor_scale)))


@pytest.mark.parametrize("recipe", ALL_RECIPES)
def test_operands_equal_fp8linear_bit_for_bit(recipe, monkeypatch):
    recorded = []
    original = readiness.layer_gemms

    def recording(x, w, g, r):
        pairs = original(x, w, g, r)
        recorded.append((x, w, g, r, pairs))
        return pairs

    monkeypatch.setattr(readiness, "layer_gemms", recording)
    x, y = _odd_batch()
    model = Odd()
    fp8lab.inspect(model, x, lambda out: F.mse_loss(out, y), recipes=[recipe])
    assert len(recorded) == 4  # a, b twice, c
    captured = captured_pass.capture(model, x, lambda out: F.mse_loss(out, y)).calls
    for (x2, w, g, _, _), call in zip(recorded, captured, strict=True):  # what was quantized is what was captured
        assert torch.equal(x2, call.x) and torch.equal(w, call.weight) and torch.equal(g, call.grad_output)
    for x2, w, g, r, pairs in recorded:
        theirs = _fp8linear_operands(x2, w, g, r)
        ours = [pairs["fprop"], pairs["dgrad"]] + ([pairs["wgrad"]] if pairs["wgrad"] is not None else [])
        assert len(theirs) == len(ours)
        for (a1, b1), (a2, b2) in zip(ours, theirs, strict=True):
            assert _same_bits(a1, a2) and _same_bits(b1, b2)


def test_capture_keeps_each_linears_input_weight_and_output_gradient():
    """Oracle: the same forward written out by hand, gradients from torch.autograd.grad."""
    x, y = _odd_batch()
    model = Odd()
    cap = captured_pass.capture(model, x, lambda out: F.mse_loss(out, y))
    assert [(c.layer, c.call) for c in cap.calls] == [("a", 0), ("b", 0), ("b", 1), ("c", 0)]
    ha = model.a(x)
    h1 = F.gelu(ha)
    hb0 = model.b(h1)
    h2 = F.gelu(hb0)
    hb1 = model.b(h2)
    h3 = h2 + 0.5 * hb1
    hc = model.c(h3)
    loss = F.mse_loss(hc, y)
    grads = torch.autograd.grad(loss, [ha, hb0, hb1, hc])
    inputs = [x, h1, h2, h3]
    for c, inp, g in zip(cap.calls, inputs, grads, strict=True):
        assert torch.equal(c.x, inp.detach().reshape(-1, inp.shape[-1]))
        assert torch.equal(c.grad_output, g.reshape(-1, g.shape[-1]))
        assert torch.equal(c.weight, getattr(model, c.layer).weight)
    assert cap.loss == pytest.approx(loss.item(), rel=0, abs=0)


# ---- what the rows say ------------------------------------------------------------------------------------------


def test_rows_match_the_metrics_module():
    """Each statistic against fp8lab.metrics on the same operand (the oracle), for an operand that is
    quantized directly and one quantized transposed (wgrad), and a floor-rule recipe that clips."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 96, generator=g)
    x[:, :3] *= 1e4  # three outlier channels
    x[::7, 10:20] = 0.0  # exact zeros stay zero: they are not underflow
    w = torch.randn(48, 96, generator=g) * 0.05
    dy = torch.randn(64, 48, generator=g) * 1e-3
    floor = RECIPES["mxfp8"].replace(name="mx floor", input=TensorScaling("e4m3", PerBlock(1, 32), "floor", "e8m0"))
    call = captured_pass.LinearCall("layer", 0, x, w, dy)
    rows = readiness._rows_for_call(call, [get_recipe("tensorwise"), floor], 10.0, None)
    for recipe in ("tensorwise", floor):
        pairs = fnn.layer_gemms(x, w, dy, recipe)
        name = get_recipe(recipe).name
        for gemm, index, source, transposed in (("fprop", 0, x, False), ("wgrad", 1, x, True)):
            q = pairs[gemm][index]
            src = source.t() if transposed else source
            row = next(r for r in rows if r["recipe"] == name and r["gemm"] == gemm and r["operand"] == "input")
            assert row["sqnr_db"] == pytest.approx(sqnr(src, q), abs=1e-6)
            assert row["underflow"] == pytest.approx(underflow_fraction(src, q), abs=1e-12)
            assert row["overflow"] == pytest.approx(overflow_fraction(src, q), abs=1e-12)
            assert row["subnormal"] == pytest.approx(subnormal_fraction(q), abs=1e-12)
            deq = q.dequantize()
            deq = deq.t() if transposed else deq
            assert row["sqnr_ordinary_db"] == pytest.approx(sqnr(x[:, 3:], deq[:, 3:]), abs=1e-6)
            assert row["outlier_channels"] == 3
            values = q.values()
            binades = torch.unique(torch.floor(torch.log2(values[values != 0].abs()))).numel()
            assert row["binades_used"] == binades
            assert row["amax"] == float(x.abs().max())
            assert row["span_binades"] == pytest.approx(math.log2(float(x.abs().max() / x.abs()[x != 0].min())))
    clipped = [r for r in rows if r["recipe"] == "mx floor" and r["gemm"] == "fprop" and r["operand"] == "input"]
    assert clipped[0]["overflow"] > 0  # the OCP floor rule clips block maxima: the statistic is exercised


def test_frame_names_every_linear_as_named_modules_does():
    model, x, loss = _transformer_case(0.0)
    report = fp8lab.inspect(model, x, loss, recipes=["tensorwise", "blockwise"])
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    assert report.layers == linears
    assert len(report.frame) == len(linears) * 2 * 6  # 2 recipes x (3 GEMMs x 2 operands)
    assert set(report.frame.columns) == set(readiness.COLUMNS)
    fn = report.frame
    assert set(fn[fn.layer == "blocks.0.down"]["shape"].unique()) == {"256x512", "128x512", "256x128", "512x128",
                                                                   "128x256", "512x256"}


def test_a_gemm_in_high_precision_is_a_row_that_says_so():
    x, y = _odd_batch()
    report = fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y), recipes=["rowwise_with_gw_hp"])
    wgrad = report.frame[report.frame.gemm == "wgrad"]
    assert (wgrad["format"] == "high precision").all() and (wgrad["sqnr_db"] == math.inf).all()
    assert (report.frame[report.frame.gemm != "wgrad"]["format"] == "e4m3").all()


# ---- the recommendation ---------------------------------------------------------------------------------------


def test_recommendation_changes_when_sink_channels_are_switched_on():
    clean = fp8lab.inspect(*_transformer_case(0.0))
    sinks = fp8lab.inspect(*_transformer_case(1e6))
    a = clean.recommendation().set_index("layer")["recipe"]
    b = sinks.recommendation().set_index("layer")["recipe"]
    changed = sorted(a.index[a != b])
    assert changed == ["blocks.0.down", "blocks.1.down"]  # the layers whose input holds the sinks
    assert set(a) == {"tensorwise"}  # clean: the cheapest FP8 recipe passes everywhere (NVFP4 does not)
    assert clean.skip("tensorwise") == [] and sinks.skip("tensorwise") == changed
    # the sinks' layers: per-tensor and per-row flush their ordinary channels; 1x32 blocks lose least
    worst = sinks.worst()
    assert (worst.loc[changed, ["tensorwise", "rowwise"]] < 1.0).all().all()
    assert (worst.loc[changed, "mxfp8"] > worst.loc[changed, "blockwise"]).all()
    assert sinks.recommendation(target_db=10.0).set_index("layer").loc[changed, "recipe"].tolist() == ["mxfp8"] * 2
    down = sinks.frame[(sinks.frame.layer == "blocks.0.down") & (sinks.frame.recipe == "tensorwise")
                       & (sinks.frame.gemm == "fprop") & (sinks.frame.operand == "input")].iloc[0]
    assert down.sqnr_db > 20 and down.sqnr_ordinary_db < 1 and down.underflow > 0.9  # whole-tensor SQNR hides it
    assert down.outlier_channels == 4


def test_skip_list_feeds_convert_and_export():
    model, x, loss = _transformer_case(1e6)
    report = fp8lab.inspect(model, x, loss)
    skip = report.skip("tensorwise")
    converted = report.convert(model, "tensorwise")
    kept = [n for n, m in converted.named_modules() if type(m) is nn.Linear]
    assert kept == skip
    assert report.best_recipe() == "tensorwise"  # 2 layers skipped; no recipe passes them all at 20 dB
    text = report.export("torchtitan", "tensorwise")
    assert "--float8.filter_fqns blocks.0.down,blocks.1.down" in text
    assert "blocks.0.down" in report.export("torchao", "tensorwise")
    assert report.export("torchao", "blockwise") == fp8lab.export("blockwise", "torchao").text or report.skip(
        "blockwise")
    with pytest.raises(ValueError, match="valid targets"):
        report.export("jax")
    with pytest.raises(ValueError, match="was not inspected"):
        report.skip("delayed")
    assert "blocks.0.down" in report.summary()
    ax = report.heatmap()
    assert [t.get_text() for t in ax.get_xticklabels()] == list(report.worst().columns)


# ---- models it cannot (fully) see -------------------------------------------------------------------------


def test_a_model_with_no_linears_gets_a_clear_message():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    with pytest.raises(ValueError, match=r"no linear layers.*Conv2d"):
        fp8lab.inspect(model, torch.randn(1, 3, 8, 8))


class WithAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.down(F.gelu(self.up(x)))


def test_multihead_attention_projections_are_inspected_as_convert_converts_them():
    """nn.MultiheadAttention applies its in-projection and out_proj with the raw weights: inspect measures
    them (the in-projection's GEMM and out_proj's), and convert converts exactly the same sites."""
    model = WithAttention()
    x = torch.randn(2, 16, 32)
    report = fp8lab.inspect(model, x, lambda out: out.square().mean(), recipes=["tensorwise"])
    assert report.layers == ["attn.in_proj", "attn.out_proj", "up", "down"]
    assert report.not_covered.empty and not report.notes
    assert set(report.frame.query("layer == 'attn.in_proj'")["shape"]) >= {"32x96"}  # the packed (3E, E) weight
    converted = fp8lab.nn.convert(model, "tensorwise")
    sites = [r["module"] for r in fp8lab.nn.conversion_report(converted).converted]
    assert sites == report.layers


def test_unused_linears_and_the_stand_in_loss_are_said():
    class Extra(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(8, 8)
            self.unused = nn.Linear(8, 8)

        def forward(self, x):
            return self.used(x)

    report = fp8lab.inspect(Extra(), torch.randn(4, 8), recipes=["tensorwise"])
    assert report.layers == ["used"]
    assert report.not_covered.set_index("module").loc["unused", "reason"] == "not called in this forward pass"
    assert any("stand-in loss" in n for n in report.notes)


# ---- the model is left as it was ----------------------------------------------------------------------------


class Stateful(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.drop(self.bn(self.fc1(x))))


def test_the_model_is_not_changed():
    torch.manual_seed(0)
    model = Stateful().eval()
    model.fc1.weight.requires_grad_(False)  # frozen
    model.fc2.weight.grad = torch.full_like(model.fc2.weight, 7.0)  # a gradient the user accumulated
    calls = []
    model.fc2.register_forward_hook(lambda m, a, o: calls.append(1))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = {n: (dict(m._forward_hooks), dict(m._backward_hooks), dict(m._forward_pre_hooks))
             for n, m in model.named_modules()}
    batch = torch.randn(8, 16)
    rng = torch.get_rng_state()  # dropout draws from it in train mode: inspect must give it back
    report = fp8lab.inspect(model, batch, lambda out: out.square().mean(), mode="train")
    assert report.layers == ["fc1", "fc2"]
    assert calls == [1]  # the user's hook ran, once, and is still there
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k  # parameters and BatchNorm's statistics
    assert not model.training and not model.bn.training
    assert model.fc1.weight.requires_grad is False and model.fc1.weight.grad is None
    assert torch.equal(model.fc2.weight.grad, torch.full_like(model.fc2.weight, 7.0))
    assert model.fc2.bias.grad is None
    assert {n: (dict(m._forward_hooks), dict(m._backward_hooks), dict(m._forward_pre_hooks))
            for n, m in model.named_modules()} == hooks
    assert torch.equal(torch.get_rng_state(), rng)


class Counting(nn.Module):
    """A forward that puts a new tensor in place of its buffer (self.steps = self.steps + 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        self.steps = self.steps + 1
        self.scale = self.scale * 2
        return self.fc(x) * self.scale


def test_a_buffer_the_forward_replaces_is_given_back():
    """inspect gives back the buffers it saved, so a buffer the forward re-assigns (a new tensor object)
    is restored too; copying into the saved tensors would leave it changed."""
    model = Counting()
    steps, scale = model.steps, model.scale
    fp8lab.inspect(model, torch.randn(4, 16), recipes=("tensorwise",))
    assert model.steps is steps and model.scale is scale
    assert model.steps.item() == 0 and torch.equal(model.scale, torch.ones(8))
    assert dict(model.named_buffers()).keys() == {"steps", "scale"}


def test_a_model_on_the_meta_device_gets_a_clear_error():
    """inspect on a meta-device model raises a clear error (meta tensors have no values), not an internal
    one."""
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"on the meta device.*to_empty"):
        fp8lab.inspect(model, torch.randn(4, 16))


def test_restores_the_model_when_the_loss_fails():
    model = Stateful()
    with pytest.raises(ValueError, match="scalar"):
        fp8lab.inspect(model, torch.randn(8, 16), lambda out: out)  # not a scalar
    assert all(not m._forward_hooks for m in model.modules())
    assert model.fc1.weight.requires_grad and model.training


# ---- devices, dtypes, sizes, bad input ---------------------------------------------------------------------


def test_batches_move_to_the_models_device():
    """The device path, on the CPU: every tensor of a nested batch is moved with .to(device); the meta
    device stands in for a GPU (it moves tensors without computing). The real GPU run is test_on_a_gpu."""
    batch = {"x": torch.ones(2, 3), "parts": (torch.zeros(1), [torch.ones(1)], "text"), "n": 3}
    moved = captured_pass._to_device(batch, torch.device("meta"))
    assert moved["x"].device.type == "meta" and moved["parts"][0].device.type == "meta"
    assert moved["parts"][1][0].device.type == "meta" and moved["parts"][2] == "text" and moved["n"] == 3
    assert isinstance(moved["parts"], tuple) and isinstance(moved["parts"][1], list)


def test_a_bfloat16_model_and_an_explicit_analysis_device():
    x, y = _odd_batch()
    model = Odd().to(torch.bfloat16)
    report = fp8lab.inspect(model, x.bfloat16(), lambda out: F.mse_loss(out.float(), y), recipes=["blockwise"],
                            device="cpu")
    assert report.layers == ["a", "b", "c"] and report.frame["sqnr_db"].gt(20).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_matches_the_cpu():
    x, y = _odd_batch()
    model = Odd()
    cpu = fp8lab.inspect(model, x, lambda out: F.mse_loss(out, y.to(out.device)))
    gpu_model = Odd().cuda()
    gpu_model.load_state_dict(model.state_dict())
    gpu = fp8lab.inspect(gpu_model, x, lambda out: F.mse_loss(out, y.to(out.device)))  # batch moved for us
    assert next(gpu_model.parameters()).device.type == "cuda"
    assert cpu.recommendation()["recipe"].tolist() == gpu.recommendation()["recipe"].tolist()
    assert (cpu.frame["sqnr_db"] - gpu.frame["sqnr_db"]).abs().max() < 0.5  # GEMM order differs, codes may flip


def test_a_model_with_over_a_hundred_linears():
    model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(105)])
    report = fp8lab.inspect(model, torch.randn(16, 32), recipes=["tensorwise", "mxfp8"])
    assert len(report.layers) == 105 and len(report.recommendation()) == 105
    assert report.layers[0] == "0.0" and report.layers[-1] == "104.0"


@pytest.mark.parametrize(("kw", "match"), [
    ({"recipes": ["tensorwize"]}, "valid recipes"),
    ({"recipes": []}, "recipes is empty"),
    ({"recipes": ["mxfp8", "mxfp8"]}, "each recipe once"),
    ({"mode": "training"}, "valid: train, eval"),
    ({"outlier_ratio": 1.0}, "outlier_ratio"),
])
def test_bad_arguments_name_the_valid_choices(kw, match):
    x, y = _odd_batch()
    with pytest.raises(ValueError, match=match):
        fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y), **kw)


def test_a_model_that_returns_a_dict_needs_a_loss_fn():
    class Dicty(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return {"logits": self.fc(x)}

    with pytest.raises(ValueError, match="pass loss_fn"):
        fp8lab.inspect(Dicty(), torch.randn(2, 4))
    report = fp8lab.inspect(Dicty(), {"x": torch.randn(2, 4)}, lambda out: out["logits"].sum(),
                            recipes=["tensorwise"])
    assert report.layers == ["fc"]


# ---- the model's own problems are named as the model's, not blamed on FP8 ------------------------------------------


def test_a_nan_loss_is_named_not_turned_into_keep_everything_in_high_precision():
    x, y = _odd_batch()
    with pytest.raises(ValueError, match=r"loss_fn returned nan: every gradient .* would blame FP8"):
        fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y) * math.nan, progress=False)
    with pytest.raises(ValueError, match=r"loss_fn returned inf"):
        fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y) / 0.0, progress=False)
    bad = x.clone()
    bad[0, 0, 0] = math.nan  # the forward makes the NaN: said, with where it is
    with pytest.raises(ValueError, match=r"the model's output itself holds \d+ NaN value\(s\)"):
        fp8lab.inspect(Odd(), bad, lambda out: F.mse_loss(out, y), progress=False)


def test_a_non_finite_gradient_with_a_finite_loss_names_the_layer():
    """sqrt at 0: a finite loss whose gradient is infinite. The layer and the tensor are named."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(ValueError, match=r"^2 \(call 0\): its output gradient dy holds 4 infinite value\(s\)"):
        fp8lab.inspect(model, torch.zeros(1, 8), lambda out: (out - out.detach()).sqrt().sum(),
                       progress=False)


def test_inference_mode_is_named_as_the_cause():
    """torch.enable_grad() does not leave inference mode, so inspect's backward cannot run there: the error
    says so (not that the loss does not depend on the linear layers). A batch made under inference mode and
    passed in outside it works."""
    x, y = _odd_batch()
    with torch.inference_mode(), pytest.raises(ValueError, match=r"inside torch.inference_mode\(\).*enable_grad"):
        fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y), progress=False)
    with torch.inference_mode():
        xi, yi = x.clone(), y.clone()
    report = fp8lab.inspect(Odd(), xi, lambda out: F.mse_loss(out, yi.clone()), recipes="tensorwise", progress=False)
    assert report.layers == ["a", "b", "c"]
    with torch.inference_mode():
        made = Odd()
    with pytest.raises(ValueError, match=r"made under torch.inference_mode\(\)"):
        fp8lab.inspect(made, x, lambda out: F.mse_loss(out, y), progress=False)


def test_one_recipe_by_name_or_as_a_recipe_object():
    x, y = _odd_batch()
    for one in ("blockwise", get_recipe("blockwise"), ["blockwise"]):
        report = fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y), recipes=one, progress=False)
        assert report.recipes == ("blockwise",)
        assert set(report.frame.recipe) == {"blockwise"}
    with pytest.raises(TypeError, match="recipes takes a recipe name, a Recipe, or a list of them"):
        fp8lab.inspect(Odd(), x, lambda out: F.mse_loss(out, y), recipes=3, progress=False)
