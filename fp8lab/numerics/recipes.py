"""Named training recipes: which format, granularity and scale rule each tensor uses.

Public: TensorScaling, Recipe, RECIPES (tensorwise, delayed, rowwise, blockwise, mxfp8,
nvfp4), ScalePreset and SCALE_PRESETS (how a block's scale is stored, by name: the panels' choices),
VARIANTS (rowwise_with_gw_hp, nvfp4_training), TORCHAO_RECIPES (the ones torchao's
float8 training has under the same names), get_recipe(name), RoundingDraws; the 4-bit recipe's
parts as options of any recipe (Recipe.with_2d_weight, .with_wgrad_hadamard,
.with_stochastic_gradients, .with_high_precision_layers) and NVFP4_PARTS / nvfp4_with(parts).
Granularities are stated in each GEMM operand's own [rows, contraction] layout: an
activation x[M, K] is scaled 1x128 along K for fprop and re-scaled along M for wgrad.
    fprop  y[M, N]  = x[M, K]       @ w[N, K]^T     operands: input, weight   (reduce K)
    dgrad  dx[M, K] = dy[M, N]      @ w^T[K, N]^T   operands: grad_output, weight (reduce N)
    wgrad  dw[N, K] = dy^T[N, M]    @ x^T[K, M]^T   operands: grad_output, input (reduce M)
Notebook 06 trains with these; 07 exports them to torchao / TransformerEngine / torchtitan; 09 assembles
the NVFP4 training recipe part by part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

import torch

from fp8lab.numerics.formats import E2M1, E4M3, E5M2, E8M0, FloatFormat
from fp8lab.numerics.hadamard import RandomHadamard
from fp8lab.numerics.scaling import AmaxHistory, Granularity, PerBlock, PerRow, PerTensor, TensorScaling

__all__ = [
    "GEMMS", "NVFP4_HADAMARD", "NVFP4_PARTS", "RECIPES", "ROLES", "SCALE_PRESETS", "TORCHAO_RECIPES", "VARIANTS",
    "DelayedSpec", "Recipe", "RoundingDraws", "ScalePreset", "TensorScaling", "get_recipe", "nvfp4_with",
]

Role = Literal["input", "weight", "grad_output"]
Gemm = Literal["fprop", "dgrad", "wgrad"]
ROLES: tuple[str, ...] = ("input", "weight", "grad_output")
RECORD_POLICIES: tuple[str, ...] = ("step", "forward")  # DelayedSpec.record
# NVFP4's random Hadamard transform: d = 16, one sign vector for every layer
NVFP4_HADAMARD = RandomHadamard(16, seed=0)
GEMMS: dict[str, tuple[str, str]] = {
    "fprop": ("input", "weight"),
    "dgrad": ("grad_output", "weight"),
    "wgrad": ("grad_output", "input"),
}


class RoundingDraws:
    """Where one layer's stochastic-rounding draws come from: generator(device) is a fresh torch.Generator
    for each quantization, seeded from (seed, the number of generators made before), so a layer's draws
    follow from its own seed and its own calls alone: the same whether its run trains alone or beside
    others, on any machine (the CPU generator's stream is torch's, not the BLAS's). A plain object:
    copy, deepcopy and pickle keep the count, and copies then draw apart from the original."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self.calls = 0

    def generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed((self.seed * 0x9E3779B97F4A7C15 + self.calls) % 2**63)
        self.calls += 1
        return g

    def __repr__(self) -> str:
        return f"RoundingDraws(seed={self.seed}, calls={self.calls})"


@dataclass(frozen=True)
class DelayedSpec:
    """Delayed scaling settings (TransformerEngine DelayedScaling).

    history_len  amaxes kept per tensor
    algo         "max" (of the history) or "most_recent"
    record       when a training step's amaxes enter the history: "step" (once per optimizer step, the
                 step's micro-batches reduced to their max amax) or "forward" (every training forward,
                 one entry per micro-batch, as TransformerEngine records). Either way the scales of one
                 forward and of its checkpointing recompute are the same, and evaluation forwards
                 (eval mode or no grad) record nothing (fp8lab.training.delayed).
    """

    history_len: int = 16
    algo: str = "max"
    record: str = "step"

    def __post_init__(self) -> None:
        AmaxHistory(self.history_len, self.algo)  # validates
        if self.record not in RECORD_POLICIES:
            raise ValueError(f"unknown record policy {self.record!r}; valid: {', '.join(RECORD_POLICIES)}")

    def new_history(self) -> AmaxHistory:
        return AmaxHistory(self.history_len, self.algo)


@dataclass(frozen=True)
class Recipe:
    """A full FP8 training recipe: a TensorScaling per role, with per-GEMM exceptions.

    weight_for_dgrad      a different scaling for the weight in the dgrad GEMM
    wgrad_high_precision  run the wgrad GEMM unquantized (torchao rowwise_with_gw_hp)
    fprop_high_precision  run the forward GEMM unquantized, as nn.Linear does (dgrad and wgrad still quantized):
                          a backward-only run, which shows what the backward's parts do (with_backward_only); with
                          wgrad_high_precision, what splits a layer's forward from its weight gradient (notebook
                          09's fc1 split; with_gemm_in_high_precision)
    dgrad_high_precision  run the dgrad GEMM unquantized (with wgrad_high_precision: the backward pass in high
                          precision, dy never quantized: the control for a recipe's choice of dy)
    delayed               per-tensor scales from an amax history instead of the current amax
    wgrad_hadamard        a RandomHadamard applied to both wgrad operands along their contraction
                          (the tokens, M) before they are scaled: NVFP4's random Hadamard transform
    high_precision_share  the share of a model's linear layers fp8lab.nn.convert keeps in high precision,
                          the last ones: ceil(share * layers) of them; 0 converts all. nvfp4_training's 15%,
                          the last layers, is fp8lab's own choice: the NVFP4 pretraining paper (arXiv
                          2509.25149) "incorporates selective high-precision layers", which summaries of it give
                          as about 15-16% of the linear layers, most of them at the end
    """

    name: str
    input: TensorScaling
    weight: TensorScaling
    grad_output: TensorScaling
    weight_for_dgrad: TensorScaling | None = None
    wgrad_high_precision: bool = False
    delayed: DelayedSpec | None = None
    description: str = ""
    source: str = ""
    tags: tuple[str, ...] = field(default=())
    wgrad_hadamard: RandomHadamard | None = None
    high_precision_share: float = 0.0
    fprop_high_precision: bool = False
    dgrad_high_precision: bool = False

    def __post_init__(self) -> None:
        for flag in ("fprop_high_precision", "dgrad_high_precision"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} is True or False, got {getattr(self, flag)!r}")
        if self.delayed is not None:
            for role in ROLES:
                if not getattr(self, role).granularity.whole_tensor:
                    raise ValueError(
                        "delayed scaling keeps one amax history per tensor: every role must be per-tensor"
                    )
        if self.wgrad_hadamard is not None and not isinstance(self.wgrad_hadamard, RandomHadamard):
            raise TypeError(f"wgrad_hadamard must be a RandomHadamard or None, got {self.wgrad_hadamard!r}")
        if self.wgrad_hadamard is not None and (self.wgrad_high_precision or self.delayed is not None):
            raise ValueError("a Hadamard transform on the wgrad GEMM needs that GEMM quantized with current scales "
                             "(not wgrad_high_precision, not delayed scaling)")
        if self.fprop_high_precision and self.delayed is not None:
            raise ValueError("delayed scaling records the input's amax in the fprop GEMM: it cannot run with "
                             "fprop_high_precision (use a current-scaling recipe)")
        share = self.high_precision_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
            raise ValueError(f"high_precision_share is a share of the linear layers in [0, 1), got {share!r}")

    def scaling(self, role: str, gemm: str = "fprop") -> TensorScaling | None:
        """The TensorScaling of `role` in `gemm`, or None where that GEMM runs in high precision."""
        if gemm not in GEMMS:
            raise ValueError(f"unknown gemm {gemm!r}; valid: {', '.join(GEMMS)}")
        if role not in GEMMS[gemm]:
            raise ValueError(f"{gemm} takes {' and '.join(GEMMS[gemm])}, not {role!r}")
        if gemm == "wgrad" and self.wgrad_high_precision:
            return None
        if gemm == "fprop" and self.fprop_high_precision:
            return None
        if gemm == "dgrad" and self.dgrad_high_precision:
            return None
        if gemm == "dgrad" and role == "weight" and self.weight_for_dgrad is not None:
            return self.weight_for_dgrad
        if gemm == "wgrad" and self.wgrad_hadamard is not None:
            return self._rotated[role]
        return getattr(self, role)

    @cached_property
    def _rotated(self) -> dict[str, TensorScaling]:
        """wgrad's operands with the recipe's Hadamard transform (made once)."""
        return {role: replace(getattr(self, role), hadamard=self.wgrad_hadamard) for role in GEMMS["wgrad"]}

    def high_precision_layers(self, names: Sequence[str]) -> list[str]:
        """Which of a model's linear layers (`names`, in model order) this recipe keeps in high precision:
        the last ceil(high_precision_share * len(names)) of them (none at share 0)."""
        keep = math.ceil(self.high_precision_share * len(names) - 1e-9)
        return list(names[len(names) - keep:]) if keep else []

    # ---- the 4-bit recipe's parts, as options of any recipe (notebook 09) ----
    def with_2d_weight(self, on: bool = True) -> Recipe:
        """The weight quantized in square blocks (on: c x c, c its block width along K), so that fprop's
        w[N, K] and dgrad's w^T[K, N] are the same codes; off: 1 x c blocks, one per row per K block,
        re-quantized along N for dgrad (two sets of codes). Per-tensor weights are one block either way
        (unchanged); a per-row weight has no block width along K (ValueError)."""
        w = self.weight
        g = w.granularity
        if g.whole_tensor:
            return self
        if g.whole_rows:
            raise ValueError(f"{self.name}'s weight is scaled per row: one scale spans all of K, so it has no square "
                             "block; give the weight PerBlock(c, c) blocks instead")
        c = g.cols
        weight = replace(w, granularity=PerBlock(c, c) if on else PerBlock(1, c))
        return replace(self, weight=weight, weight_for_dgrad=None if on else self.weight_for_dgrad)

    def with_wgrad_hadamard(self, hadamard: RandomHadamard | None = NVFP4_HADAMARD) -> Recipe:
        """A random Hadamard transform on the wgrad GEMM's operands (None: none; default NVFP4's, d = 16)."""
        return replace(self, wgrad_hadamard=hadamard)

    def with_stochastic_gradients(self, on: bool = True) -> Recipe:
        """grad_output (dgrad's and wgrad's dy) rounded stochastically (on) or to nearest."""
        return replace(self, grad_output=replace(self.grad_output, rounding="stochastic" if on else "nearest"))

    def with_gemm_in_high_precision(self, gemm: str) -> Recipe:
        """This recipe with one GEMM of the layer unquantized: "fprop" (the forward) or "wgrad" (the weight
        gradient); the other GEMMs as they were. convert(overrides={layer: ...}) applies it to one layer."""
        if gemm == "fprop":
            return replace(self, fprop_high_precision=True)
        if gemm == "wgrad":
            if self.wgrad_hadamard is not None:
                return replace(self, wgrad_high_precision=True, wgrad_hadamard=None)
            return replace(self, wgrad_high_precision=True)
        raise ValueError(f"with_gemm_in_high_precision takes 'fprop' or 'wgrad', not {gemm!r} (dgrad's gradient "
                         "flows on to the layers before: keep the whole layer instead, convert(skip=...))")

    def with_backward_only(self, on: bool = True) -> Recipe:
        """The forward GEMM in high precision (as nn.Linear computes it) and dgrad and wgrad quantized as this recipe
        says (on), or every GEMM quantized (off); named with " backward" added or taken off."""
        name = self.name.removesuffix(" backward") + (" backward" if on else "")
        return replace(self, fprop_high_precision=on, name=name)

    def with_high_precision_layers(self, share: float = 0.15) -> Recipe:
        """The last ceil(share * layers) linear layers kept in high precision by convert (0: none)."""
        return replace(self, high_precision_share=share)

    def replace(self, **changes) -> Recipe:
        """A copy with some fields changed, e.g. recipe.replace(name="mine", input=...)."""
        return replace(self, **changes)

    def table(self) -> list[dict[str, str]]:
        """One row per (gemm, operand): what each GEMM quantizes and how."""
        rows = []
        for gemm, roles in GEMMS.items():
            for role in roles:
                s = self.scaling(role, gemm)
                rows.append({"gemm": gemm, "operand": role, "scaling": s.label if s else "high precision"})
        return rows

    def __str__(self) -> str:
        lines = [f"recipe {self.name!r}: {self.description}"]
        lines += [f"  {r['gemm']:>5} {r['operand']:<11} {r['scaling']}" for r in self.table()]
        if self.delayed:
            lines.append(f"  amax history: {self.delayed.history_len} steps, {self.delayed.algo}")
        if self.high_precision_share:
            lines.append(f"  linear layers in high precision: the last {100 * self.high_precision_share:g}% "
                         "(at least one)")
        return "\n".join(lines)


_E4M3_TENSOR = TensorScaling(E4M3, PerTensor())
_E5M2_TENSOR = TensorScaling(E5M2, PerTensor())
_E4M3_ROW_POW2 = TensorScaling(E4M3, PerRow(), "rceil")

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "tensorwise", _E4M3_TENSOR, _E4M3_TENSOR, _E5M2_TENSOR,
            description="one scale per tensor from its current amax; E4M3 forward, E5M2 gradients",
            source="torchao Float8LinearRecipeName.TENSORWISE (float8/config.py)",
        ),
        Recipe(
            "delayed", _E4M3_TENSOR, _E4M3_TENSOR, _E5M2_TENSOR, delayed=DelayedSpec(16, "max"),
            description="per-tensor scales from the max of the last 16 amaxes (HYBRID formats)",
            source="TransformerEngine DelayedScaling(fp8_format=HYBRID); "
            "TE's default history is 1024, its primer uses 16",
        ),
        Recipe(
            "rowwise", _E4M3_ROW_POW2, _E4M3_ROW_POW2, _E4M3_ROW_POW2,
            description="one power-of-two scale per row along the reduced dim; E4M3 everywhere",
            source="torchao Float8LinearRecipeName.ROWWISE (round_scales_to_power_of_2=True)",
        ),
        Recipe(
            "blockwise",
            TensorScaling(E4M3, PerBlock(1, 128)),
            TensorScaling(E4M3, PerBlock(128, 128)),
            TensorScaling(E4M3, PerBlock(1, 128)),
            description="DeepSeek-V3: 1x128 activation and gradient tiles, 128x128 weight blocks, E4M3, float32 scales",
            source="DeepSeek-V3 (arXiv 2412.19437) section 3.3; TE Float8BlockScaling rounds scales to powers of two",
        ),
        Recipe(
            "mxfp8",
            TensorScaling(E4M3, PerBlock(1, 32), "rceil", E8M0),
            TensorScaling(E4M3, PerBlock(1, 32), "rceil", E8M0),
            TensorScaling(E4M3, PerBlock(1, 32), "rceil", E8M0),
            description="OCP MX: 32 elements share an E8M0 (power of two) scale, rounded up as cuBLAS/TE do",
            source="OCP MX v1.0; TE MXFP8BlockScaling (RCEIL); torchao MXTensor (default FLOOR)",
        ),
        Recipe(
            "nvfp4",
            TensorScaling(E2M1, PerBlock(1, 16), "exact", E4M3, two_level=True),
            TensorScaling(E2M1, PerBlock(16, 16), "exact", E4M3, two_level=True),
            TensorScaling(E2M1, PerBlock(1, 16), "exact", E4M3, two_level=True),
            description="FP4 E2M1 in 16-element blocks with E4M3 block scales under a float32 tensor scale",
            source="TE NVFP4BlockScaling (16x16 weight blocks; its random Hadamard transform and stochastic "
            "rounding of gradients: the variant nvfp4_training); torchao nvfp4_quantize",
        ),
    )
}

