"""The project's own benchmarks: `python -m fp8lab bench quantize|gemm|gpu|train|widgets|lessons|inspect|all`.

Public: run(name, ...) and one function per benchmark, each returning rows (dicts) and
printing a table. Candidates are timed in interleaved rounds on the same inputs, so a
noisy, shared machine slows all of them alike; the tables report medians and ratios from
one run. Timed unit tests are never used for speed.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from fp8lab import kernels
from fp8lab.timing import machine_line, time_interleaved
from fp8lab.timing import print_table as timing_table

__all__ = ["bench_gemm", "bench_gpu", "bench_inspect", "bench_quantize", "bench_train", "bench_widgets", "main",
           "print_table"]


def print_table(title: str, rows: list[dict], note: str = "") -> None:
    """timing.print_table with the machine line under the title (date, CPU, GPU, torch, kernels)."""
    timing_table(title, rows, "\n".join(filter(None, (machine_line(), note))))


# ---- quantize -------------------------------------------------------------------------------------------


def bench_quantize(size: int = 4096, rounds: int = 20) -> list[dict]:
    """fp8lab's quantization of a size x size float32 tensor beside torchao's MX and a copy."""
    from fp8lab.formats import E4M3, E8M0
    from fp8lab.quantize import quantize
    from fp8lab.scaling import PerBlock, PerTensor

    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=g)
    dst = torch.empty_like(x)
    cands: dict[str, Callable[[], object]] = {
        "copy: x.clone() (allocates)": lambda: x.clone(),
        "copy: dst.copy_(x) (preallocated)": lambda: dst.copy_(x),
        "fp8lab per-tensor E4M3": lambda: quantize(x, E4M3, PerTensor()),
        "fp8lab 1x128 E4M3": lambda: quantize(x, E4M3, PerBlock(1, 128)),
        "fp8lab 128x128 E4M3": lambda: quantize(x, E4M3, PerBlock(128, 128)),
        "fp8lab 1x32 E4M3 + E8M0 (rceil)": lambda: quantize(x, E4M3, PerBlock(1, 32), "rceil", scale_fmt=E8M0),
    }
    try:
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import MXTensor

        cands["torchao MXTensor.to_mx 1x32 (floor)"] = lambda: MXTensor.to_mx(x, torch.float8_e4m3fn, 32)
        cands["torchao MXTensor.to_mx 1x32 (rceil)"] = lambda: MXTensor.to_mx(
            x, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
    except ImportError:
        print("torchao not installed: its column is missing (pip install torchao==0.18.0)")
    times = time_interleaved(cands, rounds=rounds)
    # the floor: read 4 bytes and write 1 per element, at the bandwidth a copy reaches (a copy
    # reads 4 and writes 4): into fresh memory (x.clone(), which page-faults every page it
    # writes) and into memory already mapped (dst.copy_(x)); quantize's outputs are fresh
    # tensors, which glibc serves from reused pages up to 32 MiB (kernels.keep_freed_memory)
    floor = statistics.median(times["copy: x.clone() (allocates)"]) * 5 / 8
    floor_mapped = statistics.median(times["copy: dst.copy_(x) (preallocated)"]) * 5 / 8
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"what": name, "median ms": med * 1e3, "x floor": med / floor,
                     "x floor (mapped)": med / floor_mapped, "GB/s (4 B in)": size * size * 4 / med / 1e9})
    print_table(f"quantize {size}x{size} float32 (median of {rounds}, interleaved)", rows,
                f"floor = 5/8 of x.clone() = {floor * 1e3:.1f} ms; floor (mapped) = 5/8 of dst.copy_(x) = "
                f"{floor_mapped * 1e3:.1f} ms (read 4 B, write 1 B per element)")
    return rows


# ---- gemm -------------------------------------------------------------------------------------------------


QUANTIZE_INCLUDED = ("tensorwise", "blockwise", "mxfp8")  # bench_gemm's rows with the quantization timed too


def bench_gemm(size: int = 2048, rounds: int = 7, recipes: tuple[str, ...] = ("tensorwise", "rowwise", "blockwise",
                                                                             "mxfp8", "nvfp4")) -> list[dict]:
    """fp32 and bf16 torch.mm beside fp8lab's emulated GEMM at size^3, and one shape not tuned for.

    Rows: the fast emulation and the reference on operands quantized beforehand; and the call a
    learner makes, fp8lab.matmul(a[M, K], b, recipe) with its quantization, for b given naturally
    (b[K, N], row-major) and as a transposed view of w[N, K] (b = w.t()), for the recipes in
    QUANTIZE_INCLUDED, at size^3 and at (3/4, 3/2, 3/8) * size (1536x3072x768 for 2048). The
    bf16 torch.mm is timed once (one call, no warm-up: a CPU without bf16 units takes over a
    minute for it at 2048^3), or a median of `rounds` where one call takes under 0.5 s."""
    from fp8lab.gemm import emulated_mm, matmul, quantize_operands
    from fp8lab.timing import timed

    g = torch.Generator().manual_seed(0)
    shapes = [(size, size, size), (3 * size // 4, 3 * size // 2, 3 * size // 8)]  # (M, K, N)
    cands: dict[tuple[str, str], Callable[[], object]] = {}
    operands = {}
    for m, k, n in shapes:
        shape = f"{m}x{k}x{n}"
        a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
        b = w.t().contiguous()  # b[K, N] row-major: the natural layout
        operands[shape] = (a, b)
        cands[shape, "torch.mm fp32"] = lambda a=a, b=b: a @ b
        if shape == f"{size}x{size}x{size}":
            for r in recipes:
                aq, bq = quantize_operands(a, b, r)
                cands[shape, f"fp8lab {r} fast"] = lambda aq=aq, bq=bq: emulated_mm(aq, bq, emulation="fast")
                if r in ("tensorwise", "blockwise"):
                    cands[shape, f"fp8lab {r} reference"] = lambda aq=aq, bq=bq: emulated_mm(aq, bq,
                                                                                             emulation="reference")
        for r in (r for r in recipes if r in QUANTIZE_INCLUDED):
            cands[shape, f"fp8lab {r} matmul(a, b[K,N]) + quantize"] = lambda a=a, b=b, r=r: matmul(
                a, b, r, verbose=False)
            cands[shape, f"fp8lab {r} matmul(a, w.t()) + quantize"] = lambda a=a, w=w, r=r: matmul(
                a, w.t(), r, verbose=False)
    times = time_interleaved(cands, rounds=rounds, warmup=1)
    a, b = operands[f"{size}x{size}x{size}"]
    ab, bb = a.bfloat16(), b.bfloat16()
    bf16 = timed(lambda: ab @ bb, repeats=1, warmup=0)
    bf16_note = "timed once (one call, no warm-up)"
    if bf16[0] < 0.5:
        bf16 = timed(lambda: ab @ bb, repeats=rounds, warmup=1)
        bf16_note = f"median of {rounds}, after the others"
    times[f"{size}x{size}x{size}", "torch.mm bf16 (bf16 output)"] = bf16
    rows = []
    for m, k, n in shapes:
        shape = f"{m}x{k}x{n}"
        base = statistics.median(times[shape, "torch.mm fp32"])
        for (where, name), ts in times.items():
            if where == shape:
                med = statistics.median(ts)
                rows.append({"what": name, "M x K x N": shape, "median ms": med * 1e3, "x fp32 mm": med / base,
                             "GFLOP/s": 2 * m * k * n / med / 1e9})
    print_table(f"GEMM {size}^3 and {shapes[1][0]}x{shapes[1][1]}x{shapes[1][2]} on the CPU (median of {rounds}, "
                "interleaved; 'fast' and 'reference': operands quantized beforehand; '+ quantize': the whole call)",
                rows, f"torch.mm bf16: {bf16_note}; b[K,N]: b row-major; w.t(): a transposed view of w[N, K]")
    return rows


# ---- fp8lab.inspect -----------------------------------------------------------------------------------


def bench_inspect(size: int | None = None, rounds: int | None = None) -> list[dict]:
    """Seconds for inspect() on models of 100+ linears (`python -m fp8lab bench inspect`).

    The models: 25 blocks of 4 linears (q/k/v-style fused in, out, MLP up and down) of width
    `size` (default 64 and 128), 64 tokens, the five DEFAULT_RECIPES; median of `rounds`."""
    import time

    from torch import nn

    from fp8lab.readiness import inspect

    widths = (size,) if size else (64, 128)
    rounds = rounds or 5
    rows = []
    for d in widths:
        blocks = [nn.Sequential(nn.Linear(d, 3 * d), nn.Linear(3 * d, d), nn.Linear(d, 4 * d), nn.GELU(),
                                nn.Linear(4 * d, d)) for _ in range(25)]
        model = nn.Sequential(*blocks)
        x = torch.randn(64, d, generator=torch.Generator().manual_seed(0))
        times = []
        report = inspect(model, x)  # warm-up
        for _ in range(rounds):
            t0 = time.perf_counter()
            report = inspect(model, x)
            times.append(time.perf_counter() - t0)
        rows.append({"model": f"{len(report.layers)} linears, width {d}", "tokens": 64,
                     "recipes": len(report.recipes), "rows": len(report.frame),
                     "median s": statistics.median(times), "max s": max(times)})
    print_table(f"fp8lab.inspect on 100-linear models (median of {rounds})", rows)
    return rows


# ---- training -----------------------------------------------------------------------------------------


def bench_train(size: int | None = None, rounds: int | None = None, consecutive: int = 4) -> list[dict]:
    """Step time of the toy MLP and transformer: fp32, bf16, fp8lab emulated, torchao emulate."""
    from fp8lab.nn import Monitor, convert
    from fp8lab.train import BASELINES, LESSON, MarkovTask, TeacherTask, make_model, train_step

    rounds = rounds or 20
    rows = []
    # the lab's two models, and the transformer at half its width (more emulation overhead)
    for kind, label_kind, kw in (("mlp", "mlp", {}), ("transformer", "transformer", {}),
                                 ("transformer", "transformer d=64", {"d": 64})):
        task = TeacherTask() if kind == "mlp" else MarkovTask()
        g = torch.Generator().manual_seed(0)
        x, y = task.batch(g, LESSON.batch if kind == "mlp" else 32)
        cands = {}
        for label in ("fp32", "bf16", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4",
                      "tensorwise + monitor every step", "tensorwise (torchao)"):
            base = make_model(kind, 0, **kw)
            autocast = label == "bf16"
            if label in BASELINES:
                model = base
            elif label.endswith("(torchao)"):
                try:
                    model = convert(base, "tensorwise", engine="torchao")
                except ImportError:
                    continue
            elif label.endswith("monitor every step"):
                model = convert(base, "tensorwise", monitor=Monitor(1))
            else:
                model = convert(base, label)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def steps(model=model, opt=opt, autocast=autocast, task=task, x=x, y=y):
                for _ in range(consecutive):
                    train_step(model, opt, task.loss, x, y, autocast)

            cands[label] = steps
        # each sample is a few consecutive steps, as in a training loop (caches warm with this
        # model's tensors); the candidates take turns, so machine noise hits all of them alike
        times = time_interleaved(cands, rounds=rounds, warmup=2)
        base_t = statistics.median(times["fp32"])
        for label, ts in times.items():
            median = statistics.median(ts)
            rows.append({"model": label_kind, "what": label, "median ms/step": median / consecutive * 1e3,
                         "x fp32": median / base_t})
    print_table(f"training step time, Adam, MLP batch {LESSON.batch} / transformer batch 32 (median of {rounds} "
                f"samples of {consecutive} consecutive steps, candidates interleaved)", rows)
    return rows


# ---- the device check -------------------------------------------------------------------------------------


# ---- widgets ------------------------------------------------------------------------------------------------

# what a live panel must meet per value change (issue 17): continuous while a slider is dragged
LIVE_MEDIAN_MS, LIVE_P95_MS = 50.0, 100.0


def bench_widgets(rounds: int | None = None, panels: tuple[str, ...] | None = None) -> list[dict]:
    """Time from a control's new value to a finished redraw (compute, draw, Agg render, PNG
    encode), per panel: every value of every control, each control swept from the panel's
    default state, `rounds` times (default 2, each on a new panel: nothing kept from the round
    before), after `fp8lab.setup()` as in the notebooks.
    Live panels (their sliders redraw while dragged) are held to median <= 50 ms and
    p95 <= 100 ms per change; p95 is the value 95% of the updates stay under (nearest rank)."""
    import math
    import time

    import fp8lab
    from fp8lab.widgets import PANELS, sweep_values

    fp8lab.setup(quiet=True)  # as the first cell of every notebook does
    rows = []
    unknown = set(panels or ()) - set(PANELS)
    if unknown:
        raise ValueError(f"unknown panels {sorted(unknown)}; valid: {', '.join(PANELS)}")
    for name, make in PANELS.items():
        if panels and name not in panels:
            continue
        times = []
        for _ in range(rounds or 2):
            # a new panel each round: what a panel keeps (curves computed, a background drawn) is
            # measured as a learner meets it, once per value, not as a second pass would find it
            panel = make()
            panel.refresh()
            sweeps = sweep_values(panel)
            defaults = panel.values()
            for control, values in sweeps.items():
                panel.update(**defaults)  # each control from the default state, as the tests sweep
                for value in values:
                    t0 = time.perf_counter()
                    panel.update(**{control: value})
                    times.append(time.perf_counter() - t0)
        times.sort()
        median = statistics.median(times) * 1e3
        p95 = times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)] * 1e3
        live = panel.live_sliders
        target = ("met" if median <= LIVE_MEDIAN_MS and p95 <= LIVE_P95_MS else "missed") if live else "-"
        rows.append({"panel": name, "live": "yes" if live else "no (release/button)", "updates": len(times),
                     "median ms": median, "p95 ms": p95, "max ms": times[-1] * 1e3, "live target": target})
    print_table("widget update -> finished redraw (PNG, Agg), every value of every control", rows,
                f"live target: median <= {LIVE_MEDIAN_MS:g} ms and p95 <= {LIVE_P95_MS:g} ms per change")
    return rows


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
    from fp8lab.gemm import (
        AccumulatorModel,
        GemmBackend,
        accumulation_error,
        agrees_with_emulation,
        emulated_mm,
        prepare_real_mm,
        quantize_operands,
    )
    from fp8lab.nn import convert, layer_gemms
    from fp8lab.recipes import RECIPES, VARIANTS
    from fp8lab.train import LESSON, TeacherTask, make_model, train_step

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = dev.type == "cuda"
    if not on_gpu and arch is None:
        raise ValueError("without CUDA, bench gpu is a dry run: pass arch=(major, minor) and cuda='12.9', with "
                         "torch's scaled matmuls replaced by a stand-in (tests/scaled_mm_standin.py)")
    backend = GemmBackend("auto", arch, cuda, probe=on_gpu, verbose=False)
    target = f"{torch.cuda.get_device_name(dev)} (sm_{''.join(map(str, torch.cuda.get_device_capability(dev)))})" \
        if on_gpu else f"CPU dry run acting as sm_{arch[0]}{arch[1]}, CUDA {cuda}"
    print(f"fp8lab bench gpu on {target}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    shapes = shapes or (((1024, 2048, 1536), (200, 328, 72)) if on_gpu else ((128, 384, 256), (200, 328, 72)))
    names = [*RECIPES, *VARIANTS]
    failures: list[str] = []
    tables: dict[str, list[dict]] = {}

    def operands(shape, seed):
        m, k, n = shape
        g = torch.Generator().manual_seed(seed)
        x, w, dy = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) * 3, torch.randn(m, n, generator=g)
        return x.to(dev), w.to(dev), dy.to(dev)

    # (a) the table, probes included
    rows, real_gemms = [], {}
    for name in names:
        for gemm, pair in layer_gemms(*operands(shapes[0], 0), name).items():
            if pair is None:
                rows.append({"recipe": name, "gemm": gemm, "backend": "high precision", "reason": "by the recipe"})
                continue
            choice = backend.choose(*pair)
            real_gemms[(name, gemm)] = choice.backend == "scaled_mm"
            rows.append({"recipe": name, "gemm": gemm, "backend": choice.backend, "reason": choice.reason})
            if "probe" in choice.reason:
                failures.append(f"(a) {name} {gemm}: {choice.reason}")
    print_table("(a) which backend runs each GEMM (probes included)", rows)
    tables["backends"] = rows

    # (b) real vs emulated, every GEMM of every recipe the GPU runs real
    rows = []
    for shape in shapes:
        for name in names:
            for gemm, pair in layer_gemms(*operands(shape, 1), name).items():
                if pair is None or not real_gemms.get((name, gemm)):
                    continue
                plan = backend.choose(*pair).plan
                try:
                    out = prepare_real_mm(*pair, plan, dev).result()
                except Exception as exc:
                    failures.append(f"(b) {name} {gemm} {shape}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                    rows.append({"shape": "x".join(map(str, shape)), "recipe": name, "gemm": gemm,
                                 "kernel": plan.kind, "ok": "ERROR", "worst / allowed": "-", "bit-identical": "-"})
                    continue
                ok, worst = agrees_with_emulation(out, *pair, plan.out_dtype)
                a_cpu, b_cpu = pair[0].to("cpu"), pair[1].to("cpu")
                same = (out.cpu() == emulated_mm(a_cpu, b_cpu).to(out.dtype)).double().mean().item()
                rows.append({"shape": "x".join(map(str, shape)), "recipe": name, "gemm": gemm, "kernel": plan.kind,
                             "out": str(plan.out_dtype).replace("torch.", ""), "ok": "ok" if ok else "FAIL",
                             "worst / allowed": worst, "bit-identical": same})
                if not ok:
                    failures.append(f"(b) {name} {gemm} {shape}: real differs from emulated ({worst:.3g}x allowed)")
    print_table("(b) real vs emulated (bf16: 1 ulp of the emulation rounded to bf16; fp32: 2^-12 |a|@|b|)", rows)
    tables["real_vs_emulated"] = rows

    # (c) training steps: no fallback, every GEMM the table calls real runs real
    rows = []
    steps = train_steps or (20 if on_gpu else 3)
    task = TeacherTask()
    for name in names:
        model = make_model("mlp", 0, **({} if on_gpu else {"hidden": 256})).to(dev)  # the dry run: smaller
        run_backend = backend.fresh()
        model = convert(model, name, backend=run_backend)
        opt = torch.optim.Adam(model.parameters(), lr=LESSON.lr)
        g = torch.Generator().manual_seed(1_000)
        losses = []
        for _ in range(steps):
            x, y = task.batch(g, LESSON.batch if on_gpu else 32)
            losses.append(train_step(model, opt, task.loss, x.to(dev), y.to(dev)))
        calls = {k: sum(r["calls"] for r in run_backend.report() if r["backend"] == k)
                 for k in ("scaled_mm", "emulated", "fallback")}
        expected_real = all(real_gemms.get((name, gm), True) for gm in ("fprop", "dgrad", "wgrad")
                            if (name, gm) in real_gemms)
        rows.append({"recipe": name, "steps": steps, "final loss": losses[-1], **calls})
        if calls["fallback"]:
            failures.append(f"(c) {name}: {calls['fallback']} GEMMs fell back to emulation")
        if expected_real and calls["emulated"]:
            failures.append(f"(c) {name}: {calls['emulated']} GEMMs emulated where the table says real")
    print_table(f"(c) toy MLP, {steps} FP8Linear training steps per recipe: GEMM calls per backend", rows)
    tables["train"] = rows

    # (d) the accumulation model against the hardware's accumulation
    rows = []
    tw = quantize_operands(torch.randn(32, 256).to(dev), torch.randn(256, 32).to(dev), "tensorwise")
    tw_real = backend.choose(*tw).plan
    for k in ks or ((1024, 4096, 16384) if on_gpu else (256, 1024)):
        row = {"K": k,
               "model 14-bit, no promotion": accumulation_error(k, AccumulatorModel(promote_every=None), size=64),
               "model 14-bit, promote 128": accumulation_error(k, AccumulatorModel(), size=64),
               "emulated fp32": accumulation_error(k, None, size=64)}
        if tw_real is not None:
            for fast in (True, False):
                def gemm(aq, bq, fast=fast):
                    return prepare_real_mm(aq.to(dev), bq.to(dev), tw_real, dev, use_fast_accum=fast).result()
                row[f"real use_fast_accum={fast}"] = accumulation_error(k, size=64, gemm=gemm)
        rows.append(row)
    print_table("(d) accumulation: relative error against the exact product of the FP8 operands "
                "(uniform [0, 1) inputs, tensorwise)", rows)
    tables["accumulation"] = rows

    # (e) speed
    rows = []
    if on_gpu:
        n, pool = size, 3
        flops = 2 * n**3
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
            choice = backend.choose(*ops[0])
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
    else:
        print("\n(e) speed: needs CUDA (not measured in the dry run)")
    tables["speed"] = rows

    print(f"\nbench gpu: {len(failures)} failure(s)")
    for f in failures:
        print(f"  FAIL {f}")
    return {"tables": tables, "failures": failures}


BENCHES = ("quantize", "gemm", "gpu", "train", "widgets", "lessons", "inspect", "all")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fp8lab bench", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=BENCHES)
    p.add_argument("--size", type=int, default=None, help="matrix size (defaults per benchmark)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per candidate")
    p.add_argument("--device", default=None, help="for 'gpu': cuda (default when present) or cpu (dry run)")
    args = p.parse_args(argv)
    kernels.keep_freed_memory()  # as fp8lab.setup() does in the notebooks
    names = ("quantize", "gemm", "train", "widgets") if args.name == "all" else (args.name,)
    status = 0
    for name in names:
        kw = {k: v for k, v in {"size": args.size, "rounds": args.rounds}.items() if v is not None}
        if name == "quantize":
            bench_quantize(**kw)
        elif name == "gemm":
            bench_gemm(**kw)
        elif name == "gpu":
            gkw = {"device": args.device}
            if args.size:
                gkw["size"] = args.size
            if args.rounds:
                gkw["calls"] = args.rounds
            if bench_gpu(**gkw)["failures"]:
                status = 1
        elif name == "train":
            bench_train(**kw)
        elif name == "widgets":
            bench_widgets(rounds=args.rounds)
        elif name == "inspect":
            bench_inspect(**kw)
        elif name == "lessons":
            from fp8lab.train import lesson_table

            print(f"\nnotebook 06's lessons: final loss (mean of the last 10 steps, 3 seeds)\n{machine_line()}")
            lesson_table()
    return status
