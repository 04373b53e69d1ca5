"""`python -m fp8lab bench gpu`: the device check, real FP8 GEMMs against the emulation on a GPU (or a
CPU dry run).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fp8lab.bench.table import print_table
from fp8lab.gemm import (
    AccumulatorModel,
    GemmBackend,
    accumulation_error,
    agrees_with_emulation,
    emulated_mm,
    prepare_real_mm,
    quantize_operands,
)
from fp8lab.numerics.recipes import RECIPES, VARIANTS
from fp8lab.training.convert import convert
from fp8lab.training.layers import layer_gemms
from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import LESSON, train_step

__all__ = ["bench_gpu"]


def _cuda_sample_ms(fn: Callable[[], object], calls: int, samples: int, warmup: int = 3) -> float:
    """Median over `samples` of the mean time of `calls` back-to-back calls between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


@dataclass
class _Check:
    """What every part of the device check shares: where it runs, the backend it asks, the shapes and
    recipes it covers, and the failures it has found so far."""

    dev: torch.device
    backend: object
    shapes: tuple[tuple[int, int, int], ...]
    names: list[str]
    failures: list[str] = field(default_factory=list)
    real_gemms: dict[tuple[str, str], bool] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.dev.type == "cuda"

    def operands(self, shape: tuple[int, int, int], seed: int):
        m, k, n = shape
        g = torch.Generator().manual_seed(seed)
        x, w, dy = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 3, torch.randn(m, n, generator=g)
        return x.to(self.dev), w.to(self.dev), dy.to(self.dev)


