"""The real-GPU path without a GPU: every recipe's fprop, dgrad and wgrad GEMM through torch's
scaled matmuls as sm_89, sm_90 and sm_100 accept them (tests/scaled_mm_standin.py applies the
checks of torch's CUDA code and computes the product), against the exact emulation."""

import math
from pathlib import Path

import pytest
import torch

import fp8lab
from fp8lab import E2M1, E4M3, E5M2, E8M0, PerBlock, PerRow, PerTensor, quantize
from fp8lab.bench.gpu import bench_gpu
from fp8lab.gemm import (
    GemmBackend,
    KernelUnavailable,
    emulated_mm,
    matmul,
    plan_gemm,
    prepare_real_mm,
    real_mm,
    swizzle_scales,
)
from fp8lab.nn import convert, layer_gemms
from fp8lab.numerics.recipes import RECIPES, VARIANTS
from fp8lab.training.gpu_support import GPU_GENERATIONS, gemm_table, gpu_support_markdown
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import train_step
from tests.scaled_mm_standin import StandIn

ARCHS = {"sm_89": (8, 9), "sm_90": (9, 0), "sm_100": (10, 0)}
NAMES = [*RECIPES, *VARIANTS]
SHAPES = {"aligned": (128, 384, 256), "odd": (200, 328, 72)}  # (M, K, N) of a linear layer
# What each generation has, read from torch's ScaledBlas.cpp (docs/gpu.md): the spec
TENSOR_OR_ROW = {"tensorwise", "delayed", "rowwise", "rowwise_with_gw_hp"}
# (nvfp4_training: NVFP4's operands, the Hadamard transform and stochastic rounding applied before they are scaled)
REAL = {(8, 9): TENSOR_OR_ROW, (9, 0): TENSOR_OR_ROW | {"blockwise"},
        (10, 0): TENSOR_OR_ROW | {"mxfp8", "nvfp4", "nvfp4_training"}}


@pytest.fixture
def standin(monkeypatch, request):
    stand = StandIn(request.param if hasattr(request, "param") else (9, 0))
    with stand.installed(monkeypatch):
        yield stand


def _layer(shape, seed=0):
    m, k, n = shape
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 3, torch.randn(m, n, generator=g)


def _close_to_emulation(real: torch.Tensor, a_q, b_q) -> None:
    """The issue's thresholds, checked here independently of fp8lab's own agrees_with_emulation:
    fp32 outputs within 2^-12 of |a|@|b|; bf16 outputs within one bf16 ulp of the emulation
    rounded to bf16, plus the fp32 summation bound (Higham, gamma_K |a|@|b|) of the two sums,
    which only matters where an output cancels to far below |a|@|b|."""
    emu = emulated_mm(a_q, b_q).double()
    got = real.double()
    magnitude = a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().t()
    if real.dtype == torch.bfloat16:
        ref = emu.to(torch.bfloat16).double()
        ulp = torch.ldexp(torch.ones_like(ref), torch.frexp(ref.abs().clamp(min=1e-38))[1] - 8)
        n = a_q.shape[1] + 4
        assert ((got - ref).abs() <= ulp + 2 * n * 2.0**-24 / (1 - n * 2.0**-24) * magnitude).all()
        # and most outputs round to the very same bf16 value
        assert (got == ref).double().mean() > 0.9
    else:
        assert real.dtype == torch.float32
        assert ((got - emu).abs() <= 2.0**-12 * magnitude).all()


@pytest.mark.parametrize("arch", list(ARCHS.values()), ids=list(ARCHS))
@pytest.mark.parametrize("recipe", NAMES)
def test_every_gemm_of_every_recipe_on_each_generation(monkeypatch, arch, recipe, capsys):
    stand = StandIn(arch)
    with stand.installed(monkeypatch):
        for shape in SHAPES.values():
            pairs = layer_gemms(*_layer(shape), recipe)
            assert (pairs["wgrad"] is None) == (recipe == "rowwise_with_gw_hp")
            for _gemm, pair in pairs.items():
                if pair is None:
                    continue
                a_q, b_q = pair
                if recipe in REAL[arch]:
                    before = len(stand.calls)
                    out = real_mm(a_q, b_q, arch=arch, cuda="12.9")
                    assert len(stand.calls) == before + 1, "torch's kernel (the stand-in) was not called"
                    assert out.shape == (a_q.shape[0], b_q.shape[0])
                    _close_to_emulation(out, a_q, b_q)
                else:
                    with pytest.raises(KernelUnavailable) as err:
                        real_mm(a_q, b_q, arch=arch, cuda="12.9")
                    # matmul falls back to the emulation with that reason, counted
                    backend = GemmBackend("auto", arch, "12.9", verbose=False)
                    out = matmul(a_q, b_q, recipe, backend=backend, verbose=False)
                    assert torch.equal(out, emulated_mm(a_q, b_q))
                    (row,) = backend.report()
                    assert row["backend"] == "emulated" and str(err.value) in row["reason"]


