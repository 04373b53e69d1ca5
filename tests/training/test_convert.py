"""A learner's own model, converted truthfully: every linear GEMM of a torch model runs FP8 or is named with
its reason, and what users do around a model (evaluation, checkpointing, hooks, parametrizations, lazy
layers, gradient penalties, autocast, torch.func, saving) keeps its meaning. Each test names the hazard:
a result that is silently high precision, or silently wrong."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fp8lab
from fp8lab.nn import ConversionWarning, FP8Linear, conversion_report, convert, fp8_layers, unwrap


def _encoder(layers: int = 2, batch_first: bool = True) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def _linear_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


# ---- a bare layer, subclasses, parametrizations, lazy layers ---------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True])
def test_a_bare_linear_layer_is_converted(inplace):
    """convert(nn.Linear(...)) returns an FP8 layer (not the Linear with an FP8 child named '' that never runs)."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 16)
    keys = list(lin.state_dict())
    x = torch.randn(8, 32)
    plain = lin(x)
    out = convert(lin, "nvfp4", inplace=inplace)
    assert isinstance(out, FP8Linear) and (out is lin) == inplace
    assert list(out.state_dict()) == keys and [n for n, _ in fp8_layers(out)] == [""]
    assert not torch.equal(out(x), plain)
    back = unwrap(out)
    assert type(back) is nn.Linear and torch.equal(back(x), plain)
    assert type(unwrap(FP8Linear(4, 4))) is nn.Linear


def test_out_proj_a_parametrized_and_a_lazy_linear_are_converted():
    """nn.Linear subclasses that add no forward (attention's NonDynamicallyQuantizableLinear), a
    parametrized weight (weight_norm) and a LazyLinear converted before its first forward all run FP8."""
    torch.manual_seed(1)
    norm = nn.utils.parametrizations.weight_norm(nn.Linear(16, 8))
    model = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), norm)
    x = torch.randn(4, 10)
    converted = convert(model, "tensorwise")
    assert not any(issubclass(w.category, ConversionWarning) for w in _warnings(lambda: convert(model, "tensorwise")))
    y = converted(x)  # the lazy layer materializes, in FP8
    assert type(converted[0]) is FP8Linear and converted[0].calls == 1
    assert isinstance(converted[2], FP8Linear) and converted[2].calls == 1
    # the parametrized layer quantizes its parametrized weight: an FP8Linear holding that weight agrees
    ref = FP8Linear(16, 8, recipe="tensorwise")
    with torch.no_grad():
        ref.weight.copy_(converted[2].weight)
        ref.bias.copy_(converted[2].bias)
    h = converted[1](converted[0](x))
    assert torch.equal(converted[2](h), ref(h))
    y.square().sum().backward()  # gradients reach the parametrization's own parameters
    grad = converted[2].parametrizations.weight.original0.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # quantizing nothing, the converted model is the original, bit for bit
    model(x)
    identity = convert(model, "identity")
    assert torch.equal(identity(x), model(x))
    assert "2.parametrizations.weight.original0" in identity.state_dict()


def test_a_linear_subclass_with_its_own_forward_is_named_and_strict_raises():
    """A subclass whose forward differs is left in high precision, said in a ConversionWarning and in the
    report; strict=True raises instead of leaving it."""

    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), Scaled(8, 4))
    with pytest.warns(ConversionWarning, match=r"2 \(Scaled\): a subclass of nn.Linear with a forward of its own"):
        converted = convert(model, "tensorwise")
    report = conversion_report(converted)
    assert [r["module"] for r in report.converted] == ["0"] and [r["module"] for r in report.left] == ["2"]
    assert report.frame().set_index("module").loc["2", "status"] == "left"
    with pytest.raises(ValueError, match=r"strict=True.*2 \(Scaled\)"):
        convert(model, "tensorwise", strict=True)