def bench_gpu(size: int = 8192, calls: int = 20, samples: int = 5, device: str | None = None,
              arch: tuple[int, int] | None = None, cuda: str | None = None,
              shapes: tuple[tuple[int, int, int], ...] | None = None, train_steps: int | None = None,
              ks: tuple[int, ...] | None = None) -> dict:
    """The one prepared device check: every recipe's GEMMs real against emulated, on this GPU.

    (a) the backend table: per recipe and GEMM (fprop, dgrad, wgrad), real or emulated and why;
        a kernel fp8lab plans to run real whose probe fails is a FAILURE, not a skip;
    (b) real vs emulated for every real GEMM, at an aligned and an odd shape (M, K, N): bf16
        outputs within one bf16 ulp of the emulation rounded to bf16, float32 outputs within
        2^-12 |a|@|b|; the bit-identical fraction is printed;
    (c) a few FP8Linear training steps per recipe (the toy MLP): zero fallbacks, and every GEMM
        the table calls real ran real;
    (d) the accumulation model against use_fast_accum=True/False at K = 1k, 4k, 16k;
    (e) speed at size^3: bf16 torch.mm, the exact kernel call fp8lab makes replayed (calls
        back to back between CUDA events, median of `samples`, three rotating inputs), and the
        full path (quantize both operands + prepare + call), per recipe where the GPU has it.
    Needs torch only (not torchao, not pandas). Without CUDA it is a dry run for tests: pass
    device="cpu", the `arch` and `cuda` to act as, with torch's scaled matmuls replaced by a
    stand-in (tests/scaled_mm_standin.py); (e) then needs CUDA and is skipped.
    Returns {"tables": {...}, "failures": [...]}; `python -m fp8lab bench gpu` exits 1 on failures.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = dev.type == "cuda"
    if not on_gpu and arch is None:
        raise ValueError("without CUDA, bench gpu is a dry run: pass arch=(major, minor) and cuda='12.9', with "
                         "torch's scaled matmuls replaced by a stand-in (tests/scaled_mm_standin.py)")
    target = f"{torch.cuda.get_device_name(dev)} (sm_{''.join(map(str, torch.cuda.get_device_capability(dev)))})" \
        if on_gpu else f"CPU dry run acting as sm_{arch[0]}{arch[1]}, CUDA {cuda}"
    print(f"fp8lab bench gpu on {target}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    check = _Check(dev, GemmBackend("auto", arch, cuda, probe=on_gpu, verbose=False),
                   shapes or (((1024, 2048, 1536), (200, 328, 72)) if on_gpu else ((128, 384, 256), (200, 328, 72))),
                   [*RECIPES, *VARIANTS])
    tables = {"backends": _backend_table(check), "real_vs_emulated": _real_vs_emulated(check),
              "train": _training_steps(check, train_steps or (20 if on_gpu else 3)),
              "accumulation": _accumulation(check, ks or ((1024, 4096, 16384) if on_gpu else (256, 1024))),
              "speed": _speed(check, size, calls, samples)}
    print(f"\nbench gpu: {len(check.failures)} failure(s)")
    for f in check.failures:
        print(f"  FAIL {f}")
    return {"tables": tables, "failures": check.failures}


def _backend_table(check: _Check) -> list[dict]:
    """(a) per recipe and GEMM, which backend runs it and why (probing each kernel family once)."""
    rows = []
    for name in check.names:
        for gemm, pair in layer_gemms(*check.operands(check.shapes[0], 0), name).items():
            if pair is None:
                rows.append({"recipe": name, "gemm": gemm, "backend": "high precision", "reason": "by the recipe"})
                continue
            choice = check.backend.choose(*pair)
            check.real_gemms[(name, gemm)] = choice.backend == "scaled_mm"
            rows.append({"recipe": name, "gemm": gemm, "backend": choice.backend, "reason": choice.reason})
            if "probe" in choice.reason:
                check.failures.append(f"(a) {name} {gemm}: {choice.reason}")
    print_table("(a) which backend runs each GEMM (probes included)", rows)
    return rows


def _real_vs_emulated(check: _Check) -> list[dict]:
    """(b) every GEMM of every recipe the GPU runs real, against the exact emulation."""
    rows = []
    for shape in check.shapes:
        for name in check.names:
            for gemm, pair in layer_gemms(*check.operands(shape, 1), name).items():
                if pair is None or not check.real_gemms.get((name, gemm)):
                    continue
                plan = check.backend.choose(*pair).plan
                where = {"shape": "x".join(map(str, shape)), "recipe": name, "gemm": gemm, "kernel": plan.kind}
                try:
                    out = prepare_real_mm(*pair, plan, check.dev).result()
                except Exception as exc:
                    check.failures.append(f"(b) {name} {gemm} {shape}: {type(exc).__name__}: "
                                          f"{str(exc).splitlines()[0]}")
                    rows.append({**where, "ok": "ERROR", "worst / allowed": "-", "bit-identical": "-"})
                    continue
                ok, worst = agrees_with_emulation(out, *pair, plan.out_dtype)
                same = (out.cpu() == emulated_mm(pair[0].to("cpu"), pair[1].to("cpu")).to(out.dtype)).double()
                rows.append({**where, "out": str(plan.out_dtype).replace("torch.", ""), "ok": "ok" if ok else "FAIL",
                             "worst / allowed": worst, "bit-identical": same.mean().item()})
                if not ok:
                    check.failures.append(f"(b) {name} {gemm} {shape}: real differs from emulated "
                                          f"({worst:.3g}x allowed)")
    print_table("(b) real vs emulated (bf16: 1 ulp of the emulation rounded to bf16; fp32: 2^-12 |a|@|b|)", rows)
    return rows


def _training_steps(check: _Check, steps: int) -> list[dict]:
    """(c) FP8Linear training steps per recipe: no fallback, and every GEMM the table calls real runs real."""
    rows, task = [], TeacherTask()
    for name in check.names:
        model = make_model("mlp", 0, **({} if check.on_gpu else {"hidden": 256})).to(check.dev)  # dry run: smaller
        run_backend = check.backend.fresh()
        model = convert(model, name, backend=run_backend)
        opt = torch.optim.Adam(model.parameters(), lr=LESSON.lr)
        g = torch.Generator().manual_seed(1_000)
        losses = []
        for _ in range(steps):
            x, y = task.batch(g, LESSON.batch if check.on_gpu else 32)
            losses.append(train_step(model, opt, task.loss, x.to(check.dev), y.to(check.dev)))
        calls = {k: sum(r["calls"] for r in run_backend.report() if r["backend"] == k)
                 for k in ("scaled_mm", "emulated", "fallback")}
        expected_real = all(check.real_gemms.get((name, gm), True) for gm in ("fprop", "dgrad", "wgrad")
                            if (name, gm) in check.real_gemms)
        rows.append({"recipe": name, "steps": steps, "final loss": losses[-1], **calls})
        if calls["fallback"]:
            check.failures.append(f"(c) {name}: {calls['fallback']} GEMMs fell back to emulation")
        if expected_real and calls["emulated"]:
            check.failures.append(f"(c) {name}: {calls['emulated']} GEMMs emulated where the table says real")
    print_table(f"(c) toy MLP, {steps} FP8Linear training steps per recipe: GEMM calls per backend", rows)
    return rows


def _accumulation(check: _Check, ks: tuple[int, ...]) -> list[dict]:
    """(d) the accumulation model against the hardware's accumulation (use_fast_accum True and False)."""
    rows = []
    tw = quantize_operands(torch.randn(32, 256).to(check.dev), torch.randn(256, 32).to(check.dev), "tensorwise")
    tw_real = check.backend.choose(*tw).plan
    for k in ks:
        row = {"K": k,
               "model 14-bit, no promotion": accumulation_error(k, AccumulatorModel(promote_every=None), size=64),
               "model 14-bit, promote 128": accumulation_error(k, AccumulatorModel(), size=64),
               "emulated fp32": accumulation_error(k, None, size=64)}
        if tw_real is not None:
            for fast in (True, False):
                def gemm(aq, bq, fast=fast):
                    return prepare_real_mm(aq.to(check.dev), bq.to(check.dev), tw_real, check.dev,
                                           use_fast_accum=fast).result()
                row[f"real use_fast_accum={fast}"] = accumulation_error(k, size=64, gemm=gemm)
        rows.append(row)
    print_table("(d) accumulation: relative error against the exact product of the FP8 operands "
                "(uniform [0, 1) inputs, tensorwise)", rows)
    return rows


