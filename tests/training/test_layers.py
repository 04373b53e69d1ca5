"""FP8Linear in a mixed-precision loop: a gradient's inf or NaN flows as a high-precision layer's would.

torch.amp.GradScaler lets a too-large loss scale overflow, skips that optimizer step and halves the scale;
it grows the scale every growth_interval steps, so a long fp16 run meets an overflow by design. A converted
model must skip the same steps and follow the same scales as the unconverted one, record nothing from an
overflow step in its delayed-scaling histories, and make the same collective calls on every rank.
"""

import copy
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import fp8lab
from fp8lab import RECIPES
from fp8lab.nn import FP8Linear, convert, fp8_layers
from fp8lab.numerics.recipes import VARIANTS
from fp8lab.training import layers
from tests.defaults import OTHER_DEFAULTS, torch_defaults

EVERY_RECIPE = [*RECIPES, *VARIANTS]
BATCH, WIDTH, OUT = 16, 32, 8
# The loss is c * (sum of one sample's outputs): its gradient dy at the output is c * S (S the loss scale,
# a power of two; c = 1.5 * 2^-a) on that sample's row and 0 elsewhere, the same exact value in both models.
# In fp16, dy overflows iff c * S > 65504: 1.5 * 2^16 overflows, 1.5 * 2^15 = 49152 does not. bf16 has
# fp32's exponent range: its gradients overflow only where fp32 does, 1.5 * 2^128 but not 1.5 * 2^127, so
# its c is large. Both put the first scale that overflows at 2^22.
FIRST_OVERFLOW = 22
C_EXPONENT = {torch.float16: FIRST_OVERFLOW - 16, torch.bfloat16: FIRST_OVERFLOW - 128}


def _small_model(seed: int = 0) -> nn.Sequential:
    """Three linear layers whose every weight row and column sums to at most 0.25 in magnitude, biases within
    0.05, inputs within 0.25: every gradient behind the output is at most a quarter of dy's largest value."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                          nn.Linear(WIDTH, OUT))
    with torch.no_grad():
        for layer in model[::2]:
            w = layer.weight
            w.mul_(0.25 / max(float(w.abs().sum(0).max()), float(w.abs().sum(1).max())))
            layer.bias.uniform_(-0.05, 0.05)
    return model


def _batches(steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [(torch.rand(BATCH, WIDTH, generator=g) - 0.5) * 0.5 for _ in range(steps)]


def _scaled_run(model: nn.Module, dtype: torch.dtype, steps: int = 20):
    """GradScaler from 2^26, growing every 3 steps: (the scale each step ran with, whether it was skipped),
    and each step's parameters."""
    c = 1.5 * 2.0 ** -C_EXPONENT[dtype]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3 / c)  # (lr / c undoes c: weights move as with the plain loss)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**26, growth_interval=3)
    trace, params = [], []
    for x in _batches(steps):
        scale = scaler.get_scale()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            out = model(x)
        loss = c * out[0].float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        trace.append((scale, scaler.get_scale() < scale))
        params.append([p.detach().clone() for p in model.parameters()])
    return trace, params


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_a_grad_scaler_skips_the_same_steps_with_the_same_scales_as_high_precision(recipe, dtype):
    """Over 20 steps the scale falls from 2^26 to 2^21 (5 skipped steps) and then grows into 2^22 after every
    third step, which overflows again: the converted model skips exactly the unconverted one's steps.

    Why they must agree: the overflow is decided at the output, where dy = c * S is the same exact value in
    both models (the loss reads one sample's outputs in fp32; autocast casts its gradient to the layer's
    dtype). Behind the output every gradient is at most a quarter of c * S in high precision (small weights,
    inputs and biases), and FP8's quantization moves a value by far less than the factor of 2.6 left to
    fp16's largest value (65504 against 1.5 * 2^15 / 4): so a step overflows in either model exactly where
    c * S does. Once dy holds an inf, the converted model's GEMMs that read it run in high precision, so
    the inf reaches the parameters' gradients and the scaler sees it."""
    base = _small_model()
    model = convert(copy.deepcopy(base), recipe)
    assert fp8_layers(model), f"{recipe} converted nothing here: the test would test nothing"
    want, _ = _scaled_run(copy.deepcopy(base), dtype)
    got, params = _scaled_run(model, dtype)
    assert got == want
    skipped = [scale for scale, skip in got if skip]
    assert skipped[:5] == [2.0**e for e in range(26, 21, -1)]  # the way down from 2^26
    assert len(skipped) == 8 and all(scale == 2.0**FIRST_OVERFLOW for scale in skipped[5:])  # grown into it again
    for step, (_, skip) in enumerate(got):
        assert all(bool(torch.isfinite(p).all()) for p in params[step])
        if skip and step:  # a skipped step leaves the weights as they were
            assert all(torch.equal(a, b) for a, b in zip(params[step], params[step - 1], strict=True))