def test_a_share_that_keeps_every_layer_is_said_and_the_report_names_it():
    """nvfp4_training keeps the last 15% of the linear layers, rounded up: a model of one linear layer is kept
    whole, which convert says in a ConversionWarning (strict raises); with two, the report says 1 of 2."""
    with pytest.warns(ConversionWarning, match=r"nvfp4_training keeps the last 15%.*1 linear GEMM site\(s\), so none "
                                                r"is converted.*with_high_precision_layers\(0\)"):
        kept = convert(nn.Linear(64, 64), "nvfp4_training")
    assert type(kept) is nn.Linear
    with pytest.raises(ValueError, match=r"strict=True.*none is converted"):
        convert(nn.Linear(64, 64), "nvfp4_training", strict=True)
    whole = convert(nn.Linear(64, 64), fp8lab.get_recipe("nvfp4_training").with_high_precision_layers(0))
    assert isinstance(whole, FP8Linear)
    two = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    assert not any(issubclass(w.category, ConversionWarning) for w in _warnings(lambda: convert(two, "nvfp4_training")))
    report = conversion_report(convert(two, "nvfp4_training"))
    assert "kept: 2: nvfp4_training keeps its last 15% of linear layers in high precision, rounded up (1 of 2 here)" \
        in str(report)


def test_the_printed_report_names_the_modules_whose_matmuls_stay_in_high_precision():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(4, 4, 3)
            self.pair = nn.Bilinear(4, 4, 4)
            self.rnn = nn.GRU(4, 4)
            self.fc = nn.Linear(4, 4)

    text = str(conversion_report(convert(Mixed(), "tensorwise")))
    assert "1 site(s) in FP8" in text and "3 module(s) with other matmuls, in high precision" in text
    for name, kind in (("conv", "Conv1d"), ("pair", "Bilinear"), ("rnn", "GRU")):
        assert f"  not linear: {name} ({kind}): its matmuls are not nn.Linear GEMMs: they stay in high precision" \
            in text


def _warnings(fn) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return caught


# ---- torch's transformer: every linear, training and evaluation ------------------------------------------------


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "delayed"])
def test_torchs_encoder_evaluates_in_fp8(recipe):
    """torch's fused evaluation path (eval mode under no_grad) reads the weights directly: converted, an
    evaluation equals the grad-enabled forward bit for bit (dropout 0) and differs from fp32 as it does."""
    enc = _encoder()
    converted = convert(enc, recipe)
    x = torch.randn(2, 6, 32)
    converted.eval()
    enc.eval()
    with torch.no_grad():
        evaluated, fp32 = converted(x), enc(x)
    trained = converted(x)
    assert torch.equal(evaluated, trained)
    assert (evaluated - fp32).abs().max() > 1e-3
    with torch.no_grad():  # the fused path does run for the original: the switch is what differs
        assert (enc(x) - unwrap(converted)(x)).abs().max() == 0


def test_every_linear_of_nn_transformer_converts_and_inspect_names_the_same_sites():
    """nn.Transformer: every nn.Linear (out_proj included) and every attention in-projection is FP8, and
    inspect measures exactly the sites convert converted."""
    torch.manual_seed(2)
    model = nn.Transformer(32, 4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=64, dropout=0.0,
                           batch_first=True)
    src, tgt = torch.randn(2, 5, 32), torch.randn(2, 4, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)
        converted = convert(model, "tensorwise")
    report = conversion_report(converted)
    sites = [r["module"] for r in report.converted]
    attentions = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    assert set(sites) == set(_linear_modules(model)) | {f"{a}.in_proj" for a in attentions}
    assert not report.left
    converted(src, tgt).square().mean().backward()
    assert all(m.calls > 0 for _, m in fp8_layers(converted))
    assert all(m.fp8_in_proj.calls > 0 for m in converted.modules() if isinstance(m, fp8lab.nn.FP8MultiheadAttention))
    inspected = fp8lab.inspect(model, (src, tgt), lambda out: out.square().mean(), recipes=["tensorwise"])
    assert sorted(inspected.layers) == sorted(sites)