# The NVFP4 training recipe's parts beyond 16-element blocks (arXiv 2509.25149 section 4; TransformerEngine's
# NVFP4BlockScaling): part -> (short label, what it is). Which layers stay in high precision is a choice per model:
# "the last 15%" is fp8lab's (the paper's are mostly, not all, the last ones; TE leaves it to the user)
NVFP4_PARTS: dict[str, tuple[str, str]] = {
    "2d_weights": ("2D", "16x16 weight blocks: fprop and dgrad read the same weight codes"),
    "hadamard": ("RHT", "a random Hadamard transform (d = 16) on the wgrad GEMM's two operands"),
    "stochastic_rounding": ("SR", "gradients (dy, in dgrad and wgrad) rounded stochastically"),
    "high_precision": ("HP", "the last 15% of linear layers in high precision (fp8lab's choice)"),
}


def nvfp4_with(parts: Sequence[str] | set[str] = tuple(NVFP4_PARTS), name: str | None = None) -> Recipe:
    """NVFP4 (E2M1 in 1x16 blocks, E4M3 block scales, a float32 tensor scale) with the chosen parts of
    its training recipe (NVFP4_PARTS). Named "nvfp4 " + the parts' short labels ("nvfp4 2D+RHT+SR+HP"),
    "nvfp4 1x16" with none. With {"2d_weights"} alone it computes what RECIPES["nvfp4"] does."""
    unknown = set(parts) - set(NVFP4_PARTS)
    if unknown or isinstance(parts, str):
        raise ValueError(f"unknown NVFP4 parts {sorted(unknown) if not isinstance(parts, str) else parts!r}; "
                         f"valid: {', '.join(NVFP4_PARTS)} (a list of them)")
    r = RECIPES["nvfp4"].with_2d_weight("2d_weights" in parts)
    if "hadamard" in parts:
        r = r.with_wgrad_hadamard(NVFP4_HADAMARD)
    if "stochastic_rounding" in parts:
        r = r.with_stochastic_gradients()
    if "high_precision" in parts:
        r = r.with_high_precision_layers(0.15)
    shorts = [short for part, (short, _) in NVFP4_PARTS.items() if part in parts]
    return r.replace(name=name or ("nvfp4 " + "+".join(shorts) if shorts else "nvfp4 1x16"),
                     description="NVFP4 with " + ("; ".join(NVFP4_PARTS[p][1] for p in NVFP4_PARTS if p in parts)
                                                  or "1x16 blocks everywhere and none of its training recipe's parts"),
                     source="arXiv 2509.25149 section 4; TransformerEngine NVFP4BlockScaling")


