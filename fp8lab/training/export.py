"""A recipe from the lab as the libraries that train at scale spell it: torchao, TransformerEngine, torchtitan.

Public: export(recipe, target) -> Export, export_table(), TARGETS.
Export.text is a usage snippet (or why the target lacks the recipe), Export.differences
what the target computes unlike fp8lab, and Export.config the torchao config object itself.
export() never raises for a known recipe and target: check .available. Notebook 07.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fp8lab.extras import require
from fp8lab.numerics.recipes import NVFP4_HADAMARD, RECIPES, TORCHAO_RECIPES, VARIANTS, get_recipe

__all__ = ["TARGETS", "Export", "export", "export_table"]

TARGETS = ("torchao", "transformer_engine", "torchtitan")

# Sources, read for this file (the libraries move; pin what you use):
#   torchao 0.18.0 (installed): torchao/float8/config.py (Float8LinearConfig.from_recipe_name,
#     Float8LinearRecipeName); torchao/prototype/moe_training/config.py (MXFP8TrainingOpConfig,
#     MXFP8TrainingRecipe, ScaleCalculationMode.RCEIL); torchao/prototype/blockwise_fp8_training/
#     linear.py (Float8BlockwiseLinearConfig); torchao/prototype/moe_training/nvfp4_training/
#     nvfp4_training.py (NVFP4TrainingConfig). Delayed scaling: deprecated in pytorch/ao#1680 and pytorch/ao#1681,
#     removed in pytorch/ao#1753.
#   TransformerEngine: transformer_engine/common/recipe/__init__.py @ 000b637e (DelayedScaling,
#     Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling, Format); its
#     NVFP4BlockScaling @ d0067d0d (disable_rht, disable_stochastic_rounding, disable_2d_quantization, each
#     False by default unless an NVTE_NVFP4_DISABLE_* variable is set) and docs/features/low_precision_training/
#     nvfp4/nvfp4.rst (2-D weights, stochastic rounding for gradients, RHT d = 16 on the wgrad GEMM's operands);
#     transformer_engine/pytorch/quantization.py @ 001597e9 (autocast(enabled, calibrating, recipe,
#     amax_reduction_group); fp8_autocast(enabled, calibrating, fp8_recipe, fp8_group) deprecated).
#   torchtitan: torchtitan/config/job_config.py @ 000204a4 (Model.converters, [float8] recipe_name /
#     enable_fsdp_float8_all_gather / precompute_float8_dynamic_scale_for_fsdp / emulate, [mx]
#     recipe_name "mxfp8"); later Python configs: torchtitan/components/quantization/float8.md
#     @ 026c75f2 (Float8LinearConverter.Config), mxfp8.md @ 3a8415c4 (MXFP8LinearConverter.Config,
#     recipe_name "mxfp8_rceil"), nvfp4.py @ 0bf8762e (NVFP4LinearConverter.Config).


@dataclass(frozen=True)
class Export:
    """One recipe for one target.

    available    False where the target has no such recipe; then `text` says why
    text         a usage snippet, valid Python (or the reason it is unavailable)
    differences  what the target computes unlike fp8lab's recipe ("" where nothing)
    source       the file(s) this is read from
    command_line torchtitan: the same recipe as command-line flags (a shell line, names quoted; the
                 Python snippet shows it in a comment); "" where the target has none
    config       (property) torchao: the config object, built on access; other targets: None
    """

    recipe: str
    target: str
    available: bool
    text: str
    differences: str = ""
    source: str = ""
    _build: Callable[[], object] | None = field(default=None, repr=False, compare=False)
    command_line: str = ""

    @property
    def config(self) -> object | None:
        """The torchao config object (None for the text-only targets); ValueError where unavailable."""
        if not self.available:
            raise ValueError(f"{self.target} has no {self.recipe!r} recipe: {self.text}")
        if self._build is None:
            return None
        if self.target == "torchao":
            require("torchao", f"export({self.recipe!r}, 'torchao').config")
        return self._build()

    def __str__(self) -> str:
        head = f"{self.recipe} -> {self.target}" + ("" if self.available else " (unavailable)")
        parts = [head, self.text]
        if self.differences:
            parts.append(f"differences from fp8lab: {self.differences}")
        if self.source:
            parts.append(f"source: {self.source}")
        return "\n".join(parts)


def _unavailable(recipe: str, target: str, why: str, source: str) -> Export:
    return Export(recipe, target, False, why, source=source)


# ---- torchao --------------------------------------------------------------------------------------------------


def _torchao_float8(name: str, emulate: bool) -> object:
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(name)
    return dataclasses.replace(config, emulate=True) if emulate else config


def _torchao_mxfp8(emulate: bool) -> object:
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe

    # RCEIL: E8M0 scales rounded up, as fp8lab's mxfp8 (and cuBLAS / TransformerEngine)
    recipe = MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL if emulate else MXFP8TrainingRecipe.MXFP8_RCEIL
    return MXFP8TrainingOpConfig.from_recipe(recipe)


def _no_emulation(what: str) -> Callable[[], object]:
    def build() -> object:
        raise ValueError(f"torchao's {what} has no emulation: it needs triton and a GPU; ask for emulate=False")

    return build


def _torchao_blockwise() -> object:
    try:
        from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinearConfig
    except ImportError as err:
        raise ImportError(f"torchao's blockwise training needs triton (a CUDA machine): {err}") from err
    return Float8BlockwiseLinearConfig()


def _torchao_nvfp4(signs: tuple[int, ...] | None = None) -> object:
    from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4TrainingConfig

    return NVFP4TrainingConfig() if signs is None else NVFP4TrainingConfig(rht_sign_vector=signs)


_FLOAT8_SNIPPET = """\
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