def _speed(check: _Check, n: int, calls: int, samples: int, pool: int = 3) -> list[dict]:
    """(e) bf16 torch.mm, the exact kernel call fp8lab makes replayed, and the full path with quantization."""
    if not check.on_gpu:
        print("\n(e) speed: needs CUDA (not measured in the dry run)")
        return []
    dev, flops, rows = check.dev, 2 * n**3, []
    xs = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(pool)]
    ws = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(pool)]
    turn = [0]

    def rotate() -> int:
        turn[0] = (turn[0] + 1) % pool
        return turn[0]

    bf16_ms = _cuda_sample_ms(lambda: xs[rotate()] @ ws[turn[0]].t(), calls, samples)
    rows.append({"what": f"bf16 torch.mm {n}^3", "kernel": "-", "median ms": bf16_ms,
                 "TFLOP/s": flops / bf16_ms / 1e9, "x bf16": 1.0})
    for name in ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"):
        ops = [quantize_operands(xs[i].float(), ws[i].float().t(), name) for i in range(pool)]
        choice = check.backend.choose(*ops[0])
        if choice.plan is None:
            rows.append({"what": name, "kernel": "-", "median ms": "-", "TFLOP/s": "-", "x bf16": choice.reason})
            continue
        prepared = [prepare_real_mm(*ops[i], choice.plan, dev) for i in range(pool)]
        ms = _cuda_sample_ms(lambda prepared=prepared: prepared[rotate()].run(), calls, samples)
        rows.append({"what": f"{name}: the kernel call", "kernel": choice.plan.kind, "median ms": ms,
                     "TFLOP/s": flops / ms / 1e9, "x bf16": bf16_ms / ms})

        def full(name=name, plan=choice.plan):
            i = rotate()
            a_q, b_q = quantize_operands(xs[i].float(), ws[i].float().t(), name)
            return prepare_real_mm(a_q, b_q, plan, dev).result()

        ms = _cuda_sample_ms(full, max(2, calls // 4), samples)
        rows.append({"what": f"{name}: quantize + prepare + call", "kernel": choice.plan.kind, "median ms": ms,
                     "TFLOP/s": flops / ms / 1e9, "x bf16": bf16_ms / ms})
    print_table(f"(e) GEMM speed at {n}^3: {calls} calls back to back between CUDA events, median of {samples}, "
                f"{pool} rotating inputs", rows)
    return rows