def test_attention_forward_equals_torchs_slow_path_bit_for_bit():
    """The attention that routes the projections computes what torch's MultiheadAttention computes (its
    slow path), bit for bit, over its options: masks, need_weights, unbatched, cross-attention, kdim."""
    from fp8lab.training.attention import attention_forward

    torch.manual_seed(3)
    cases = [
        (dict(batch_first=True), dict(), "self"),
        (dict(batch_first=False), dict(need_weights=False), "self"),
        (dict(batch_first=True, add_bias_kv=True, add_zero_attn=True), dict(average_attn_weights=False), "self"),
        (dict(batch_first=True), dict(need_weights=False, is_causal=True, causal=True), "self"),
        (dict(batch_first=True), dict(padding=True), "cross"),
        (dict(batch_first=True, kdim=24, vdim=20), dict(), "separate"),
        (dict(batch_first=True, bias=False), dict(need_weights=False), "kv"),
        (dict(), dict(), "unbatched"),
    ]
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        for module_kw, call_kw, shape in cases:
            mha = nn.MultiheadAttention(32, 4, **module_kw).eval()
            q = torch.randn(6, 32) if shape == "unbatched" else torch.randn(2, 6, 32) if mha.batch_first \
                else torch.randn(6, 2, 32)
            k = v = q
            if shape == "cross":
                k = v = torch.randn(2, 5, 32)
            elif shape == "separate":
                k, v = torch.randn(2, 5, 24), torch.randn(2, 5, 20)
            elif shape == "kv":
                k, v = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
            kw = dict(call_kw)
            if kw.pop("causal", False):
                kw["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(6)
            if kw.pop("padding", False):
                kw["key_padding_mask"] = torch.tensor([[False] * 4 + [True], [False] * 5])
            ours = attention_forward(mha, q, k, v, **kw)
            theirs = mha(q, k, v, **kw)
            assert torch.equal(ours[0], theirs[0]), (module_kw, call_kw, shape)
            assert (ours[1] is None and theirs[1] is None) or torch.equal(ours[1], theirs[1])
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


# ---- gradients of gradients, autocast, torch.func -------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise", "mxfp8"])
def test_a_gradient_penalty_raises_instead_of_dropping_terms(recipe):
    """autograd.grad(..., create_graph=True) through an FP8 layer raises a clear error; it never builds
    no graph and lets a penalty's terms vanish from dW."""
    model = convert(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)), recipe)
    x = torch.randn(8, 16, requires_grad=True)
    y = model(x).sum()
    with pytest.raises(RuntimeError, match=r"second derivative through an FP8 layer is not computed.*skip="):
        torch.autograd.grad(y, x, create_graph=True)
    gx, = torch.autograd.grad(model(x).sum(), x)  # a first derivative is fine
    assert gx.shape == x.shape


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4"])
def test_autocast_gives_the_dtype_nn_linear_gives(recipe):
    """Under torch.autocast("cpu", bfloat16) an FP8 layer returns bfloat16 as nn.Linear does: it quantizes
    the bfloat16 operands autocast makes, and its weight gradient stays float32."""
    torch.manual_seed(4)
    lin = nn.Linear(32, 16)
    layer = convert(lin, recipe)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", torch.bfloat16):
        out, ref = layer(x), lin(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    twin = FP8Linear(32, 16, recipe=recipe, dtype=torch.bfloat16)  # the same operands, given in bfloat16
    with torch.no_grad():
        twin.weight.copy_(lin.weight)
        twin.bias.copy_(lin.bias)
    assert torch.equal(out, twin(x.bfloat16()))
    out.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32


def test_torch_func_grad_works_and_vmap_and_nested_grad_say_why_not():
    torch.manual_seed(5)
    layer = convert(nn.Linear(8, 4), "tensorwise")
    params = {k: v.detach() for k, v in layer.named_parameters()}
    x = torch.randn(3, 8)
    g = torch.func.grad(lambda p: torch.func.functional_call(layer, p, (x,)).square().sum())(params)
    layer(x).square().sum().backward()
    assert torch.equal(g["weight"], layer.weight.grad) and torch.equal(g["bias"], layer.bias.grad)
    with pytest.raises(RuntimeError, match="vmap over an FP8 layer is not supported"):
        torch.func.vmap(layer)(torch.randn(2, 3, 8))
    with pytest.raises(RuntimeError, match="second derivative"):
        torch.func.grad(lambda t: torch.func.grad(lambda u: layer(u).square().sum())(t).sum())(x)


# ---- hooks, saving, the public name -----------------------------------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True])
def test_hooks_run_after_convert(inplace):
    seen = []
    model = nn.Sequential(nn.Linear(4, 4))
    model[0].register_forward_pre_hook(lambda m, a: seen.append(("pre", type(m).__name__)))
    model[0].register_forward_hook(lambda m, a, o: seen.append(("post", type(m).__name__)))
    convert(model, "tensorwise", inplace=inplace)(torch.randn(2, 4))
    assert seen == [("pre", "FP8Linear"), ("post", "FP8Linear")]


def test_a_converted_transformer_saves_copies_and_reloads_with_its_histories():
    """torch.save of the whole model (FP8 subclasses of torch's classes pickle by their base), deepcopy and
    a state_dict round trip (attention in-projection histories included) give the same outputs."""
    enc = _encoder()
    model = convert(enc, "delayed")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(2, 5, 32)).sum().backward()
        opt.step()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    reloaded = torch.load(buffer, weights_only=False)
    state = model.state_dict()
    assert any(k.endswith("self_attn.in_proj.qkv.amax_history.input") for k in state)
    fresh = convert(enc, "delayed")
    fresh.load_state_dict(state)
    x = torch.randn(2, 5, 32)
    for other in (reloaded, copy.deepcopy(model), fresh):
        assert torch.equal(model(x), other(x))