config = Float8LinearConfig.from_recipe_name("{name}")  # on a CPU: dataclasses.replace(config, emulate=True)
convert_to_float8_training(model, config=config,  # swaps nn.Linear for Float8Linear in place
    module_filter_fn=lambda mod, fqn: mod.in_features % 16 == 0 and mod.out_features % 16 == 0)"""

_FSDP_TENSORWISE = """
# with FSDP2, tensorwise can all-gather weights in FP8 (torchao all-reduces their amax across ranks):
#   Float8LinearConfig(enable_fsdp_float8_all_gather=True); after each optimizer.step():
#   torchao.float8.precompute_float8_dynamic_scale_for_fsdp(model)"""


def _torchao(recipe: str, emulate: bool) -> Export:
    src = "torchao 0.18.0 "
    if recipe in TORCHAO_RECIPES:
        diff = {
            "tensorwise": "",
            # torchao rounds its quantization multiplier (max / amax) down to a power of two, which
            # rounds the dequantization scale up: fp8lab's "rceil"
            "rowwise": "",
            "rowwise_with_gw_hp": "",
        }[recipe]
        text = _FLOAT8_SNIPPET.format(name=recipe) + (_FSDP_TENSORWISE if recipe == "tensorwise" else "")
        return Export(recipe, "torchao", True, text, diff, src + "torchao/float8/config.py",
                      lambda: _torchao_float8(recipe, emulate))
    if recipe == "mxfp8":
        text = """\
import torch
from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
from torchao.quantization import quantize_

config = MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL)  # a CPU: MXFP8_EMULATED_RCEIL
quantize_(model, config,  # wraps each selected Linear's weight; the GEMMs then run in MXFP8
    filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear)
    and mod.in_features % 32 == 0 and mod.out_features % 32 == 0)"""
        return Export(recipe, "torchao", True, text,
                      "GEMM outputs in bfloat16 (out_dtype); real kernels need a Blackwell (SM100) GPU",
                      src + "torchao/prototype/moe_training/config.py (prototype)", lambda: _torchao_mxfp8(emulate))
    if recipe == "blockwise":
        text = """\
from torchao.prototype.blockwise_fp8_training.linear import Float8BlockwiseLinearConfig
from torchao.quantization import quantize_

quantize_(model, Float8BlockwiseLinearConfig())  # 1x128 activations/gradients, 128x128 weights"""
        return Export(recipe, "torchao", True, text,
                      "prototype: triton kernels on an SM90+ GPU only (no emulation), bfloat16 weights, "
                      "linears without bias whose dims are multiples of 128; fp32 scales as fp8lab's",
                      src + "torchao/prototype/blockwise_fp8_training/linear.py (prototype)",
                      _no_emulation("blockwise training") if emulate else _torchao_blockwise)
    if recipe == "nvfp4":
        text = """\
from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4TrainingConfig
from torchao.quantization import quantize_

quantize_(model, NVFP4TrainingConfig())  # 16-element E2M1 blocks, E4M3 block scales, fp32 tensor scale"""
        return Export(recipe, "torchao", True, text,
                      "prototype: triton kernels on a Blackwell (SM100) GPU only; adds a random Hadamard "
                      "transform of the wgrad operands and stochastic rounding of gradients, which fp8lab's "
                      "nvfp4 leaves out (nvfp4_training has both); GEMM dims must be multiples of 128",
                      src + "torchao/prototype/moe_training/nvfp4_training/nvfp4_training.py (prototype)",
                      _no_emulation("NVFP4 training") if emulate else _torchao_nvfp4)
    if recipe == "nvfp4_training":
        signs = tuple(int(v) for v in NVFP4_HADAMARD.signs.tolist())
        text = f"""\
import math

import torch
from torchao.prototype.moe_training.nvfp4_training.nvfp4_training import NVFP4TrainingConfig
from torchao.quantization import quantize_

linears = [fqn for fqn, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
keep = set(linears[len(linears) - math.ceil(0.15 * len(linears)):])  # the last 15% stay in high precision
# 16x16 weight blocks, stochastic rounding of gradients, a random Hadamard transform on the wgrad operands;
# one sign vector for every layer (fp8lab's; without it each layer draws its own)
config = NVFP4TrainingConfig(rht_sign_vector={signs!r})
quantize_(model, config, filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear) and fqn not in keep)"""
        return Export(recipe, "torchao", True, text,
                      "prototype: triton kernels on a Blackwell (SM100) GPU only (no emulation); GEMM dims must be "
                      "multiples of 128; stochastic rounding draws from the GPU's own random numbers, not "
                      "fp8lab's generators",
                      src + "torchao/prototype/moe_training/nvfp4_training/nvfp4_training.py, nvfp4_linear.py "
                      "(prototype)",
                      _no_emulation("NVFP4 training") if emulate else lambda: _torchao_nvfp4(signs))
    assert recipe == "delayed"
    return _unavailable(recipe, "torchao",
                        "torchao deprecated delayed scaling in 2025 (pytorch/ao#1680; the warning's pull request, "
                        "pytorch/ao#1681: 'no known real use cases') and removed it (pytorch/ao#1753); "
                        "its float8 training scales from the current amax (recipe 'tensorwise'). Train delayed "
                        "scaling with engine='fp8lab', or TransformerEngine's DelayedScaling.",
                        "pytorch/ao#1680, pytorch/ao#1681, pytorch/ao#1753; torchao/float8/config.py "
                        "(Float8LinearRecipeName)")