@pytest.mark.parametrize("arch", list(ARCHS.values()), ids=list(ARCHS))
def test_fp8linear_trains_on_the_real_path_in_all_three_gemms(monkeypatch, arch):
    stand = StandIn(arch)
    task = TeacherTask()
    with stand.installed(monkeypatch):
        for recipe in NAMES:
            backend = GemmBackend("auto", arch, "12.9", verbose=False)
            model = convert(make_model("mlp", 0, hidden=256), recipe, backend=backend)
            ref = convert(make_model("mlp", 0, hidden=256), recipe, backend="emulated")
            opt, opt_ref = (torch.optim.Adam(m.parameters(), lr=2e-3) for m in (model, ref))
            g = torch.Generator().manual_seed(1)
            for _ in range(3):
                x, y = task.batch(g, 48)
                loss = train_step(model, opt, task.loss, x, y)
                loss_ref = train_step(ref, opt_ref, task.loss, x, y)
                assert math.isfinite(loss) and abs(loss - loss_ref) <= 0.02 * loss_ref
            assert backend.fallbacks() == 0
            used = {(r["gemm"], r["backend"]) for r in backend.report()}
            gemms = {"fprop", "dgrad"} if recipe == "rowwise_with_gw_hp" else {"fprop", "dgrad", "wgrad"}
            want = "scaled_mm" if recipe in REAL[arch] else "emulated"
            assert used == {(gm, want) for gm in gemms}, (recipe, used)


def test_a_failure_after_the_kernel_worked_falls_back_for_that_call_only(monkeypatch, capsys):
    stand = StandIn((9, 0))
    with stand.installed(monkeypatch):
        backend = GemmBackend("auto", (9, 0), "12.9")
        a_q, b_q = layer_gemms(*_layer((64, 256, 48)), "blockwise")["fprop"]
        first = matmul(a_q, b_q, "blockwise", backend=backend, verbose=False)
        stand.fail_next = RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasLtMatmul")
        second = matmul(a_q, b_q, "blockwise", backend=backend, verbose=False)
        stand.fail_next = RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasLtMatmul")
        matmul(a_q, b_q, "blockwise", backend=backend, verbose=False)
        third = matmul(a_q, b_q, "blockwise", backend=backend, verbose=False)
    assert torch.equal(second, emulated_mm(a_q, b_q))  # the failed call was emulated ...
    torch.testing.assert_close(first, third, rtol=0, atol=0)  # ... and the kernel was not switched off
    assert backend.fallbacks() == 2
    rows = {r["backend"]: r for r in backend.report()}
    assert rows["scaled_mm"]["calls"] == 2 and rows["fallback"]["calls"] == 2
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in rows["fallback"]["reason"]
    printed = capsys.readouterr().out
    assert printed.count("CUBLAS_STATUS_EXECUTION_FAILED") == 1  # said once, counted every time
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_EXECUTION_FAILED"), stand.installed(monkeypatch):
        stand.fail_next = RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")
        matmul(a_q, b_q, "blockwise", backend=GemmBackend("scaled_mm", (9, 0), "12.9"), verbose=False)


def test_the_kernel_follows_from_the_operands_not_the_recipe():
    x, w, dy = _layer(SHAPES["odd"])
    block = layer_gemms(x, w, dy, "blockwise")
    kinds = {g: plan_gemm(*p, (9, 0), "12.9").kind for g, p in block.items()}
    # wgrad contracts over M: both operands are 1x128 along M (torch's 1x128 x 1x128 kernel)
    assert kinds == {"fprop": "BlockWise1x128 x BlockWise128x128", "dgrad": "BlockWise1x128 x BlockWise128x128",
                     "wgrad": "BlockWise1x128 x BlockWise1x128"}
    hp = layer_gemms(x, w, dy, "rowwise_with_gw_hp")
    assert isinstance(hp["dgrad"][1].granularity, PerTensor)  # per-row dy beside a per-tensor w^T
    assert plan_gemm(*hp["dgrad"], (9, 0), "12.9").kind == "RowWise"
    # NVFP4's 16x16 weight blocks reach the kernel one scale per row, at any N
    nv = layer_gemms(x, w, dy, "nvfp4")
    assert nv["fprop"][1].granularity == PerBlock(16, 16)
    assert {plan_gemm(*p, (10, 0), "12.9").kind for p in nv.values()} == {"BlockWise1x16"}


