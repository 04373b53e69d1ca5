"""Named training recipes: which format, granularity and scale rule each tensor uses.

Public: TensorScaling, Recipe, RECIPES (tensorwise, delayed, rowwise, blockwise, mxfp8,
nvfp4), VARIANTS (rowwise_with_gw_hp), TORCHAO_RECIPES (the ones torchao's float8 training
has under the same names), get_recipe(name).
Granularities are stated in each GEMM operand's own [rows, contraction] layout: an
activation x[M, K] is scaled 1x128 along K for fprop and re-scaled along M for wgrad.
    fprop  y[M, N]  = x[M, K]       @ w[N, K]^T     operands: input, weight   (reduce K)
    dgrad  dx[M, K] = dy[M, N]      @ w^T[K, N]^T   operands: grad_output, weight (reduce N)
    wgrad  dw[N, K] = dy^T[N, M]    @ x^T[K, M]^T   operands: grad_output, input (reduce M)
Notebook 06 trains with these; 07 exports them to torchao / TransformerEngine / torchtitan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

import torch

from fp8lab.numerics.formats import E2M1, E4M3, E5M2, E8M0, FloatFormat, get_format
from fp8lab.numerics.quantize import QuantizedTensor, QuantizeSpec, quantize_spec, quantize_with
from fp8lab.numerics.scaling import (
    AmaxHistory,
    Granularity,
    PerBlock,
    PerRow,
    PerTensor,
    check_scale_args,
    parse_granularity,
)

__all__ = [
    "GEMMS", "RECIPES", "ROLES", "TORCHAO_RECIPES", "VARIANTS", "DelayedSpec", "Recipe", "TensorScaling", "get_recipe",
]

Role = Literal["input", "weight", "grad_output"]
Gemm = Literal["fprop", "dgrad", "wgrad"]
ROLES: tuple[str, ...] = ("input", "weight", "grad_output")
RECORD_POLICIES: tuple[str, ...] = ("step", "forward")  # DelayedSpec.record
GEMMS: dict[str, tuple[str, str]] = {
    "fprop": ("input", "weight"),
    "dgrad": ("grad_output", "weight"),
    "wgrad": ("grad_output", "input"),
}


@dataclass(frozen=True)
class TensorScaling:
    """How one GEMM operand is quantized, in its [rows, contraction] layout.

    Frozen; it caches two derived things on itself, both pure functions of its fields: `spec`
    (the settings checked once) and down_columns(rows) (the same scaling restated for the
    transposed operand, one per `rows`)."""

    fmt: FloatFormat = E4M3
    granularity: Granularity = PerTensor()
    scale_rule: str = "exact"
    scale_fmt: FloatFormat | None = None
    two_level: bool = False
    margin: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "fmt", get_format(self.fmt))
        object.__setattr__(self, "granularity", parse_granularity(self.granularity))
        if self.scale_fmt is not None:
            object.__setattr__(self, "scale_fmt", get_format(self.scale_fmt))
        check_scale_args(self.fmt, self.scale_rule, self.margin, self.scale_fmt, self.two_level)

    @cached_property
    def spec(self) -> QuantizeSpec:
        """These settings checked once, as quantize() takes them."""
        return quantize_spec(self.fmt, self.granularity, self.scale_rule, self.margin, self.scale_fmt,
                             self.two_level)

    def quantize(self, x: torch.Tensor, amax: torch.Tensor | None = None, count: bool = False,
                 values: bool | None = None) -> QuantizedTensor:
        """Quantize an operand x[rows, contraction] as this scaling says (count, values: see quantize_with)."""
        return quantize_with(x, self.spec, amax, count=count, values=values)

    def down_columns(self, rows: int) -> TensorScaling:
        """This scaling restated for x[rows, cols] when the operand is x^T[cols, rows]: the same
        blocks, down x's columns (per row of x^T is one block per column of x, PerBlock(rows, 1);
        a 1x32 block of x^T is a 32x1 block of x). Made once per `rows` and kept on this object."""
        cache = self.__dict__.setdefault("_down_columns", {})  # per instance (a frozen dataclass's dict)
        if rows not in cache:
            g = self.granularity
            down = PerBlock(rows, 1) if isinstance(g, PerRow) else PerBlock(g.cols, g.rows) \
                if isinstance(g, PerBlock) else g
            cache[rows] = replace(self, granularity=down)
        return cache[rows]

    def quantize_transposed(self, x: torch.Tensor, values: bool | None = None) -> QuantizedTensor:
        """Quantize the operand x^T[cols, rows] as this scaling says, from x[rows, cols], without
        copying x^T: x is quantized down its columns (down_columns) and the result is the
        QuantizedTensor of x^T, code for code, as a transposed view (what a GEMM over x's rows
        needs: a weight b[K, N] for b^T[N, K], an activation x[M, K] for wgrad's x^T[K, M])."""
        if isinstance(self.granularity, PerTensor):
            return self.quantize(x, values=values).t()
        return self.down_columns(x.shape[0]).quantize(x, values=values).t(self.granularity)

    @property
    def label(self) -> str:
        scale = self.scale_fmt.name if self.scale_fmt else "fp32"
        extra = " +tensor" if self.two_level else ""
        return f"{self.fmt.name} {self.granularity.label} {self.scale_rule} ({scale} scales{extra})"


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
    delayed               per-tensor scales from an amax history instead of the current amax
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

    def __post_init__(self) -> None:
        if self.delayed is not None:
            for role in ROLES:
                if not isinstance(getattr(self, role).granularity, PerTensor):
                    raise ValueError(
                        "delayed scaling keeps one amax history per tensor: every role must be per-tensor"
                    )

    def scaling(self, role: str, gemm: str = "fprop") -> TensorScaling | None:
        """The TensorScaling of `role` in `gemm`, or None where that GEMM runs in high precision."""
        if gemm not in GEMMS:
            raise ValueError(f"unknown gemm {gemm!r}; valid: {', '.join(GEMMS)}")
        if role not in GEMMS[gemm]:
            raise ValueError(f"{gemm} takes {' and '.join(GEMMS[gemm])}, not {role!r}")
        if gemm == "wgrad" and self.wgrad_high_precision:
            return None
        if gemm == "dgrad" and role == "weight" and self.weight_for_dgrad is not None:
            return self.weight_for_dgrad
        return getattr(self, role)

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
            source="TE NVFP4BlockScaling (16x16 weight blocks; its random Hadamard transform and "
            "stochastic rounding of gradients are not modelled here); torchao nvfp4_quantize",
        ),
    )
}

VARIANTS: dict[str, Recipe] = {
    "rowwise_with_gw_hp": RECIPES["rowwise"].replace(
        name="rowwise_with_gw_hp",
        weight_for_dgrad=TensorScaling(E4M3, PerTensor(), "rceil"),
        wgrad_high_precision=True,
        description="rowwise, with the weight gradient GEMM in high precision and a per-tensor weight for dgrad",
        source="torchao Float8LinearRecipeName.ROWWISE_WITH_GW_HP",
    ),
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