# ---- TransformerEngine ---------------------------------------------------------------------------------------

_TE_USAGE = """\
import transformer_engine.pytorch as te
from transformer_engine.common.recipe import {imports}

recipe = {call}
layer = te.Linear(1024, 1024)  # TE's own modules (te.Linear, te.LayerNormMLP, ...), not nn.Linear
with te.autocast(enabled=True, recipe=recipe):  # older TE: te.fp8_autocast(enabled=True, fp8_recipe=recipe)
    out = layer(x)
out.sum().backward()  # backward outside the autocast block, as TE's examples do"""

_TE_SOURCE = ("TransformerEngine transformer_engine/common/recipe/__init__.py, "
              "transformer_engine/pytorch/quantization.py")

_TE = {  # recipe -> (class, constructor call, differences)
    "tensorwise": ("Float8CurrentScaling", "Float8CurrentScaling(fp8_format=Format.HYBRID)",
                   "none in the scales (E4M3 forward, E5M2 gradients, fp32 scales from the current amax); "
                   "needs compute capability 8.9+"),
    "delayed": ("DelayedScaling",
                'DelayedScaling(fp8_format=Format.HYBRID, margin=0, amax_history_len={history}, '
                'amax_compute_algo="{algo}")',
                "TE's first step uses scale 1 (fp8lab calibrates on the first amax); TE's default "
                "history is 1024; reduce_amax=True (the default) all-reduces amaxes over "
                "amax_reduction_group, as fp8lab.training.distributed's amax_all_reduce does"),
    "blockwise": ("Float8BlockScaling",
                  "Float8BlockScaling(fp8_format=Format.E4M3, x_block_scaling_dim=1, w_block_scaling_dim=2, "
                  "grad_block_scaling_dim=1)",
                  "TE rounds block scales to powers of two unless NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 "
                  "(fp8lab and DeepSeek-V3 keep fp32 scales); needs SM90+ and CUDA 12.9+"),
    "mxfp8": ("MXFP8BlockScaling", "MXFP8BlockScaling(fp8_format=Format.E4M3)",
              "none in the scales (32-element blocks, E8M0 scales rounded up); needs a Blackwell (SM100) GPU"),
    "nvfp4": ("NVFP4BlockScaling", "NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True)",
              "TE's defaults also apply a random Hadamard transform and stochastically round gradients; "
              "the flags shown switch both off to match fp8lab's nvfp4 (nvfp4_training has both; 16x16 weight "
              "blocks, TE's default, match fp8lab's); needs a Blackwell (SM100) GPU"),
    "nvfp4_training": ("NVFP4BlockScaling",
                       "NVFP4BlockScaling(disable_rht=False, disable_stochastic_rounding=False, "
                       "disable_2d_quantization=False)",
                       "TE's random Hadamard transform uses a fixed sign vector of its own (fp8lab draws one from "
                       "a seed); its E4M3 block scales are clamped only at the top, as fp8lab's (scale_floor 'zero'); "
                       "its RHT takes BF16 inputs; the last 15% of linear layers are yours to keep out (shown); "
                       "needs a Blackwell (SM100) GPU"),
}