def test_unavailable_pairs_are_named():
    x = torch.randn(64, 256)
    e5 = quantize(x, E5M2)
    with pytest.raises(KernelUnavailable, match="E5M2 x E5M2"):
        plan_gemm(e5, e5, (9, 0), "12.9")
    with pytest.raises(KernelUnavailable, match=r"FP8 GEMMs need sm_89 or newer, this is sm_80"):
        plan_gemm(quantize(x), quantize(x), (8, 0), "12.9")
    odd = quantize(x, E4M3, PerBlock(1, 64))  # float32 1x64 blocks: no torch kernel takes them
    with pytest.raises(KernelUnavailable, match="no scaled_mm kernel multiplies e4m3 1x64"):
        plan_gemm(odd, odd, (9, 0), "12.9")
    mx = quantize(x, E4M3, PerBlock(1, 32), "rceil", scale_fmt=E8M0)
    with pytest.raises(KernelUnavailable, match="no scaled_mm kernel multiplies"):
        plan_gemm(mx, quantize(x, E4M3, PerRow()), (10, 0), "12.9")
    e5mx = quantize(x, E5M2, PerBlock(1, 32), "rceil", scale_fmt=E8M0)
    with pytest.raises(KernelUnavailable, match="MXFP8 kernel takes E4M3"):
        plan_gemm(e5mx, mx, (10, 0), "12.9")
    # the CUTLASS rowwise kernel (sm_89, sm_100, or sm_90 below cuBLAS 12.9) needs an E4M3 b
    row5 = quantize(x, E5M2, PerRow())
    with pytest.raises(KernelUnavailable, match="CUTLASS rowwise kernel"):
        plan_gemm(quantize(x, E4M3, PerRow()), row5, (8, 9), "12.9")
    assert plan_gemm(quantize(x, E4M3, PerRow()), row5, (9, 0), "12.9").library == "cuBLASLt"


def test_a_cuda_build_below_12_9_is_checked_up_front(monkeypatch):
    stand = StandIn((9, 0), cublas_129=False)
    x, w, dy = _layer(SHAPES["aligned"])
    with stand.installed(monkeypatch):
        for _gemm, pair in layer_gemms(x, w, dy, "blockwise").items():
            with pytest.raises(KernelUnavailable, match=r"needs cuBLAS >= 12.9, this torch has CUDA 12.4"):
                real_mm(*pair, arch=(9, 0), cuda="12.4")
        # rowwise runs on CUTLASS there, as torch does, and all three GEMMs are accepted
        for pair in layer_gemms(x, w, dy, "rowwise").values():
            assert plan_gemm(*pair, (9, 0), "12.4").library == "CUTLASS"
            _close_to_emulation(real_mm(*pair, arch=(9, 0), cuda="12.4"), *pair)
    assert "needs cuBLAS >= 12.9" in gpu_support_markdown(cuda="12.4")


def test_nvfp4_without_a_tensor_scale_takes_the_single_scale_kernel(monkeypatch):
    stand = StandIn((10, 0))
    x, w = torch.randn(40, 96), torch.randn(24, 96)
    a_q = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3)
    b_q = quantize(w, E2M1, PerBlock(16, 16), scale_fmt=E4M3)
    assert a_q.tensor_scale is None
    with stand.installed(monkeypatch):
        _close_to_emulation(real_mm(a_q, b_q, arch=(10, 0), cuda="12.9"), a_q, b_q)
        b2 = quantize(w, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)
        with pytest.raises(KernelUnavailable, match="a tensor scale on both operands"):
            real_mm(a_q, b2, arch=(10, 0), cuda="12.9")


