"""fp8lab.export: torchao configs that construct and train; TransformerEngine and torchtitan
texts that name the right classes and fields; unavailable pairs that say so."""

import dataclasses
import re

import pytest
import torch

import fp8lab
from fp8lab.numerics.recipes import RECIPES, TORCHAO_RECIPES, VARIANTS
from fp8lab.training.export import TARGETS, export, export_table
from fp8lab.training.models import TeacherTask, make_model

ALL = (*RECIPES, *VARIANTS)

# (recipe, target) pairs the target lacks, and a word its explanation must contain
UNAVAILABLE = {
    ("delayed", "torchao"): "1680",  # pytorch/ao#1680 removed delayed scaling
    ("delayed", "torchtitan"): "1680",
    ("rowwise", "transformer_engine"): "per-row",
    ("rowwise_with_gw_hp", "transformer_engine"): "per-row",
    ("blockwise", "torchtitan"): "blockwise",
}

# TransformerEngine's recipe classes and their dataclass fields, read from
# NVIDIA/TransformerEngine transformer_engine/common/recipe/__init__.py @ 000b637e
TE_FIELDS = {
    "DelayedScaling": {"margin", "fp8_format", "amax_history_len", "amax_compute_algo",
                       "scaling_factor_compute_algo", "reduce_amax", "fp8_dpa", "fp8_mha", "backward_override"},
    "Float8CurrentScaling": {"use_power_2_scales", "fp8_format", "fp8_quant_fwd_inp", "fp8_quant_fwd_weight",
                             "fp8_quant_bwd_grad", "fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad", "fp8_dpa",
                             "fp8_mha", "backward_override"},
    "Float8BlockScaling": {"use_f32_scales", "fp8_format", "fp8_quant_fwd_inp", "fp8_quant_fwd_weight",
                           "fp8_quant_bwd_grad", "x_block_scaling_dim", "w_block_scaling_dim",
                           "grad_block_scaling_dim", "fp8_gemm_fprop", "fp8_gemm_dgrad", "fp8_gemm_wgrad",
                           "fp8_dpa", "fp8_mha", "backward_override"},
    "MXFP8BlockScaling": {"margin", "fp8_format", "fp8_dpa", "fp8_mha", "backward_override"},
    "NVFP4BlockScaling": {"disable_rht", "disable_stochastic_rounding", "disable_2d_quantization",
                          "row_scaled_activation", "fp4_format", "fp8_format", "fp8_dpa", "fp8_mha",
                          "backward_override"},
}
# recipe -> (TE class, arguments fp8lab's recipe fixes); same source
TE_TABLE = {
    "tensorwise": ("Float8CurrentScaling", {"fp8_format": "Format.HYBRID"}),
    "delayed": ("DelayedScaling", {"fp8_format": "Format.HYBRID", "amax_history_len": "16",
                                   "amax_compute_algo": '"max"', "margin": "0"}),
    "blockwise": ("Float8BlockScaling", {"fp8_format": "Format.E4M3", "x_block_scaling_dim": "1",
                                         "w_block_scaling_dim": "2", "grad_block_scaling_dim": "1"}),
    "mxfp8": ("MXFP8BlockScaling", {"fp8_format": "Format.E4M3"}),
    "nvfp4": ("NVFP4BlockScaling", {"disable_rht": "True", "disable_stochastic_rounding": "True"}),
    # TE's NVFP4 defaults (NVFP4BlockScaling @ d0067d0d): all three parts on; spelled out against NVTE_* variables
    "nvfp4_training": ("NVFP4BlockScaling", {"disable_rht": "False", "disable_stochastic_rounding": "False",
                                             "disable_2d_quantization": "False"}),
}
# recipe -> strings the torchtitan text must hold. Command line: pytorch/torchtitan
# torchtitan/config/job_config.py @ 000204a4 (Model.converters; Float8.recipe_name in
# tensorwise / rowwise / rowwise_with_gw_hp; MX.recipe_name "mxfp8"). Python configs:
# torchtitan/components/quantization/float8.md @ 026c75f2, mxfp8.md @ 3a8415c4, nvfp4.py @ 0bf8762e.
TITAN_TABLE = {
    "tensorwise": ["--model.converters float8", "--float8.recipe_name tensorwise",
                   "--float8.enable_fsdp_float8_all_gather", 'Float8LinearConverter.Config(recipe_name="tensorwise"'],
    "rowwise": ["--model.converters float8", "--float8.recipe_name rowwise",
                'Float8LinearConverter.Config(recipe_name="rowwise")'],
    "rowwise_with_gw_hp": ["--float8.recipe_name rowwise_with_gw_hp",
                           'Float8LinearConverter.Config(recipe_name="rowwise_with_gw_hp")'],
    "mxfp8": ["--model.converters mx", "--mx.recipe_name mxfp8",
              'MXFP8LinearConverter.Config(recipe_name="mxfp8_rceil")'],
    "nvfp4": ["NVFP4LinearConverter.Config("],
    "nvfp4_training": ["NVFP4LinearConverter.Config(", "leave out the last 15% of linear layers"],
}