VARIANTS: dict[str, Recipe] = {
    "rowwise_with_gw_hp": RECIPES["rowwise"].replace(
        name="rowwise_with_gw_hp",
        weight_for_dgrad=TensorScaling(E4M3, PerTensor(), "rceil"),
        wgrad_high_precision=True,
        description="rowwise, with the weight gradient GEMM in high precision and a per-tensor weight for dgrad",
        source="torchao Float8LinearRecipeName.ROWWISE_WITH_GW_HP",
    ),
    "nvfp4_training": nvfp4_with(NVFP4_PARTS, name="nvfp4_training").replace(
        description="NVFP4's training recipe: 16x16 weight blocks, a random Hadamard transform (d = 16) on the "
        "wgrad GEMM's operands, stochastic rounding of gradients, the last 15% of linear layers in high precision "
        "(fp8lab's choice of layers)",
    ),
}


@dataclass(frozen=True)
class ScalePreset:
    """How a block's scale is chosen and stored, by name: a TensorScaling's scale settings without its element
    format and granularity (notebook 04's "scales" choice; `scaling(fmt, granularity)` completes it).

    label       what a panel shows for it
    scale_rule  one of scaling.SCALE_RULES ("exact", "rceil": rounded up to a power of two, "floor")
    scale_fmt   None (float32 scales), E8M0 (powers of two: MX) or E4M3 (NVFP4's block scales)
    two_level   a per-tensor float32 scale above E4M3 block scales (NVFP4)
    Checked in __post_init__ by TensorScaling's own checks (E8M0 needs "rceil" or "floor", and so on).
    """

    label: str
    scale_rule: str = "exact"
    scale_fmt: FloatFormat | None = None
    two_level: bool = False

    def __post_init__(self) -> None:
        self.scaling(E4M3, PerTensor())

    def scaling(self, fmt: FloatFormat | str, granularity: Granularity | str) -> TensorScaling:
        """These scale settings for elements in `fmt`, one scale per block of `granularity`."""
        return TensorScaling(fmt, granularity, self.scale_rule, self.scale_fmt, self.two_level)


