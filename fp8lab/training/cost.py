"""The cost side of each recipe: scale storage, how its amax is found, scale multiplies in the GEMM,
this machine's measured times, and published GPU speed-ups with their sources.

Public: cost_table(recipes, k, m, parallel) -> DataFrame, measure(recipes, size) -> DataFrame,
per_tensor_vs_block(table, measured) -> DataFrame, answer(comparison), PUBLISHED, PARALLEL,
scale_bits_per_element, scale_multiplies. Everything except the measured times and PUBLISHED is computed from the
recipes' own scalings (fp8lab.recipes). Notebook 08 shows it (CostPanel); 05 calls it once.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.gemm import matmul, quantize_operands, resolve_backend
from fp8lab.numerics.quantize import quantize
from fp8lab.numerics.recipes import GEMMS, Recipe, TensorScaling, get_recipe
from fp8lab.timing import time_interleaved
from fp8lab.training.layers import scale_spans_tokens

__all__ = ["PARALLEL", "PUBLISHED", "Published", "answer", "cost_class", "cost_table", "measure",
           "per_tensor_vs_block", "scale_bits_per_element", "scale_multiplies"]

COST_RECIPES = ("delayed", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")


@dataclass(frozen=True)
class Published:
    """A published speed-up: what was measured, on what hardware, and where it is written."""

    value: str
    what: str
    hardware: str
    source: str


_TE = ("TransformerEngine docs, GEMM Speedups Across Precisions (speedups.rst): a 5B model's linear-layer GEMMs "
       "over BF16, 'autocast' = each GEMM with the quantization of its inputs")
_TORCHAO_FLOAT8 = "torchao float8 training docs (Llama3-8B, 8 GPUs, training throughput over BF16)"
_TORCHAO_MX = ("torchao torchao/prototype/mx_formats/README.md @ 09f13255 (torchtitan Llama3-8B, 8x B200, "
               "tokens/s over BF16)")
_DEEPGEMM = "DeepGEMM README (FP8 GEMM throughput, 1x128 / 128x128 scaling)"

# What the libraries that run these recipes on GPUs report (TransformerEngine's speedups page; the torchao
# MX table read from its README). Speed-ups are over BF16 on the same hardware. TransformerEngine's are
# "autocast" figures: the GEMMs together with the per-step quantization of their inputs, not the kernels alone.
_AUTOCAST = "GEMM + quantization (autocast)"
PUBLISHED: dict[str, tuple[Published, ...]] = {
    "delayed": (Published("1.69x", _AUTOCAST, "H200", _TE), Published("1.61x", _AUTOCAST, "B300", _TE)),
    "tensorwise": (Published("1.57x", f"{_AUTOCAST}, current scaling", "H200", _TE),
                   Published("1.41x", f"{_AUTOCAST}, current scaling", "B300", _TE),
                   Published("+25%", "training", "8x H100", _TORCHAO_FLOAT8),
                   Published("+25.4%", "training (FP8 all-gather)", "8x B200", _TORCHAO_MX)),
    "rowwise": (Published("+10%", "training", "8x H100", _TORCHAO_FLOAT8),
                Published("+4.0%", "training", "8x B200", _TORCHAO_MX)),
    "blockwise": (Published("1.41x", _AUTOCAST, "H200", _TE),
                  Published("up to 1550 TFLOPS", "FP8 GEMM", "H800", _DEEPGEMM)),
    "mxfp8": (Published("1.44x", _AUTOCAST, "B300", _TE),
              Published("+16.1% (rceil), +20.0% (floor)", "training", "8x B200", _TORCHAO_MX),
              Published("2-3x", "GEMM, common shapes", "B200", _TORCHAO_MX)),
    "nvfp4": (Published("2.03x", _AUTOCAST, "B300", _TE),),
}
PUBLISHED_NOTE = ("TransformerEngine's figures are 'autocast' ones: each GEMM with the quantization of its inputs. "
                  "With operands already quantized it reports 1.92x for FP8 on H200 (and 3.55x for NVFP4 on B300): "
                  "the rest of each recipe's gap to that is the cost of making its scales. On Blackwell, "
                  "TransformerEngine runs the 1x128 / 128x128 recipe as MXFP8.")

# Where the ranks of a parallel job must agree on an amax before casting (TransformerEngine: its amax
# reduction serves sequence-parallel tensors, FP8 weights sharded by FSDP, and, optionally, delayed scaling's
# histories).
PARALLEL = ("one process", "data parallel", "FSDP: FP8 all-gather of weights",
            "sequence parallel: FP8 all-gather of activations")


def _block(s: TensorScaling, rows: int, cols: int) -> tuple[int, int]:
    return s.granularity.block_shape((rows, cols))


def scale_bits_per_element(s: TensorScaling, rows: int, cols: int) -> float:
    """Scale memory of an operand x[rows, cols] quantized as s, in bits per element:
    scale_bits * ceil(rows/r) * ceil(cols/c) / (rows * cols) (+ 32 / (rows * cols) for a
    two-level tensor scale); scale_bits is 32 for float32 scales, 8 for E8M0 / E4M3 ones.
    Equals QuantizedTensor.scale_bits_per_element of such a quantization (tested)."""
    r, c = _block(s, rows, cols)
    bits = 32 if s.scale_fmt is None else s.scale_fmt.bits
    n = math.ceil(rows / r) * math.ceil(cols / c)
    return (bits * n + (32 if s.two_level else 0)) / (rows * cols)


def scale_multiplies(recipe: Recipe | str, k: int, gemm: str = "fprop") -> tuple[int, str]:
    """(scale multiplies per output element, where) for `gemm` of a recipe with contraction length k.

    Where both operands have one scale along the whole contraction (per tensor, per row),
    out[m, n] = (sum_k a*b) * scale_a[m] * scale_b[n]: once, in the GEMM's epilogue (1; 2 with
    NVFP4's extra tensor scale). Where either is blocked along K (width c), each K block's
    partial sum is scaled before it is added: ceil(k / c) times, inside the main loop.
    """
    recipe = get_recipe(recipe)
    widths = []
    extra = 0
    for role in GEMMS[gemm]:
        s = recipe.scaling(role, gemm)
        if s is None:
            return 0, "high precision (no FP8 GEMM)"
        _, c = _block(s, 1 << 20, k)  # rows: any large count; the width along K is what matters
        widths.append(min(c, k))
        extra = max(extra, 1 if s.two_level else 0)
    # the K segments over which both operands' scales are constant (as fp8lab.gemm's emulation cuts them)
    c = math.gcd(*widths) if min(widths) < k else k
    if c >= k:
        return 1 + extra, "once, after the sum (epilogue)"
    return math.ceil(k / c) + extra, f"once per {c}-wide K block, inside the sum"


def _amax_text(recipe: Recipe, parallel: str = "one process") -> str:
    """How `recipe` finds its amaxes, and what `parallel` (one of PARALLEL) adds to it."""
    if parallel not in PARALLEL:
        raise ValueError(f"unknown parallelism {parallel!r}; valid: {', '.join(PARALLEL)}")
    s = recipe.input
    if recipe.delayed is not None:
        text = "from the amax history of past steps: the tensor is read once, to cast it"
    elif s.granularity.whole_tensor:
        text = ("a reduction over the whole tensor before any element can be cast: the tensor is read twice "
                "(amax, then cast)")
    elif s.granularity.whole_rows:  # per row
        text = "per row (local), but wgrad's rows are columns of x and dy: a reduction over all tokens"
    else:
        r, c = s.granularity.block_shape((1 << 20, 1 << 20))
        text = f"local to each {r}x{c} block: found as the block is read"
        if s.two_level:
            text += ", under one tensor scale from the whole tensor's amax (read twice)"
    if parallel == "data parallel":
        if recipe.delayed is not None:
            return text + ("; data parallel: the histories may be all-reduced so that every rank keeps the same "
                           "scales (TransformerEngine's reduce_amax, on by default; required only with sequence "
                           "parallelism)")
        return text + "; data parallel: nothing to agree on (each rank's GEMMs read only its own tensors)"
    if parallel.startswith("FSDP"):
        if recipe.weight.granularity.whole_tensor or recipe.weight.two_level:
            return text + "; FSDP: an all-reduce of each weight's amax before its shards are cast (a tensor scale)"
        return text + "; FSDP: no all-reduce (each weight row or block lies on one rank)"
    if parallel.startswith("sequence"):
        gathered = [f"{gemm} {role}" for gemm, roles in GEMMS.items() for role in roles if role != "weight"
                    and (sc := recipe.scaling(role, gemm)) is not None
                    and (sc.two_level or scale_spans_tokens(role, gemm, sc.granularity))]
        if gathered:
            return text + "; sequence parallel: an all-reduce for " + ", ".join(gathered)
        return text + "; sequence parallel: no all-reduce (a block never spans ranks' tokens)"
    return text


def cost_table(recipes: Sequence[str] = COST_RECIPES, k: int = 4096, m: int = 4096, parallel: str = "one process"):
    """Per recipe, for an fprop GEMM x[m, k] @ w[n, k]^T with n = k: element bits, scale bits per
    element of x and w, how the amax is found (and what `parallel`, one of PARALLEL, adds), scale
    multiplies per output element and where, and the published GPU speed-ups (with sources).
    DataFrame indexed by recipe."""
    import pandas as pd

    if k < 1 or m < 1:
        raise ValueError("k and m must be positive")
    rows = []
    for name in recipes:
        r = get_recipe(name)
        mults, where = scale_multiplies(r, k)
        pub = PUBLISHED.get(r.name, ())
        rows.append({
            "recipe": r.name,
            "element bits": r.input.fmt.bits,
            "scale bits/element (x)": scale_bits_per_element(r.input, m, k),
            "scale bits/element (w)": scale_bits_per_element(r.weight, k, k),
            "amax": _amax_text(r, parallel),
            "scale multiplies per output": mults,
            "applied": where,
            "published GPU speed-up": "; ".join(f"{p.value} {p.what}, {p.hardware}" for p in pub) or "none found",
            "sources": "; ".join(dict.fromkeys(p.source for p in pub)),
        })
    return pd.DataFrame(rows).set_index("recipe")


def measure(recipes: Sequence[str] = COST_RECIPES, size: int = 512, rounds: int = 5):
    """This machine: median ms to quantize an x[size, size] as each recipe's input, and of the GEMM
    size^3 on its quantized operands (real scaled_mm where this machine has it, else emulated),
    candidates interleaved. DataFrame indexed by recipe (columns: quantize ms, GEMM ms, backend)."""
    import pandas as pd

    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, **FLOAT32_CPU) for _ in range(2))
    cands, ops = {}, {}
    for name in recipes:
        r = get_recipe(name)
        ops[r.name] = quantize_operands(a, b, r)
        cands[f"q {r.name}"] = lambda r=r: quantize(a, r.input)
        cands[f"g {r.name}"] = lambda r=r: matmul(*ops[r.name], r, verbose=False)
    cands["g fp32"] = lambda: a @ b
    times = time_interleaved(cands, rounds=rounds, warmup=1)
    rows = [{"recipe": "fp32 (no FP8)", "quantize ms": 0.0, "GEMM ms": statistics.median(times["g fp32"]) * 1e3,
             "backend": "torch.mm"}]
    for name in recipes:
        r = get_recipe(name)
        rows.append({"recipe": r.name, "quantize ms": statistics.median(times[f"q {r.name}"]) * 1e3,
                     "GEMM ms": statistics.median(times[f"g {r.name}"]) * 1e3,
                     "backend": resolve_backend(r).backend})
    return pd.DataFrame(rows).set_index("recipe")


def per_tensor_vs_block(table, measured=None, per_tensor: str = "tensorwise", block: str = "blockwise"):
    """Is per-tensor cheaper, and where? Answered row by row from cost_table()
    (and measure()): DataFrame (aspect, per-tensor, per-block, cheaper)."""
    import pandas as pd

    t, b = table.loc[per_tensor], table.loc[block]

    def which(a: float, c: float, lower_is_cheaper: bool = True) -> str:
        if a == c:
            return "same"
        return per_tensor if (a < c) == lower_is_cheaper else block

    bits_t = t["scale bits/element (x)"] + t["scale bits/element (w)"]
    bits_b = b["scale bits/element (x)"] + b["scale bits/element (w)"]
    rows = [
        {"aspect": "scale storage (bits per element, x + w)", per_tensor: f"{bits_t:.2g}", block: f"{bits_b:.2g}",
         "cheaper": which(bits_t, bits_b)},
        {"aspect": "scale multiplies per output element", per_tensor: str(t["scale multiplies per output"]),
         block: str(b["scale multiplies per output"]),
         "cheaper": which(t["scale multiplies per output"], b["scale multiplies per output"])},
        {"aspect": "finding the amax", per_tensor: t["amax"], block: b["amax"],
         "cheaper": block if "read twice" in t["amax"] and "as the block is read" in b["amax"] else "same"},
    ]
    for hardware, blocked in (("H200", block), ("B300", "mxfp8")):  # on Blackwell, TE's block recipe is MXFP8
        gemm_t, gemm_b = _first_speedup(per_tensor, hardware), _first_speedup(blocked, hardware)
        if gemm_t and gemm_b:
            shown = f"{gemm_b:g}x" + ("" if blocked == block else f" ({blocked})")
            rows.append({"aspect": f"published speed-up over BF16, GEMM + quantization, {hardware} (TransformerEngine)",
                         per_tensor: f"{gemm_t:g}x", block: shown,
                         "cheaper": which(gemm_t, gemm_b, lower_is_cheaper=False).replace(block, blocked)})
    if measured is not None:
        for col in ("quantize ms", "GEMM ms"):
            qt, qb = float(measured.loc[per_tensor, col]), float(measured.loc[block, col])
            backend = measured.loc[per_tensor, "backend"]
            rows.append({"aspect": f"{col} on this machine ({backend})", per_tensor: f"{qt:.3g}",
                         block: f"{qb:.3g}", "cheaper": _measured_winner(qt, qb, per_tensor, block)})
    return pd.DataFrame(rows).set_index("aspect")


def _measured_winner(a: float, b: float, name_a: str, name_b: str, tolerance: float = 0.1) -> str:
    # timings on a shared machine move by ~10-15% run to run: closer than that is a tie
    if abs(a - b) <= tolerance * max(a, b):
        return "within 10% (a tie here)"
    return name_a if a < b else name_b


def _first_speedup(recipe: str, hardware: str) -> float | None:
    for p in PUBLISHED.get(recipe, ()):
        if p.hardware == hardware and p.value.endswith("x") and p.what.startswith(_AUTOCAST):
            return float(p.value[:-1])
    return None


def answer(comparison) -> str:
    """One sentence from per_tensor_vs_block()'s table: where per-tensor is cheaper and where not."""
    cols = [c for c in comparison.columns if c != "cheaper"]
    per_tensor, block = cols[0], cols[1]
    cheaper = [a for a, w in comparison["cheaper"].items() if w == per_tensor]
    dearer = [a for a, w in comparison["cheaper"].items() if w == block]
    text = f"{per_tensor} is cheaper in: " + ("; ".join(cheaper) if cheaper else "nothing here")
    text += f". {block} is cheaper in: " + ("; ".join(dearer) if dearer else "nothing here") + "."
    return text



def cost_class(recipe: Recipe | str) -> int:
    """A coarse cost rank from a recipe's own scalings, cheapest first: 0 for 4-bit elements
    (NVFP4), 1 per-tensor scales, 2 per-row, 3 blocks along K. Recipes in one class are not
    ranked against each other (their order depends on the GPU: fp8lab.readiness.COST_ORDER)."""
    r = get_recipe(recipe)
    if r.input.fmt.bits <= 4:
        return 0
    g = r.input.granularity
    return 1 if g.whole_tensor else 2 if g.whole_rows else 3