def test_every_pair_answers_and_the_table_agrees():
    table = export_table()
    assert len(table) == len(ALL) * len(TARGETS)
    for row in table.itertuples():
        assert row.available == ((row.recipe, row.target) not in UNAVAILABLE)


@pytest.mark.parametrize("pair, word", UNAVAILABLE.items())
def test_unavailable_pairs_say_why(pair, word):
    e = export(*pair)
    assert not e.available and word in e.text
    assert "unavailable" in str(e)
    with pytest.raises(ValueError, match="has no"):
        _ = e.config


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="valid targets: torchao"):
        export("tensorwise", "jax")
    with pytest.raises(ValueError, match="valid recipes: tensorwise"):
        export("tensorwize", "torchao")
    with pytest.raises(ValueError, match="torchao"):
        export("tensorwise", "torchtitan", emulate=True)


def test_fp8lab_exports_export():
    assert fp8lab.export is export


# ---- torchao ----------------------------------------------------------------------------------------------------


def test_torchao_configs_match_the_recipes():
    from torchao.float8.config import ScalingGranularity, ScalingType
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization.quantize_.common import KernelPreference

    assert export("tensorwise", "torchao").config.cast_config_input.scaling_granularity is ScalingGranularity.TENSORWISE
    rowwise = export("rowwise", "torchao").config
    assert rowwise.cast_config_input.scaling_granularity is ScalingGranularity.AXISWISE
    assert rowwise.round_scales_to_power_of_2 and not rowwise.emulate
    gw_hp = export("rowwise_with_gw_hp", "torchao").config
    assert gw_hp.cast_config_input_for_grad_weight.scaling_type is ScalingType.DISABLED
    mx = export("mxfp8", "torchao").config
    assert mx.scale_calculation_mode == ScaleCalculationMode.RCEIL  # fp8lab's mxfp8 rounds scales up too
    assert mx.kernel_preference == KernelPreference.AUTO
    assert export("mxfp8", "torchao", emulate=True).config.kernel_preference == KernelPreference.EMULATED
    assert export("tensorwise", "torchao", emulate=True).config.emulate
    assert type(export("nvfp4", "torchao").config).__name__ == "NVFP4TrainingConfig"
    # nvfp4_training: the one sign vector fp8lab's Hadamard transform uses, for every layer (torchao's default
    # draws one per layer)
    from fp8lab.numerics.recipes import NVFP4_HADAMARD

    training = export("nvfp4_training", "torchao")
    assert tuple(training.config.rht_sign_vector) == tuple(int(v) for v in NVFP4_HADAMARD.signs.tolist())
    assert repr(tuple(training.config.rht_sign_vector)) in training.text


def test_torchao_gpu_only_prototypes_explain_themselves():
    with pytest.raises(ValueError, match="no emulation"):
        _ = export("blockwise", "torchao", emulate=True).config
    with pytest.raises(ValueError, match="no emulation"):
        _ = export("nvfp4", "torchao", emulate=True).config
    try:
        import triton  # noqa: F401
    except ImportError:  # this machine: the prototype imports triton, a CUDA-only package
        with pytest.raises(ImportError, match="triton"):
            _ = export("blockwise", "torchao").config


