"""The notebooks: stripped in git, import-only, exercises present, and they run top to
bottom without errors: at workshop size (marked slow; timed, memory-capped and checked by
tests/notebook_checks.py) and in smoke mode. Where the browser test runs a notebook (at workshop
size, in JupyterLab), both nbclient runs of it are deselected (tests/conftest.py)."""

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.notebook_checks import after_run_code, check_after_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]


def test_the_notebook_plan_is_complete():
    expected = ["00_setup_check", "01_fp8_formats", "02_per_tensor_scaling", "03_delayed_scaling",
                "04_per_block_scaling", "05_fp8_gemm", "06_training_live", "07_beyond_one_machine", "08_your_model",
                "09_below_eight_bits"]
    assert [n for n in NAMES if n in expected] == [n for n in expected if n in NAMES]
    assert set(expected) - {"07_beyond_one_machine"} <= set(NAMES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_committed_stripped(path):
    raw = json.loads(path.read_text())
    assert "widgets" not in raw.get("metadata", {}), "widget state must not be committed"
    for cell in raw["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, "outputs must be stripped"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_notebooks_import_and_define_nothing_reusable(path):
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    # the first cell: a guarded pip install where fp8lab is missing (tools/links.py writes it; no shell, no magic:
    # tests/hygiene/test_first_cell.py), then the setup call
    assert code[0].endswith("\nimport fp8lab\nfp8lab.setup()"), "the first cell ends with the setup call"
    assert not re.search(r"^\s*[!%]", code[0], re.M), "no shell or magic line in the first cell"
    for src in code[1:]:
        assert not re.search(r"^\s*[!%]", src, re.M), "no shell or magic cells (no !pip)"
        assert "sys.path" not in src
        # functions are only defined as exercise answers, right before their checker
        if re.search(r"^(def|class) ", src, re.M):
            assert "ex.check_" in src, f"a definition outside an exercise: {src[:60]!r}"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert "## Summary" in text
    assert "**Next:**" in text


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem[:2] in {"01", "02", "03", "04", "05", "06", "08",
                                                                          "09"}],
                         ids=lambda p: p.stem)
def test_every_workshop_notebook_has_an_exercise_with_a_hint_and_a_solution(path):
    src = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    assert "ex.check_" in src and "ex.hint_" in src and "ex.solution_" in src


def test_the_four_best_practices_are_taught():
    text = "\n".join(c.source for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells).lower()
    for practice in ("experiment on small data first", "monitor per layer", "tune scale factors during training",
                     "normalize your data"):
        assert practice in text, practice


def _execute(path: Path, smoke: bool) -> tuple[nbformat.NotebookNode, float]:
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(after_run_code(path.stem)))
    env_before = os.environ.get("FP8LAB_SMOKE")
    os.environ["FP8LAB_SMOKE"] = "1" if smoke else "0"
    try:
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        t0 = time.perf_counter()
        client.execute()
        return nb, time.perf_counter() - t0
    finally:
        if env_before is None:
            os.environ.pop("FP8LAB_SMOKE", None)
        else:
            os.environ["FP8LAB_SMOKE"] = env_before


def _errors(nb) -> list[str]:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"{o['ename']}: {o['evalue']}")
            elif o.get("output_type") == "stream" and o.get("name") == "stderr" and "Traceback" in o.get("text", ""):
                out.append(o["text"][:500])
    return out


def _last_output(nb) -> str:
    return "".join(o.get("text", "") for o in nb.cells[-1].outputs)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_runs_top_to_bottom_in_smoke_mode(path):
    nb, _ = _execute(path, smoke=True)
    assert not _errors(nb), _errors(nb)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_runs_at_workshop_size_under_1_5_gb_with_its_claims(path, record_property):
    nb, seconds = _execute(path, smoke=False)
    assert not _errors(nb), _errors(nb)
    record_property("seconds", seconds)
    record_property("peak_mb", check_after_run(path.stem, _last_output(nb), seconds))