def test_the_standin_refuses_what_torch_refuses(monkeypatch):
    """The stand-in's own checks can fail: it refuses the layouts torch refuses, the ones a bug in fp8lab's
    GEMM path would hand it."""
    stand = StandIn((9, 0))
    a = torch.randn(64, 128).to(torch.float8_e4m3fn)
    b = torch.randn(32, 128).to(torch.float8_e4m3fn)
    one = torch.ones(())
    with stand.installed(monkeypatch):
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)  # TN: fine
        with pytest.raises(RuntimeError, match="Only multiplication of row-major and column-major"):
            torch._scaled_mm(a.t().contiguous().t(), b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        with pytest.raises(RuntimeError, match="Only multiplication of row-major and column-major"):
            torch._scaled_mm(a, b.t().contiguous(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        with pytest.raises(RuntimeError, match="divisible by 16"):
            torch._scaled_mm(a[:, :120], b[:, :120].t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        with pytest.raises(ValueError, match="scale_b must have shape 4 x 1"):  # 128x128 scales as if 1x16
            F = torch.nn.functional
            torch.nn.functional.scaled_mm(a, b.t(), torch.ones(1, 64).t(), F.ScalingType.BlockWise1x128,
                                          torch.ones(1, 1), F.ScalingType.BlockWise128x128,
                                          output_dtype=torch.float32)
        # the CUTLASS rowwise kernel on sm_89 and sm_100: a column-major A is refused
        stand.arch = (10, 0)
        with pytest.raises(RuntimeError, match=r"CUTLASS rowwise: a\.stride"):
            torch._scaled_mm(a.t().contiguous().t(), b.t(), scale_a=torch.ones(64, 1),
                             scale_b=torch.ones(1, 32), out_dtype=torch.bfloat16)


def test_e8m0_scales_swizzle_as_bytes():
    # as bytes: cast to float8_e8m0fnu and then indexed, they fail ("index_put" is not implemented for it)
    s = torch.exp2(torch.randint(-20, 20, (130, 9)).float()).to(torch.float8_e8m0fnu)
    out = swizzle_scales(s)
    assert out.dtype == torch.float8_e8m0fnu
    assert torch.equal(out.view(torch.uint8), swizzle_scales(s.view(torch.uint8)))


def test_prepared_call_replays_the_kernel_alone(monkeypatch):
    stand = StandIn((9, 0))
    with stand.installed(monkeypatch):
        a_q, b_q = layer_gemms(*_layer((64, 256, 48)), "tensorwise")["dgrad"]
        prepared = prepare_real_mm(a_q, b_q, plan_gemm(a_q, b_q, (9, 0), "12.9"), torch.device("cpu"))
        assert prepared.args[0].is_contiguous() and prepared.args[1].t().is_contiguous()  # TN
        n = len(stand.calls)
        full = prepared.run()
        assert len(stand.calls) == n + 1 and full.shape == (64, 256)  # padded N: 48 -> ... K of dgrad
        assert torch.equal(prepared.result(), full[:64, : b_q.shape[0]])


def test_the_probe_catches_a_kernel_that_disagrees(monkeypatch):
    stand = StandIn((9, 0))
    backend = GemmBackend("auto", (9, 0), "12.9")
    x = torch.randn(64, 256)
    a_q = quantize(x)
    plan = plan_gemm(a_q, a_q, (9, 0), "12.9")
    with stand.installed(monkeypatch):
        assert backend._probe(plan, torch.device("cpu"), a_q, a_q, "12.9") == (True, "probe ok")
        wrong = StandIn((9, 0))
        wrong._out = lambda a, b, dtype, alpha=1.0: (1.01 * (a @ b)).to(dtype)  # a kernel 1% off
        monkeypatch.setattr(torch, "_scaled_mm", wrong.scaled_mm_v1)
        fresh = GemmBackend("auto", (9, 0), "12.9")
        ok, why = fresh._probe(plan, torch.device("cpu"), a_q, a_q, "12.9")
        assert not ok and "disagreed with the emulation in its probe" in why


DRY_RUN = """
import json, sys
for blocked in ("torchao", "pandas", "matplotlib", "seaborn", "ipywidgets"):
    sys.modules[blocked] = None  # the GPU machine's image: torch, no torchao (and maybe nothing else)
import torch
import torch.nn.functional as F
from fp8lab.bench.gpu import bench_gpu
from tests.scaled_mm_standin import StandIn

results = {}
for arch in ((8, 9), (9, 0), (10, 0)):
    stand = StandIn(arch)
    torch._scaled_mm, F.scaled_mm = stand.scaled_mm_v1, stand.scaled_mm_v2
    out = bench_gpu(device="cpu", arch=arch, cuda="12.9", train_steps=2, ks=(256,))
    results[str(arch)] = out
print("RESULT" + json.dumps(results, default=str))
"""


def test_bench_gpu_dry_run_has_no_failures_on_every_generation_with_torch_alone():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", DRY_RUN], capture_output=True, text=True, cwd=root, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.split("RESULT", 1)[1])
    for arch in ARCHS.values():
        out = results[str(arch)]
        assert out["failures"] == []
        real = {(row["recipe"], row["gemm"]) for row in out["tables"]["backends"] if row["backend"] == "scaled_mm"}
        checked = {(row["recipe"], row["gemm"]) for row in out["tables"]["real_vs_emulated"]}
        assert real == checked and {rec for rec, _ in real} == REAL[arch]
        assert all(row["ok"] == "ok" for row in out["tables"]["real_vs_emulated"])
        assert all(row["fallback"] == 0 for row in out["tables"]["train"])
        acc = out["tables"]["accumulation"][-1]
        assert acc["model 14-bit, no promotion"] > acc["model 14-bit, promote 128"] > acc["emulated fp32"]
        assert "real use_fast_accum=True" in acc
    assert r.stdout.count("bench gpu: 0 failure(s)") == 3


def test_bench_gpu_dry_run_reports_a_broken_kernel(monkeypatch):
    stand = StandIn((9, 0))
    stand._out = lambda a, b, dtype, alpha=1.0: (1.01 * (a @ b)).to(dtype)  # every kernel 1% off
    with stand.installed(monkeypatch):
        out = bench_gpu(device="cpu", arch=(9, 0), cuda="12.9", train_steps=1, ks=(256,), shapes=((200, 328, 72),))
    assert out["failures"] and all(f.startswith("(b)") for f in out["failures"])


def test_the_docs_gpu_table_is_generated_from_the_decision():
    text = (Path(fp8lab.__file__).resolve().parents[1] / "docs" / "gpu.md").read_text()
    shown = text.split("<!-- gpu-table:begin -->\n")[1].split("\n<!-- gpu-table:end -->")[0]
    assert shown == gpu_support_markdown()
    for label, arch in GPU_GENERATIONS.items():
        rows = gemm_table(arch, "12.9")
        real = {r["recipe"] for r in rows if r["backend"] == "scaled_mm"}
        assert real == REAL[arch], label


# ---- the plan says what runs, the probe runs what is planned --------------------------------------------------


def test_fast_accumulation_where_the_kernel_takes_it_and_a_clear_error_elsewhere(monkeypatch):
    """The plan follows torch's source: use_fast_accum for tensorwise and rowwise, which take it, not for
    1x128/128x128 blocks, which cuBLAS refuses ("scaled_gemm doesn't support fast accum with 1x128
    blockwise scaling", CUDABlas.cpp get_scale_mode; planned, matmul(..., "blockwise", use_fast_accum=True)
    on an H100 falls back on every call). A pair whose kernel refuses it raises ValueError on any machine
    (the stand-in refuses it too)."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(128, 256, generator=g), torch.randn(256, 64, generator=g)
    stand = StandIn((9, 0))
    with stand.installed(monkeypatch):
        for recipe, takes in (("tensorwise", True), ("rowwise", True), ("blockwise", False)):
            pair = fp8lab.gemm.quantize_operands(a, b, recipe)
            plan = plan_gemm(*pair, (9, 0), "12.9")
            assert plan.fast_accum == takes, recipe
            backend = GemmBackend("auto", (9, 0), "12.9", verbose=False)
            if takes:
                out = matmul(a, b, recipe, backend=backend, use_fast_accum=True, verbose=False)
                assert backend.fallbacks() == 0 and out.shape == (128, 64)
                continue
            with pytest.raises(ValueError, match="use_fast_accum=True applies to the TensorWise and RowWise"):
                matmul(a, b, recipe, backend=backend, use_fast_accum=True, verbose=False)
            with pytest.raises(ValueError, match="use_fast_accum=True applies"):
                matmul(a, b, recipe, backend="emulated", use_fast_accum=True, verbose=False)
            with pytest.raises(RuntimeError, match="doesn't support fast accum with 1x128 blockwise scaling"):
                prepare = prepare_real_mm(*pair, plan, torch.device("cpu"))
                prepare.kwargs["use_fast_accum"] = True
                prepare.run()
            assert backend.fallbacks() == 0


def test_rowwise_writes_float32_where_torch_does():
    """rowwise is planned with a float32 output where the kernel offers it (KernelPlan's own rule), not
    bf16 everywhere: cuBLAS (sm_90, 12.9) writes float32, and current torch's CUTLASS rowwise kernel takes
    bf16, fp16 and fp32 outputs (RowwiseScaledMM.cu, check_inputs)."""
    x = torch.randn(64, 128)
    pair = (quantize(x, E4M3, PerRow(), "rceil"), quantize(x, E4M3, PerRow(), "rceil"))
    assert plan_gemm(*pair, (9, 0), "12.9").out_dtype == torch.float32
    assert plan_gemm(*pair, (8, 9), "12.9").out_dtype == torch.float32  # (torch >= 2.13 here)


def test_an_nvfp4_pair_with_one_tensor_scale_is_planned_emulated():
    """An NVFP4 pair with a tensor scale on one operand only is planned emulated: torch takes both or
    neither (ScaledBlasUtils.cpp), so planned "real" it fails at run time (every call a fallback)."""
    x = torch.randn(64, 128)
    one = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3, two_level=True)
    none = quantize(x, E2M1, PerBlock(1, 16), scale_fmt=E4M3)
    for a_q, b_q in ((one, none), (none, one)):
        with pytest.raises(KernelUnavailable, match="tensor scale on both operands"):
            plan_gemm(a_q, b_q, (10, 0), "12.9")
    assert plan_gemm(one, one, (10, 0), "12.9").two_level and not plan_gemm(none, none, (10, 0), "12.9").two_level


def test_the_probe_runs_the_planned_formats(monkeypatch):
    """A probe is keyed by the whole plan (formats included) and runs operands quantized as the pair is:
    tensorwise dgrad and wgrad run E5M2 x E4M3, and an E4M3 x E4M3 probe passes a kernel that fails only
    for the pair in use."""
    stand = StandIn((9, 0))
    g = torch.Generator().manual_seed(4)
    pairs = layer_gemms(torch.randn(64, 256, generator=g), torch.randn(128, 256, generator=g),
                        torch.randn(64, 128, generator=g), "tensorwise")
    backend = GemmBackend("auto", (9, 0), "12.9", verbose=False)
    with stand.installed(monkeypatch):
        for gemm, pair in pairs.items():
            plan = plan_gemm(*pair, (9, 0), "12.9")
            before = len(stand.dtypes)
            fresh = (str(torch.device("cpu")), plan) not in backend.probes
            assert backend._probe(plan, torch.device("cpu"), *pair, "12.9") == (True, "probe ok")
            ran = stand.dtypes[before:]  # (wgrad's plan is dgrad's: probed once)
            assert ran == ([(pair[0].data.dtype, pair[1].data.dtype, plan.out_dtype)] if fresh else []), gemm
        assert {plan.formats for _, plan in backend.probes} == {("e4m3", "e4m3"), ("e5m2", "e4m3")}


def test_train_announces_which_gemms_ran_real_or_emulated_and_why(monkeypatch, capsys):
    """train() says which GEMMs run real or emulated and why, once per run after the run's first step, and
    TrainResult keeps it: counted silently (TrainResult.backend_lines unshown), mxfp8 on an H100 emulates
    without a word."""
    from fp8lab.training.train import train

    stand = StandIn((9, 0))
    with stand.installed(monkeypatch):
        res = train(("tensorwise", "mxfp8"), steps=2, batch=16, progress=False, monitor_every=None,
                    backend=GemmBackend("auto", (9, 0), "12.9", verbose=False))
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("fp8lab: ")]
    assert printed == [f"fp8lab: {line}" for line in res.announced]
    assert printed[:2] == [
        "fp8lab: tensorwise: fprop real (scaled_mm TensorWise e4m3 x e4m3 on sm_90 (cuBLASLt); 3 GEMMs)",
        "fp8lab: tensorwise: dgrad/wgrad real (scaled_mm TensorWise e5m2 x e4m3 on sm_90 (cuBLASLt); 5 GEMMs)"]
    assert printed[2] == ("fp8lab: mxfp8: fprop/dgrad/wgrad emulated (MX block scaling (1x32, E8M0) needs sm_100 "
                          "(Blackwell) or newer, this is sm_90; 8 GEMMs)")  # said after the first step: 8 GEMMs
    assert res.backend_lines()[2].endswith("; 16 GEMMs)")  # the whole run's counts, kept
    quiet = train("tensorwise", steps=1, batch=8, progress=False, monitor_every=None)  # the CPU: nothing to say
    assert quiet.announced and "fp8lab: " not in capsys.readouterr().out
