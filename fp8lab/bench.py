"""The project's own benchmarks: `python -m fp8lab bench quantize|gemm|gpu|train|widgets|lessons|inspect|all`.

Public: run(name, ...) and one function per benchmark, each returning rows (dicts) and
printing a table. Candidates are timed in interleaved rounds on the same inputs, so a
noisy, shared machine slows all of them alike; the tables report medians and ratios from
one run. Timed unit tests are never used for speed.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from collections.abc import Callable

import torch

from fp8lab import kernels
from fp8lab.doctor import cpu_name
from fp8lab.timing import time_interleaved

__all__ = ["bench_gemm", "bench_gpu", "bench_quantize", "main", "print_table"]


def machine_line() -> str:
    cpu = cpu_name()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    fused = "fused CPU kernels on" if kernels.status()[0] else "fused CPU kernels off"
    return (f"{datetime.date.today().isoformat()}, {cpu}, {torch.get_num_threads()} threads, {gpu}, "
            f"torch {torch.__version__}, {fused}")


def print_table(title: str, rows: list[dict], note: str = "") -> None:
    print(f"\n{title}\n{machine_line()}")
    if note:
        print(note)
    if not rows:
        return
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in cols}
    print("| " + " | ".join(c.ljust(widths[c]) for c in cols) + " |")
    print("|" + "|".join("-" * (widths[c] + 2) for c in cols) + "|")
    for r in rows:
        print("| " + " | ".join(_fmt(r[c]).ljust(widths[c]) for c in cols) + " |")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


# ---- quantize -------------------------------------------------------------------------------------------


def bench_quantize(size: int = 4096, rounds: int = 20) -> list[dict]:
    """fp8lab's quantization of a size x size float32 tensor beside torchao's MX and a copy."""
    from fp8lab import E4M3, E8M0, PerBlock, PerTensor, quantize

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


def bench_gemm(size: int = 2048, rounds: int = 7, recipes: tuple[str, ...] = ("tensorwise", "rowwise", "blockwise",
                                                                             "mxfp8", "nvfp4")) -> list[dict]:
    """fp32 and bf16 torch.mm beside fp8lab's emulated GEMM (reference and fast) at size^3."""
    from fp8lab.gemm import bf16_fast_path, emulated_mm, quantize_operands

    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g)
    b = torch.randn(size, size, generator=g)
    ab, bb = a.bfloat16(), b.bfloat16()
    cands: dict[str, Callable[[], object]] = {
        "torch.mm fp32": lambda: a @ b,
        "torch.mm bf16 (bf16 output)": lambda: ab @ bb,
    }
    ops = {r: quantize_operands(a, b, r) for r in recipes}
    for r in recipes:
        aq, bq = ops[r]
        cands[f"fp8lab {r} fast"] = lambda aq=aq, bq=bq: emulated_mm(aq, bq, emulation="fast")
        if r in ("tensorwise", "blockwise"):
            cands[f"fp8lab {r} reference"] = lambda aq=aq, bq=bq: emulated_mm(aq, bq, emulation="reference")
    cands["fp8lab tensorwise fast + quantize"] = lambda: emulated_mm(*quantize_operands(a, b, "tensorwise"))
    times = time_interleaved(cands, rounds=rounds, warmup=1)
    base = statistics.median(times["torch.mm fp32"])
    flops = 2 * size**3
    rows = [{"what": name, "median ms": statistics.median(ts) * 1e3,
             "x fp32 mm": statistics.median(ts) / base, "GFLOP/s": flops / statistics.median(ts) / 1e9}
            for name, ts in times.items()]
    print_table(f"GEMM {size}^3 on the CPU (median of {rounds}, interleaved; operands quantized beforehand)", rows,
                f"fast path: {bf16_fast_path()[1]}")
    return rows


# ---- the device check -------------------------------------------------------------------------------------