def test_one_fp16_step_that_overflows_is_skipped_for_every_recipe():
    """The everyday case: Linear(32, 32), GELU, Linear(32, 8), GradScaler(init_scale=2**30), one fp16 step
    overflows; every recipe's backward hands the scaler an inf, the step is skipped and the scale halved."""
    torch.manual_seed(0)
    for recipe in EVERY_RECIPE:
        model = convert(nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 8)), recipe)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)
        before = [p.detach().clone() for p in model.parameters()]
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.mse_loss(model(torch.randn(16, 32)).float(), torch.randn(16, 8))
        scaler.scale(loss).backward()
        assert any(not bool(torch.isfinite(p.grad).all()) for p in model.parameters()), recipe
        scaler.step(opt)
        scaler.update()
        assert scaler.get_scale() == 2.0**29, recipe
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)), recipe


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_a_non_finite_gradient_gives_high_precisions_gradients_from_the_same_operands(recipe):
    """What an overflow step computes: dgrad dy @ w and wgrad dy^T @ x in float32 from the layer's own dy,
    w and x (the bias gradient as always), so inf and NaN land exactly where they land in float32: an inf beside
    a NaN, a NaN alone (found from the quantizing pass's amaxes) and an inf alone (quantize's refusal)."""
    torch.manual_seed(1)
    lin = nn.Linear(64, 32)
    layer = FP8Linear.from_linear(lin, recipe)
    w = lin.weight.detach()
    for specials in ({(3, 5): math.inf, (7, 0): math.nan}, {(3, 0): math.nan}, {(3, 31): -math.inf}):
        x = torch.randn(16, 64, requires_grad=True)
        dy = torch.randn(16, 32)
        for (row, col), value in specials.items():
            dy[row, col] = value
        layer.weight.grad = None
        layer(x).backward(dy)
        torch.testing.assert_close(x.grad, dy @ w, equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(layer.weight.grad, dy.t() @ x.detach(), equal_nan=True, rtol=0, atol=0)
        assert not bool(torch.isfinite(x.grad[3]).any()) and bool(torch.isfinite(x.grad[4]).all()), specials


def test_an_infinite_input_still_gets_quantizes_error():
    """The forward's operands keep quantize's contract: an infinite activation raises, naming nan_to_num."""
    x = torch.randn(4, 8)
    x[1, 1] = math.inf
    for recipe in ("tensorwise", "blockwise"):
        with pytest.raises(ValueError, match=r"infinite value.*torch.nan_to_num"):
            convert(nn.Linear(8, 4), recipe)(x)


def _delayed_model() -> nn.Sequential:
    torch.manual_seed(2)
    return convert(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)), "delayed")


def test_a_backward_pass_that_overflows_midway_records_no_gradient_amax_in_any_layer():
    """The last layer's dy is finite (it observes its amax) and its dgrad overflows fp16 on the way back:
    the pass overflowed, so no layer keeps a gradient amax from it, and GradScaler's skipped step leaves
    nothing for the next one but its forward amaxes."""
    model = _delayed_model()
    with torch.no_grad():
        model[2].weight.copy_(torch.eye(8) * 4)  # dx = 4 dy: 2^15 * 4 overflows fp16
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.rand(4, 8) + 0.5  # (positive: the ReLU passes every gradient)
    dy = torch.full((4, 8), 2.0**15)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    out.float().backward(dy)
    assert not bool(torch.isfinite(model[0].weight.grad).all())
    assert model[2].delayed.pending_gradients == {} and model[0].delayed.pending_gradients == {}
    assert model[0].delayed.skipped["grad_output"] == 1
    opt.zero_grad()  # (GradScaler would skip opt.step() here; the next step is an ordinary one)
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    out.float().backward(torch.full((4, 8), 2.0**-3))
    opt.step()
    for layer in (model[0], model[2]):
        assert layer.histories["grad_output"].history == [2.0**-3 * (4 if layer is model[0] else 1)]
        assert len(layer.histories["input"].history) == 1  # the two steps' forward amaxes, one entry (their max)