_TE_KEEP = """
# the last 15% of linear layers in high precision: build them as torch.nn.Linear (or run them outside
# te.autocast); the flags shown are TE's defaults, spelled out so that NVTE_NVFP4_DISABLE_* variables can't
# switch a part off"""


def _transformer_engine(recipe: str) -> Export:
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        return _unavailable(
            recipe, "transformer_engine",
            "TransformerEngine has no per-row FP8 recipe: its recipes are DelayedScaling, Float8CurrentScaling, "
            "Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling and CustomRecipe (your own quantizers). "
            "Nearest: Float8BlockScaling (1x128 tiles of each row). TE's backward_override='high_precision' "
            "keeps BOTH backward GEMMs in high precision, not only wgrad.",
            _TE_SOURCE)
    cls, call, diff = _TE[recipe]
    if recipe == "delayed":
        spec = get_recipe(recipe).delayed
        call = call.format(history=spec.history_len, algo=spec.algo)
    imports = f"Format, {cls}"
    text = _TE_USAGE.format(imports=imports, call=call) + (_TE_KEEP if recipe == "nvfp4_training" else "")
    source = _TE_SOURCE + (", docs/features/low_precision_training/nvfp4/nvfp4.rst" if cls == "NVFP4BlockScaling"
                           else "")
    return Export(recipe, "transformer_engine", True, text, diff, source)


# ---- torchtitan -----------------------------------------------------------------------------------------------

_TITAN_SOURCE = ("torchtitan torchtitan/config/job_config.py (TOML / command-line flags, 2025); "
                 "torchtitan/components/quantization/float8.md, mxfp8.md, nvfp4.py (Python configs, 2026)")


def _comment(line: str) -> str:
    """A shell line shown inside a Python comment: on one line, whatever the layer names hold."""
    return line.replace("\n", "\\n").replace("\r", "\\r")


def _torchtitan(recipe: str, skip: Sequence[str] = ()) -> Export:
    """The Python config (text) and the command line (command_line) are kept apart: the text is
    Python, with the flags in a comment; layer names are Python strings there and shell-quoted in
    the flags."""
    keep_py = f", filter_fqns={list(skip)!r}" if skip else ""
    if recipe in TORCHAO_RECIPES:
        flags = ["--model.converters", "float8", "--float8.recipe_name", recipe]
        fsdp_py = ""
        if recipe == "tensorwise":
            flags += ["--float8.enable_fsdp_float8_all_gather", "--float8.precompute_float8_dynamic_scale_for_fsdp"]
            fsdp_py = ", enable_fsdp_float8_all_gather=True, precompute_float8_dynamic_scale_for_fsdp=True"
        if skip:
            flags += ["--float8.filter_fqns", ",".join(skip)]
        line = shlex.join(flags)
        text = f"""\
# newer torchtitan, in the model registry's Python config:
quantization = [Float8LinearConverter.Config(recipe_name="{recipe}"{fsdp_py}{keep_py})]
# or on the command line (torchtitan's JobConfig: TOML, or these flags in a shell):
#   {_comment(line)}
#   --float8.filter_fqns output   keeps layers in high precision; --float8.emulate   tests without an FP8 GPU"""
        return Export(recipe, "torchtitan", True, text,
                      "torchao's float8 training underneath: see export(recipe, 'torchao')", _TITAN_SOURCE,
                      command_line=line)
    if recipe == "mxfp8":
        flags = ["--model.converters", "mx", "--mx.recipe_name", "mxfp8"]
        if skip:
            flags += ["--mx.filter_fqns", ",".join(skip)]
        line = shlex.join(flags)
        text = f"""\
# newer torchtitan, in the model registry's Python config (RCEIL: E8M0 scales rounded up):
quantization = [MXFP8LinearConverter.Config(recipe_name="mxfp8_rceil"{keep_py})]
# or on the command line (torchtitan's JobConfig: TOML, or these flags in a shell):
#   {_comment(line)}"""
        return Export(recipe, "torchtitan", True, text,
                      "torchao's MX training underneath (Blackwell GPUs); the converter skips the output layer "
                      "by default", _TITAN_SOURCE, command_line=line)
    if recipe in ("nvfp4", "nvfp4_training"):
        keep = f"  # the layers it converts: leave out {list(skip)!r}" if skip else \
            "  # keep the LM head out: dims must divide by 128"
        if recipe == "nvfp4_training" and not skip:
            keep = "  # the layers it converts: leave out the last 15% of linear layers (the LM head among them)"
        text = f"""\
# newer torchtitan only (experimental), in the model registry's Python config:
quantization = [NVFP4LinearConverter.Config(fqns=[...])]{keep}"""
        what = ("which fp8lab's nvfp4 leaves out (nvfp4_training has both)" if recipe == "nvfp4"
                else "as fp8lab's nvfp4_training (see export('nvfp4_training', 'torchao'))")
        return Export(recipe, "torchtitan", True, text,
                      "torchao's NVFP4 training underneath: random Hadamard transform and stochastic rounding "
                      f"of gradients, {what}; Blackwell (SM100) GPUs only", _TITAN_SOURCE)
    if recipe == "delayed":
        return _unavailable(recipe, "torchtitan",
                            "torchtitan trains FP8 through torchao, which removed delayed scaling in 2025 "
                            "(pytorch/ao#1680, pytorch/ao#1753); its float8 recipes are tensorwise, rowwise and "
                            "rowwise_with_gw_hp.",
                            _TITAN_SOURCE)
    assert recipe == "blockwise"
    return _unavailable(recipe, "torchtitan",
                        "torchtitan's quantization converters (float8, mx / mxfp8, nvfp4 in "
                        "torchtitan/components/quantization) have no blockwise (1x128 / 128x128) linear. "
                        "Use TransformerEngine's Float8BlockScaling, or apply torchao's prototype "
                        "Float8BlockwiseLinearConfig yourself (export('blockwise', 'torchao')).",
                        _TITAN_SOURCE)