# ---- what the notebooks say: each claim pinned, and the wrong wording it must not carry -----------------------


def _cells(stem: str) -> list:
    return nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells


def _text(stem: str) -> str:
    return " ".join(" ".join(c.source.split()) for c in _cells(stem))


def _index(stem: str, needle: str) -> int:
    return next(i for i, c in enumerate(_cells(stem)) if needle in c.source)


def test_00_does_not_assume_bf16_is_faster():
    t = _text("00_setup_check")
    assert "gap between fp32 and bf16 grows or shrinks" not in t
    assert "Is bf16 faster or slower than fp32 on this machine" in t and "slower* than fp32" in t


def test_01_says_which_recipes_use_e4m3_for_gradients_and_states_precision_as_numbers():
    t = _text("01_fp8_formats")
    assert "| gradients (more range) |" not in t
    assert "gradients too in the fine-grained recipes (rowwise, blockwise, mxfp8)" in t
    assert "6.02 dB" in t and "12.5%" in t and "fp8lab.sqnr(x, fp8lab.cast(x, fmt))" in t  # computed beside it


def test_02_does_not_credit_normalization_layers_with_per_channel_scales():
    t = _text("02_per_tensor_scaling")
    assert "Normalization layers (and normalized inputs) keep them there" not in t
    assert "normalize each *token* (a row), not each channel" in t
    assert "raise the SQNR of the ordinary channels" in t  # the question asks for the number that moves


def test_03_margin_question_has_an_answer_and_torchao_is_quoted():
    t = _text("03_delayed_scaling")
    assert "With drift 0.05, what is the smallest margin that stops the clipping?" not in t
    assert "Set the spike to 1x (no spike) and the drift to 0.05" in t
    assert "current scaling became cheap enough" not in t
    assert "lack of real world use cases" in t
    # the deprecation's pull request (a warning) and the deletion's, each linked as itself
    assert "github.com/pytorch/ao/pull/1681" in t and "github.com/pytorch/ao/pull/1753" in t
    assert "the deletion's pull request" in t
    assert "TE starts from scale 1" in t


def test_04_floor_rule_text_points_at_clipping_not_sqnr():
    t = _text("04_per_block_scaling")
    assert "floor often scores the *higher* SQNR" in t and "clips each block's largest values" not in t
    assert "which clips only where m is above 1.75" in t and "floor and rceil give the *same* scale" in t


def test_05_names_when_outliers_hurt_and_quotes_deepseek_with_its_measure():
    t = _text("05_fp8_gemm")
    assert "At 100x outliers the recipes barely differ; at 1e5 they do." not in t
    assert "b's rows for those channels** to zero" in t
    assert "same sign" in t and "maximum relative error of nearly 2%" in t and "**Error of**" in t
    assert "DeepSeek's ~2%, measured on real GEMMs, lies between the two" not in t
    assert "use_fast_accum" in t and "use_split_accumulator" in t  # the knobs, and which one the emulation is
    assert "no `dequantize()`" in t  # exercise 05 cannot be passed by dequantizing
    # DeepSeek's ISCA '25 paper (arXiv 2505.09343, section 3.1.1), quoted as it writes it, beside the two readings
    assert "arxiv.org/abs/2505.09343" in t
    assert ('"After aligning 32 mantissa products by right-shifting based on the maximum exponent, the Tensor Core '
            'only maintains their highest 13 fraction bits for addition, and truncates bits exceeding this range. '
            'Addition results are accumulated to FP22 registers (1 sign bit, 8 exponent bits, and 13 mantissa '
            'bits)"') in t
    assert "leans towards the group reading" in t


def test_06_exercise_comes_before_the_cell_that_answers_it():
    stem = "06_training_live"
    exercise = _index(stem, "ex.check_survivors")
    assert exercise < _index(stem, "TrainingCliffPanel()")
    before = " ".join(c.source for c in _cells(stem)[:exercise])
    assert "lose only the block" not in before and "TrainingCliffPanel" not in before
    for check in ("ex.check_history", "ex.check_ranking"):
        assert _index(stem, check) > 0