def test_end_step_skipped_drops_the_pending_amaxes():
    model = _delayed_model()
    model(torch.randn(4, 8)).sum().backward()
    assert fp8lab.nn.end_step(model, skipped=True) == 2
    assert all(len(h) == 0 for layer in (model[0], model[2]) for h in layer.histories.values())
    model(torch.randn(4, 8)).sum().backward()
    assert fp8lab.nn.end_step(model) == 2
    assert all(len(h) == 1 for layer in (model[0], model[2]) for h in layer.histories.values())


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_every_rank_makes_the_same_amax_reductions_in_an_overflow_step(recipe):
    """With an amax reducer (data parallelism) an overflow step reduces the same amaxes, of the same shapes,
    in the same order as a finite step: a rank whose gradient holds an inf makes the collective calls the
    others make (a missing one would hang them)."""
    calls: list[tuple[int, ...]] = []

    def reducer(amax: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(amax.shape))
        return amax

    model = convert(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32)), recipe, amax_reducer=reducer)
    x = torch.randn(32, 64, requires_grad=True)
    sequences = []
    for bad in (None, math.inf, math.nan):
        calls.clear()
        dy = torch.randn(32, 32)
        if bad is not None:
            dy[5, 7] = bad
        model(x).backward(dy)
        sequences.append(list(calls))
    assert sequences[0] == sequences[1] == sequences[2]


def test_a_non_finite_reduced_amax_decides_on_every_rank():
    """Where a gradient's amax is reduced over ranks, the decision is the reduced amax's: a rank whose own
    dy is finite runs the high-precision GEMMs when another rank's held an inf (here the reducer plays it)."""
    other_rank_overflowed = [False]

    def reducer(amax: torch.Tensor) -> torch.Tensor:
        return torch.full_like(amax, math.inf) if other_rank_overflowed[0] else amax

    layer = convert(nn.Linear(64, 32), "tensorwise", amax_reducer=reducer)
    x = torch.randn(16, 64)
    out = layer(x)
    other_rank_overflowed[0] = True
    dy = torch.randn(16, 32)
    out.backward(dy)
    assert torch.allclose(layer.weight.grad, dy.t() @ x, rtol=1e-6, atol=1e-6)  # high precision, not FP8


# ---- every recipe's training steps, pinned bit for bit ----------------------------------------------------------

PINNED_STEPS = Path(__file__).parents[1] / "fixtures" / "fp8_steps.json"