def _cuda_median_ms(fn: Callable[[], object], reps: int, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_gpu(size: int = 8192, reps: int = 20, device: str | None = None, check_size: int = 1024,
              train_steps: int = 200) -> dict[str, list[dict]]:
    """The one prepared device check (issue 3): run on a GPU in well under 5 minutes.

    (a) every real kernel the device supports against the emulation, fresh random inputs;
    (b) the accumulation model against use_fast_accum=True and False;
    (c) bf16 vs FP8 tensorwise / rowwise / blockwise at size^3 with CUDA events (median of
        `reps` after warm-up, inputs rotated so that no run reuses the last one's cache);
    (d) the toy MLP trained real vs emulated: the largest loss difference.
    Without CUDA (device='cpu') it runs the same code on small sizes with the emulation, so
    that the script is tested where no GPU is; torchao is not needed.
    """
    from fp8lab.gemm import (
        AccumulatorModel,
        _real_mm,
        accumulation_error,
        emulated_mm,
        quantize_operands,
        resolve_backend,
    )
    from fp8lab.recipes import RECIPES

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = dev.type == "cuda"
    print(f"fp8lab bench gpu on {torch.cuda.get_device_name(dev) if on_gpu else 'CPU (dry run)'}")
    out: dict[str, list[dict]] = {}

    # (a) real vs emulated
    rows = []
    for name, recipe in RECIPES.items():
        choice = resolve_backend(recipe, dev)
        row = {"recipe": name, "backend": choice.backend, "reason": choice.reason, "max rel diff": "-"}
        if choice.backend == "scaled_mm":
            worst = 0.0
            for seed in range(3):
                g = torch.Generator().manual_seed(100 + seed)
                a = torch.randn(check_size, check_size, generator=g)
                b = torch.randn(check_size, check_size // 2, generator=g)
                aq, bq = quantize_operands(a, b, recipe)
                real = _real_mm(aq, bq, recipe, dev).float().cpu()
                emu = emulated_mm(aq, bq, emulation="reference")
                worst = max(worst, ((real - emu).abs().max() / emu.abs().max()).item())
            row["max rel diff"] = worst
        rows.append(row)
    print_table("(a) real kernels vs emulation (max |real - emulated| / max |emulated|; bf16 outputs round at 2^-9)",
                rows)
    out["real_vs_emulated"] = rows

    # (b) the accumulation model vs the hardware's fast and exact accumulation
    rows = []
    for k in (1024, 4096, 16384) if on_gpu else (256, 1024):
        row = {"K": k,
               "model 14-bit, no promotion": accumulation_error(k, AccumulatorModel(promote_every=None), size=64),
               "model 14-bit, promote 128": accumulation_error(k, AccumulatorModel(), size=64),
               "emulated fp32": accumulation_error(k, None, size=64)}
        if on_gpu and resolve_backend("tensorwise", dev).backend == "scaled_mm":
            for fast in (True, False):
                row[f"real use_fast_accum={fast}"] = accumulation_error(
                    k, size=64, gemm=lambda aq, bq, fast=fast: _real_mm(aq, bq, RECIPES["tensorwise"], dev, fast))
        rows.append(row)
    print_table("(b) accumulation: relative error vs the exact product of the FP8 operands (uniform [0, 1) inputs)",
                rows)
    out["accumulation"] = rows

    # (c) speed
    rows = []
    if on_gpu:
        n = size
        flops = 2 * n**3
        pool = 3  # rotate inputs
        xs = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(pool)]
        ws = [torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(pool)]
        it = {"i": 0}

        def nxt():
            it["i"] = (it["i"] + 1) % pool
            return it["i"]

        bf16_ms = _cuda_median_ms(lambda: xs[nxt()] @ ws[it["i"]].t(), reps)
        rows.append({"GEMM": f"bf16 {n}^3", "median ms": bf16_ms, "TFLOP/s": flops / bf16_ms / 1e9, "x bf16": 1.0})
        for name in ("tensorwise", "rowwise", "blockwise"):
            recipe = RECIPES[name]
            choice = resolve_backend(recipe, dev)
            if choice.backend != "scaled_mm":
                rows.append({"GEMM": f"fp8 {name}", "median ms": "-", "TFLOP/s": "-", "x bf16": choice.reason})
                continue
            qs = [quantize_operands(xs[i].float(), ws[i].float().t(), recipe) for i in range(pool)]
            ms = _cuda_median_ms(lambda qs=qs, recipe=recipe: _real_mm(*qs[nxt()], recipe, dev), reps)
            rows.append({"GEMM": f"fp8 {name}", "median ms": ms, "TFLOP/s": flops / ms / 1e9, "x bf16": bf16_ms / ms})
        print_table(f"(c) GEMM speed at {n}^3, CUDA events, median of {reps} after warm-up, rotating inputs", rows)
    else:
        print("\n(c) speed: needs CUDA (skipped in the dry run)")
    out["speed"] = rows

    # (d) training: real vs emulated losses
    try:
        from fp8lab.train import compare_real_emulated
    except ImportError:
        print("\n(d) training comparison: fp8lab.train not available in this version")
    else:
        rows = compare_real_emulated(steps=train_steps if on_gpu else 5, device=dev)
        print_table("(d) toy MLP, real vs emulated FP8: largest |loss difference| over the run", rows)
        out["train"] = rows
    return out


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
    for name in names:
        kw = {k: v for k, v in {"size": args.size, "rounds": args.rounds}.items() if v is not None}
        if name == "quantize":
            bench_quantize(**kw)
        elif name == "gemm":
            bench_gemm(**kw)
        elif name == "gpu":
            gkw = {"device": args.device}
            if args.size:
                gkw.update(size=args.size, check_size=min(args.size, 1024))
            if args.rounds:
                gkw["reps"] = args.rounds
            bench_gpu(**gkw)
        elif name == "train":
            from fp8lab.train import bench_train

            bench_train(**kw)
        elif name == "widgets":
            from fp8lab.widgets import bench_widgets

            bench_widgets(**kw)
        elif name == "inspect":
            from fp8lab.readiness import bench_inspect

            bench_inspect(**kw)
        elif name == "lessons":
            from fp8lab.train import lesson_table

            print(f"\nnotebook 06's lessons: final loss (mean of the last 10 steps, 3 seeds)\n{machine_line()}")
            lesson_table()
    return 0