# ---- the entry points -----------------------------------------------------------------------------------------


def export(recipe: str, target: str, *, emulate: bool = False, skip: Sequence[str] = ()) -> Export:
    """`recipe` (a name in RECIPES or VARIANTS) as `target` ("torchao", "transformer_engine", "torchtitan") has it.

    Returns an Export whatever the pair; where the target lacks the recipe, .available is
    False and .text says why (and .config raises ValueError). emulate=True (torchao only)
    builds the config that runs without FP8 hardware, where torchao has one: tensorwise and
    rowwise (emulate=True) and mxfp8 (KernelPreference.EMULATED). skip: layer names to keep in
    high precision, spelled into the snippet (torchtitan: filter_fqns, in the Python config and
    the command line; torchao: a SKIP set for the module filter; TransformerEngine: a comment).
    Unknown names raise ValueError.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; valid targets: {', '.join(TARGETS)}")
    names = (*RECIPES, *VARIANTS)
    if not isinstance(recipe, str) or recipe.strip().lower() not in names:
        raise ValueError(f"unknown recipe {recipe!r}; valid recipes: {', '.join(names)} (export takes names: "
                         "a recipe you built yourself has no counterpart in these libraries)")
    recipe = recipe.strip().lower()
    if emulate and target != "torchao":
        raise ValueError("emulate=True applies to target 'torchao' only")
    if isinstance(skip, str) or not all(isinstance(name, str) for name in skip):
        raise ValueError(f"skip is a list of layer names (as named_modules() names them), got {skip!r}")
    skip = tuple(skip)
    if target == "torchtitan":
        return _torchtitan(recipe, skip)
    e = _torchao(recipe, emulate) if target == "torchao" else _transformer_engine(recipe)
    if not (e.available and skip):
        return e
    names = ", ".join(repr(name) for name in skip)
    how = (f"SKIP = {{{names}}}  # keep in high precision\n"
           "# add `and fqn not in SKIP` to the module filter above (module_filter_fn / filter_fn)"
           if target == "torchao" else f"# keep these as torch.nn.Linear (do not build them as te.Linear): {names}")
    return dataclasses.replace(e, text=f"{e.text}\n{how}")


def export_table():
    """Which recipe each target has: DataFrame (recipe, target, available, differences)."""
    import pandas as pd

    rows = []
    for recipe in (*RECIPES, *VARIANTS):
        for target in TARGETS:
            e = export(recipe, target)
            rows.append({"recipe": recipe, "target": target, "available": e.available,
                         "differences": e.differences if e.available else e.text})
    return pd.DataFrame(rows)