def test_fp8lab_nn_is_there_after_import_fp8lab():
    code = "import torch, fp8lab; m = fp8lab.nn.convert(torch.nn.Linear(32, 16), 'tensorwise'); print(type(m).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "FP8Linear"


# ---- torchao and the per-site overrides ----------------------------------------------------------------------------


def test_torchao_names_the_layers_its_kernels_cannot_take():
    pytest.importorskip("torchao")
    model = nn.Sequential(nn.Linear(100, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    with pytest.warns(ConversionWarning, match=r"0 \(Linear\): torchao's float8 kernels need both widths divisible"):
        converted = convert(model, "tensorwise", engine="torchao")
    report = conversion_report(converted)
    assert [r["module"] for r in report.converted] == ["2"]
    assert [r["module"] for r in report.left] == ["0", "4"]
    with pytest.raises(ValueError, match="strict=True"):
        convert(model, "tensorwise", engine="torchao", strict=True)


def test_overrides_give_sites_their_own_recipe_or_high_precision():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    converted = convert(model, "mxfp8", overrides={"4": None, "2": "blockwise", "*": "tensorwise"})
    assert [(n, m.recipe.name) for n, m in fp8_layers(converted)] == [("0", "tensorwise"), ("2", "blockwise")]
    assert type(converted[4]) is nn.Linear
    assert conversion_report(converted).kept[0]["reason"] == "overrides['4'] = None"
    with pytest.raises(ValueError, match=r"overrides pattern 'fc\*' matches no linear GEMM site"):
        convert(model, "mxfp8", overrides={"fc*": None})
    with pytest.raises(ValueError, match="unknown recipe 'fp6'"):
        convert(model, "mxfp8", overrides={"0": "fp6"})


# ---- delayed scaling: checkpointing, micro-batches, evaluation, NaN and inf --------------------------------------


def _delayed_run(checkpointed: str | None, record: str = "step", micro: int = 1, evaluate: bool = False):
    torch.manual_seed(0)
    recipe = fp8lab.get_recipe("delayed")
    recipe = recipe.replace(delayed=fp8lab.numerics.recipes.DelayedSpec(16, "max", record))
    model = convert(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)), recipe)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(4):
        opt.zero_grad()
        for _ in range(micro):
            x = (torch.randn(16, 32, generator=g) * (1 + step)).requires_grad_(checkpointed == "reentrant")
            y = checkpoint(model, x, use_reentrant=checkpointed == "reentrant") if checkpointed else model(x)
            y.square().mean().backward()
            if evaluate:
                with torch.no_grad():
                    model(x * 100)
                model.eval()
                model(x * 100)
                model.train()
        opt.step()
    return [p.detach().clone() for p in model.parameters()], model[0].histories


@pytest.mark.parametrize("record", ["step", "forward"])
@pytest.mark.parametrize("kind", ["non-reentrant", "reentrant"])
def test_a_checkpointed_delayed_run_equals_the_plain_run_bit_for_bit(kind, record):
    """Activation checkpointing recomputes the forward inside the backward pass: the recompute scales as
    the first forward did, and the histories take the entries they take without checkpointing."""
    plain, plain_hist = _delayed_run(None, record)
    ckpt, ckpt_hist = _delayed_run(kind, record)
    assert all(torch.equal(a, b) for a, b in zip(plain, ckpt, strict=True))
    for role in plain_hist:
        assert ckpt_hist[role].history == plain_hist[role].history
        assert len(plain_hist[role]) == (4 if record == "step" else 3)  # ("forward": the 4th forward's is pending)