def step_digests(recipe: str | None, steps: int = 3) -> dict[str, str]:
    """sha256 of what `steps` Adam steps of a converted 3-layer MLP produce (160 -> 288 -> 96 -> 8, 3 x 45 tokens:
    shapes no block divides), per step: the loss, every gradient, the Monitor's rows; after the last step, every
    weight and the delayed histories. The fixture pins these as the package computed them (tools: regenerate with
    `python tests/training/test_layers.py` only where a change of numbers is meant; recipe None: the fp32 model)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(160, 288), nn.GELU(), nn.Linear(288, 96), nn.GELU(), nn.Linear(96, 8))
    monitor = fp8lab.nn.Monitor()
    model = model if recipe is None else convert(model, recipe, monitor=monitor)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    out: dict[str, str] = {}

    def digest(*tensors: torch.Tensor) -> str:
        h = hashlib.sha256()
        for t in tensors:
            h.update(t.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    for step in range(steps):
        x = torch.randn(3, 45, 160, generator=g) * (1 + 10 * (torch.rand(160, generator=g) > 0.95))
        y = torch.randn(3, 45, 8, generator=g)
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        loss.backward()
        out[f"loss {step}"] = digest(loss)
        out[f"grads {step}"] = digest(*(p.grad for p in model.parameters()))
        opt.step()
        monitor.step += 1
    out["monitor"] = hashlib.sha256(monitor.frame().to_csv().encode()).hexdigest()  # (floats written exactly)
    out["weights"] = digest(*model.parameters())
    histories = [h.history for _, layer in fp8_layers(model) for h in (layer.histories or {}).values()]
    out["histories"] = hashlib.sha256(repr(histories).encode()).hexdigest()
    return out


def summation_flavor() -> str:
    """Which fp32 sums this machine's BLAS makes at the pinned model's shapes: the hash of the fp32 model's three
    steps (same weights, same batches, no FP8). Every FP8 digest rests on such sums (the emulated GEMMs add exact
    products in fp32 with torch's matmul, whose order follows the instruction set: AVX2 and AVX-512 differ), so the
    fixture pins the recipes' digests per flavor, each made from the same code."""
    return step_digests(None)["weights"]


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_every_recipes_training_steps_equal_the_pinned_ones_bit_for_bit(recipe):
    """Losses, gradients, Monitor rows, weights and amax histories of three steps equal the fixture's hashes for
    this machine's fp32 sums: a faster path around the GEMMs changes no bit of what a training step computes."""
    pinned = json.loads(PINNED_STEPS.read_text())
    flavor = summation_flavor()
    assert flavor in pinned, (f"this machine's BLAS sums the fp32 steps in an order no fixture entry was made with "
                              f"(flavor {flavor[:12]}; pinned: {', '.join(f[:12] for f in pinned)}): add its entry "
                              "from a checkout of main with `python tests/training/test_layers.py`")
    assert step_digests(recipe) == pinned[flavor][recipe]


def test_a_backward_that_raises_between_its_gemms_keeps_no_gradient(monkeypatch):
    """The finiteness of dy that dgrad's quantize found, kept for wgrad's read of the same dy, goes with the backward
    pass even where wgrad raises (an error, a KeyboardInterrupt): the layer's state keeps no dy alive."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(layers, "_wgrad", interrupted)
    layer = FP8Linear(WIDTH, OUT, recipe="tensorwise", backend="emulated")
    y = layer(torch.randn(BATCH, WIDTH, requires_grad=True))
    node = y.grad_fn
    while not hasattr(node, "state"):  # the layer's autograd node, behind the reshape
        node = node.next_functions[0][0]
    with pytest.raises(KeyboardInterrupt):
        y.sum().backward()
    assert node.state.finite_gradient is None


def test_delayed_scaling_reads_each_forward_operand_once(monkeypatch):
    """With a history, a forward operand is scaled from it and its own amax (for the history) comes from the
    quantizing pass: no separate amax pass for x or w (the gradient's is read once for its finiteness check)."""
    model = convert(_small_model(), "delayed")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 8)

    def step():
        opt.zero_grad()
        (model(x) - y).square().mean().backward()
        opt.step()

    step()  # the histories take their first amaxes
    passes = []
    real = layers.block_amax
    monkeypatch.setattr(layers, "block_amax", lambda t, g: passes.append(tuple(t.shape)) or real(t, g))
    step()
    n_layers = len(fp8_layers(model))
    assert len(passes) == n_layers, passes  # one per layer: its dy, none for x and w


if __name__ == "__main__":  # add (or renew) this machine's flavor (only where a change of numbers is meant)
    entries = json.loads(PINNED_STEPS.read_text()) if PINNED_STEPS.exists() else {}
    entries[summation_flavor()] = {r: step_digests(r) for r in EVERY_RECIPE}
    PINNED_STEPS.write_text(json.dumps(entries, indent=1) + "\n")


@pytest.mark.parametrize("recipe", EVERY_RECIPE)
def test_defaults_set_after_conversion_change_no_step(recipe):
    """A learner who calls torch.set_default_dtype (float64 for a reference computation, a half type by mistake) or
    set_default_device ("meta" to size a model) after converting a float32 model trains it as before: every
    tensor the layers make for the C kernels, their scales and their GEMMs is a float32 tensor on the operands'
    device whatever the defaults, so losses, gradients and weights are bit for bit the defaults' ones."""

    def steps(dtype: torch.dtype, device: str) -> list[torch.Tensor]:
        model = convert(_small_model(), recipe)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        out = []
        for x in _batches(3):
            with torch_defaults(dtype, device):
                opt.zero_grad()
                loss = model(x).square().mean()
                loss.backward()
            opt.step()
            out += [loss.detach(), *(p.grad.clone() for p in model.parameters())]
        return out + [p.detach() for p in model.parameters()]

    want = steps(torch.float32, "cpu")
    for dtype, device in OTHER_DEFAULTS:
        got = steps(dtype, device)
        assert all(a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
                   for a, b in zip(got, want, strict=True)), (dtype, device)


def test_the_bias_is_torchs_add_where_torch_runs_it_alone_else_the_kernels(monkeypatch):
    """An FP8 layer's bias joins its output by torch's add_ where torch runs it on the calling thread
    (kernels.torch_runs_alone: fewer elements than its grain, or one thread) and by the kernels' add_row_ where
    torch would split it over its threads (which a passive OpenMP wait makes slow to wake); the same bits as the
    torch code either way."""
    from fp8lab.numerics import kernels, kernels_gemm

    if not kernels.engine().kernels:
        pytest.skip(f"kernels not built here: {kernels.status()[1]}")
    calls = []
    add_row_ = kernels_gemm.add_row_
    monkeypatch.setattr(kernels_gemm, "add_row_", lambda out, row: calls.append(out.numel()) or add_row_(out, row))
    torch.manual_seed(0)
    layer = FP8Linear(64, 256, recipe="tensorwise")
    threads = torch.get_num_threads()
    try:
        for n_threads, m, split in ((2, 16, False), (2, 256, True), (1, 256, False)):
            torch.set_num_threads(n_threads)
            x = torch.randn(m, 64)
            calls.clear()
            got = layer(x)
            assert calls == ([m * 256] if split else []), (n_threads, m)
            with kernels.disabled():
                want = layer(x)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (n_threads, m)
    finally:
        torch.set_num_threads(threads)