# the ways of storing block scales the lab compares, by name (fp8lab.lab.panels.base.SCALES shows their labels)
SCALE_PRESETS: dict[str, ScalePreset] = {
    "fp32": ScalePreset("fp32, exact"),
    "fp32_pow2": ScalePreset("fp32, power of two (rceil)", "rceil"),  # torchao's rowwise
    "e8m0_rceil": ScalePreset("E8M0, rceil (MX as cuBLAS/TE)", "rceil", E8M0),
    "e8m0_floor": ScalePreset("E8M0, floor (OCP MX)", "floor", E8M0),
    "nvfp4": ScalePreset("E4M3 under an fp32 tensor scale (NVFP4)", "exact", E4M3, two_level=True),
}

# the recipes torchao's float8 training has under the same names (Float8LinearConfig.from_recipe_name):
# fp8lab.nn.convert(engine="torchao") trains them, fp8lab.export writes them for torchao and torchtitan
TORCHAO_RECIPES: tuple[str, ...] = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def get_recipe(recipe: Recipe | str) -> Recipe:
    """A Recipe from itself or its name."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        key = recipe.strip().lower()
        if key in RECIPES:
            return RECIPES[key]
        if key in VARIANTS:
            return VARIANTS[key]
    valid = ", ".join([*RECIPES, *VARIANTS])
    raise ValueError(f"unknown recipe {recipe!r}; valid recipes: {valid}")