def test_delayed_histories_record_training_steps_only():
    """Evaluation forwards (no_grad, or eval mode) leave the histories alone; micro-batches of one
    optimizer step enter as one amax (their max) by default, one each with record='forward'."""
    _, alone = _delayed_run(None)
    _, evaluated = _delayed_run(None, evaluate=True)
    assert evaluated["input"].history == alone["input"].history
    _, micro = _delayed_run(None, micro=3)
    assert len(micro["input"]) == 4
    _, per_forward = _delayed_run(None, record="forward", micro=3)
    assert len(per_forward["input"]) == 11  # 12 forwards: the last one's amaxes are pending
    groups = [per_forward["input"].history[i:i + 3] for i in range(0, 9, 3)]
    assert [max(gr) for gr in groups] == micro["input"].history[:3]


def test_end_step_serves_optimizers_outside_torch_optim():
    layer = convert(nn.Linear(8, 4), "delayed")
    for step in range(3):
        layer(torch.randn(4, 8)).sum().backward()
        with torch.no_grad():
            layer.weight -= 0.1 * layer.weight.grad
        assert len(layer.histories["input"]) == step
        assert fp8lab.nn.end_step(layer) == 1
    assert len(layer.histories["input"]) == 3


def test_a_frozen_layers_history_steps_with_the_models_optimizer():
    """A frozen layer (a LoRA base, say) has no parameter in the optimizer: its step ends with the model's."""
    model = convert(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), "delayed")
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    assert len(model[0].histories["input"]) == len(model[2].histories["input"]) == 3


def test_a_nan_batch_under_delayed_scaling_does_not_blind_the_next_steps():
    """One NaN batch: that step's loss is NaN (as with every recipe), the NaN stays out of the histories,
    and the next clean step trains normally (finite loss) instead of staying NaN for the history's length."""
    torch.manual_seed(6)
    model = convert(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)), "delayed")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with pytest.warns(RuntimeWarning, match="NaN .* left out of the delayed-scaling history"):
        for step in range(6):
            x = torch.randn(8, 16)
            if step == 2:
                x[0, 0] = float("nan")
            loss = model(x).square().mean()
            losses.append(float(loss.detach()))
            opt.zero_grad()
            if torch.isfinite(loss):
                loss.backward()
                opt.step()
            else:
                fp8lab.nn.end_step(model)  # the step a loss scaler would skip still ends
    assert [v != v for v in losses] == [False, False, True, False, False, False]
    assert model[0].delayed.skipped["input"] == 1
    assert all(a == a for a in model[2].histories["input"].history)


def test_an_infinity_under_delayed_scaling_gets_the_error_every_recipe_gives():
    x = torch.randn(4, 8)
    x[1, 1] = float("inf")
    for recipe in ("tensorwise", "delayed"):
        with pytest.raises(ValueError, match=r"infinite value.*torch.nan_to_num"):
            convert(nn.Linear(8, 4), recipe)(x)


# ---- inspect: converted models, and memory ---------------------------------------------------------------------


def test_inspect_on_a_converted_model_says_what_to_do():
    model = convert(nn.Sequential(nn.Linear(8, 8)), "tensorwise")
    with pytest.raises(ValueError, match=r"converted already.*fp8lab.nn.unwrap"):
        fp8lab.inspect(model, torch.randn(4, 8))


def test_inspect_bounds_its_memory_by_capturing_in_passes():
    """Under a small max_capture_mb the sites are captured a few at a time (each pass a forward and backward
    of its own) and the report is the one-pass report, row for row."""
    from fp8lab.training.capture import captures

    torch.manual_seed(7)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(64, 64), nn.GELU())], nn.Dropout(0.1))
    x = torch.randn(256, 64)

    def loss(out):
        return out.square().mean()

    whole = fp8lab.inspect(model, x, loss, recipes=["tensorwise", "mxfp8"], progress=False, max_capture_mb=None)
    bounded = fp8lab.inspect(model, x, loss, recipes=["tensorwise", "mxfp8"], progress=False, max_capture_mb=0.2)
    assert whole.frame.equals(bounded.frame)
    passes = [sum(c.nbytes for c in cap.calls) for cap in captures(model, x, loss, max_capture_mb=0.2)]
    assert len(passes) == 4 and max(passes) <= 0.2 * 2**20