@pytest.mark.parametrize("stem,prediction,panel", [
    ("01_fp8_formats", 'Prediction("format_binades")', "NumberLinePanel()"),
    ("02_per_tensor_scaling", 'Prediction("per_tensor_flush")', "PerTensorPanel()"),
    ("03_delayed_scaling", 'Prediction("spike_linger")', "DelayedPanel()"),
    ("04_per_block_scaling", 'Prediction("block_gain")', "BlockPanel()"),
    ("05_fp8_gemm", 'Prediction("sink_gemm")', "GemmPanel()"),
    ("06_training_live", 'Prediction("sink_break")', "TrainingCliffPanel()"),
    ("06_training_live", 'Prediction("sink_break")', "ex.check_survivors(answer)"),
    ("06_training_live", 'Prediction("sink_break")', "panel"),
    ("07_beyond_one_machine", 'Prediction("step0_ranks")', "reduced = compare"),
    ("09_below_eight_bits", 'Prediction("dy_flush")', "GradientPanel()"),
    ("09_below_eight_bits", 'Prediction("fp4_gap")', "PartsPanel()"),
    ("09_below_eight_bits", 'Prediction("sum_bias")', "SumRoundingPanel()")])
def test_a_prediction_comes_before_the_panel_that_reveals_it(stem, prediction, panel):
    cells = _cells(stem)
    p = next(i for i, c in enumerate(cells) if prediction in c.source)
    reveal = next(i for i, c in enumerate(cells) if c.source.strip().endswith(panel) or
                  (c.cell_type == "code" and panel.endswith("compare") and panel in c.source))
    assert p < reveal


# ---- sources, words and pointers ------------------------------------------------------------------------------

# a source a notebook names -> the address it must link in the same notebook
SOURCES = {
    "DeepSeek-V3": ("arxiv.org/abs/2412.19437",),
    "OCP": ("opencompute.org/documents/",),
    "FP8 Formats for Deep Learning": ("arxiv.org/abs/2209.05433",),
    "SmoothQuant": ("arxiv.org/abs/2211.10438",),
    "Per-Tensor and Per-Block Scaling Strategies for Effective FP8 Training":
        ("developer.nvidia.com/blog/per-tensor-and-per-block-scaling-strategies-for-effective-fp8-training",),
    "primer": ("TransformerEngine/blob/main/docs/examples/fp8_primer.ipynb",),
    "TransformerEngine": ("nvidia.github.io/TransformerEngine", "github.com/NVIDIA/TransformerEngine"),
    "Pretraining Large Language Models with NVFP4": ("arxiv.org/abs/2509.25149",),
    "NVFP4 paper": ("arxiv.org/abs/2509.25149",),
    "Microscaling FP4 Quantization": ("arxiv.org/abs/2509.23202",),
}


def _markdown(path: Path) -> str:
    return " ".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_every_source_is_linked_where_a_notebook_uses_it(path):
    text = _markdown(path)
    for name, addresses in SOURCES.items():
        if name in text:
            assert any(a in text for a in addresses), f"{path.stem} names {name} without linking it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_the_article_is_never_called_the_seed(path):
    text = " ".join(c.source for c in nbformat.read(path, as_version=4).cells)
    assert not re.search(r"\bseed's\b|\bthe seed\b(?! \d)", text, re.I), path.stem


def test_08_names_and_links_the_article_and_says_what_its_verdicts_rest_on():
    t = _text("08_your_model")
    assert "NVIDIA's article [Per-Tensor and Per-Block Scaling Strategies for Effective FP8 Training](" in t
    assert "60 training steps" in t and "not that it diverged" in t