def _one_step(model: torch.nn.Module) -> float:
    task = TeacherTask()
    x, y = task.batch(torch.Generator().manual_seed(0), 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss = task.loss(model(x).float(), y)
    loss.backward()
    opt.step()
    return loss.item()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_torchao_float8_config_trains_a_step(recipe):
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    e = export(recipe, "torchao", emulate=True)  # emulate: this CPU has no FP8 GEMM
    model = make_model("mlp")
    before = model.fc2.weight.detach().clone()
    def dims_of_16(mod, fqn):
        return mod.in_features % 16 == 0 and mod.out_features % 16 == 0

    convert_to_float8_training(model, config=e.config, module_filter_fn=dims_of_16)
    assert isinstance(model.fc2, Float8Linear)
    assert torch.isfinite(torch.tensor(_one_step(model)))
    assert not torch.equal(model.fc2.weight.detach(), before)
    assert dataclasses.replace(e.config, emulate=False) == export(recipe, "torchao").config


def test_torchao_mxfp8_config_trains_a_step():
    """torchao's MX training runs on the CPU with KernelPreference.EMULATED (measured here)."""
    from torchao.prototype.moe_training.tensor import MXFP8TrainingWeightWrapperTensor
    from torchao.quantization import quantize_

    model = make_model("mlp")
    quantize_(model, export("mxfp8", "torchao", emulate=True).config,
              filter_fn=lambda mod, fqn: isinstance(mod, torch.nn.Linear)
              and mod.in_features % 32 == 0 and mod.out_features % 32 == 0)
    assert isinstance(model.fc2.weight.data, MXFP8TrainingWeightWrapperTensor)
    assert not isinstance(model.fc3.weight.data, MXFP8TrainingWeightWrapperTensor)  # 8 outputs: not a block of 32
    assert torch.isfinite(torch.tensor(_one_step(model)))


# ---- TransformerEngine and torchtitan: text -------------------------------------------------------------------


@pytest.mark.parametrize("recipe", TE_TABLE)
def test_transformer_engine_text_names_the_class_and_real_fields(recipe):
    cls, args = TE_TABLE[recipe]
    e = export(recipe, "transformer_engine")
    assert e.available and e.config is None
    call = re.search(rf"recipe = {cls}\((.*)\)", e.text)
    assert call, e.text
    given = dict(part.split("=", 1) for part in call.group(1).split(", "))
    assert set(given) <= TE_FIELDS[cls]
    assert {k: given.get(k) for k in args} == args
    assert f"from transformer_engine.common.recipe import Format, {cls}" in e.text
    assert "te.autocast(enabled=True, recipe=recipe)" in e.text and "te.fp8_autocast(" in e.text


@pytest.mark.parametrize("recipe", TITAN_TABLE)
def test_torchtitan_text_names_the_flags(recipe):
    e = export(recipe, "torchtitan")
    assert e.available
    for needle in TITAN_TABLE[recipe]:
        assert needle in e.text, (needle, e.text)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("recipe", ALL)
def test_every_snippet_is_python(recipe, target):
    """Every snippet parses as Python, for every recipe: torchtitan's command-line flags, mixed in, would
    make it invalid Python, so they are a comment there and a shell line of their own (Export.command_line)."""
    import ast
    import shlex

    e = export(recipe, target)
    if not e.available:
        return
    ast.parse(e.text)
    if target == "torchtitan" and e.command_line:
        converter = "float8" if recipe in TORCHAO_RECIPES else "mx"
        assert shlex.split(e.command_line)[:2] == ["--model.converters", converter]
        assert e.command_line in e.text  # (shown in the Python snippet's comment)


def test_the_reports_skip_list_is_python_and_quoted_for_every_target():
    """The readiness report's export is Python for every target, with the skipped layer names quoted, and
    torchtitan's flags are a command line of their own. Layer names here need quoting (a space, a quote)."""
    import ast
    import shlex

    from torch import nn

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({"in proj": nn.Linear(32, 64), "out's": nn.Linear(64, 32)})

        def forward(self, x):
            return self.layers["out's"](torch.relu(self.layers["in proj"](x)))

    report = fp8lab.inspect(Named(), torch.randn(16, 32), recipes=("tensorwise",), target_db=1000.0)
    skip = report.skip("tensorwise")
    assert skip == ["layers.in proj", "layers.out's"]
    for target in TARGETS:
        text = report.export(target, "tensorwise")
        ast.parse(text)
        for name in skip:
            assert repr(name) in text, (target, name)
    line = export("tensorwise", "torchtitan", skip=skip).command_line
    assert shlex.split(line)[-2:] == ["--float8.filter_fqns", ",".join(skip)]
    with pytest.raises(ValueError, match="list of layer names"):
        export("tensorwise", "torchao", skip="fc1")