def test_00_and_05_point_to_the_gpu_table_and_00_says_what_the_emulation_equals():
    for stem in ("00_setup_check", "05_fp8_gemm"):
        t = _text(stem)
        assert "](../docs/gpu.md)" in t and "README's GPU table" not in t and "the README has the GPU table" not in t
    t = _text("00_setup_check")
    assert "The numbers are the same; only the speed differs." not in t
    assert "`use_fast_accum=False`" in t and "`use_split_accumulator=True`" in t
    assert "## Where FP8 sits in a training step" in t  # before anything else is taught


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_long_runs_show_their_progress(path):
    """Progress bars are on by default (fp8lab.progress): no notebook turns them off."""
    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "progress=False" not in code


def test_04_reveals_the_predictions_options_only_after_the_question():
    cells = _cells("04_per_block_scaling")
    prediction = _index("04_per_block_scaling", 'Prediction("block_gain")')
    table = _index("04_per_block_scaling", "block_table()")
    assert prediction < table
    before = " ".join(c.source for c in cells[:prediction])
    assert "ordinary_sqnr_db" not in before and "PerRow()" not in before


def test_the_scale_is_said_to_be_the_reciprocal_of_transformer_engines():
    for stem in ("02_per_tensor_scaling", "07_beyond_one_machine"):
        assert "FP8_MAX / amax" in _text(stem), stem


def test_09_quotes_its_sources_exactly_and_says_where_the_toy_differs():
    """Notebook 09's quotes, as its sources write them (TransformerEngine's NVFP4 documentation and recipe, the FP8
    formats paper, the NVFP4 paper's abstract), each beside its link; and the gap the toy shows is said to be the
    forward pass's, not the paper's."""
    t = _text("09_below_eight_bits")
    for quote in ('"E4M3 for weight and activation tensors, and E5M2 for gradient tensors"',
                  '"to ensure that rowwise and columnwise quantized tensors are numerically equivalent"',
                  '"Stochastic rounding is enabled only for gradients"',
                  '"RHT is applied to columnwise quantization of inputs and gradients, which are operands for the '
                  '**wgrad GEMM**"',
                  '"integrates Random Hadamard transforms (RHT) to bound block-level outliers, employs a '
                  'two-dimensional quantization scheme for consistent representations across both the forward '
                  'and backward passes, utilizes stochastic rounding for unbiased gradient estimation, and '
                  'incorporates selective high-precision layers"',
                  '"training loss and downstream task accuracies comparable to an FP8 baseline"',
                  '"attains an MMLU-pro accuracy of 62.58%, nearly matching the 62.62% accuracy achieved through FP8 '
                  'pretraining"'):
        assert quote in t, quote
    for link in ("arxiv.org/abs/2509.25149", "arxiv.org/abs/2209.05433", "arxiv.org/abs/2412.19437",
                 "TransformerEngine/blob/main/docs/features/low_precision_training/nvfp4/nvfp4.rst"):
        assert link in t, link
    assert "high-precision forward" in t and "forward pass's 4-bit noise" in t



def test_09_says_what_the_paper_and_transformer_engine_keep_and_labels_fp8labs_share_as_its_own():
    """The layers kept in high precision: the NVFP4 paper quoted as its abstract writes it, TransformerEngine's switch
    quoted with its link, fp8lab's 15%-last labelled as fp8lab's choice; convert's keep_first_last names its source;
    the text credits fc1's gain to its forward pass (the split), not to its weight-gradient error."""
    import inspect

    from fp8lab.nn import convert

    t = _text("09_below_eight_bits")
    assert '"incorporates selective high-precision layers"' in t and "**fp8lab's own choice**" in t
    assert '"Use bf16 for first and last N layers."' in t and "tests/pytorch/distributed/run_layer_with_overlap.py" in t
    assert "fp8lab's setting" not in t and "points at fc1 here" not in t
    assert "fc1's forward in high precision closes nearly all of it" in t and "ex.check_fc1_split(forward, wgrad)" in t
    doc = inspect.getdoc(convert)
    assert "as practitioners do" not in doc and '"Use bf16 for first and last N layers."' in doc
