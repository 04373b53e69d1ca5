"""`bench train` (fp8lab/bench/train.py): each recipe's training step against fp32's on three models, one of them
none of the lab's toys; fp32 and the recipes take turns; a step that did not run its backward pass is said.
No time is judged: the tests check the models, the candidates and what the table reports.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch import nn

from fp8lab.bench import train as train_module
from fp8lab.bench.train import (
    MODELS,
    PARTS_NOTE,
    TARGET_RATIO,
    TIMED_RECIPES,
    Workload,
    bench_train,
    c_passes,
    make_workload,
)
from fp8lab.gemm import emulated_mm, quantize_operands
from fp8lab.numerics import kernels
from fp8lab.numerics.kernels_gemm import GEMM_KERNELS
from fp8lab.training.capstone import SINK_MAGNITUDE
from fp8lab.training.models import TinyTransformer, ToyMLP
from fp8lab.training.train import LESSON


def test_the_three_models_are_the_unseen_mlp_the_lessons_and_the_llm_like_one():
    assert MODELS == ("unseen_mlp", "lesson_mlp", "llm_like")
    assert TIMED_RECIPES == ("tensorwise", "delayed", "rowwise", "rowwise_with_gw_hp", "blockwise", "mxfp8", "nvfp4",
                             "nvfp4_training")
    assert TARGET_RATIO == 1.5
    unseen = make_workload("unseen_mlp")
    model = unseen.make()
    linears = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears == [(256, 512), (512, 256), (256, 8)] and unseen.x.shape == (256, 256)
    assert all(type(m).__module__.startswith("torch.") for m in model.modules()), "one of the lab's own modules"
    again = unseen.make()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    lesson = make_workload("lesson_mlp")
    assert isinstance(lesson.make(), ToyMLP) and lesson.x.shape[0] == LESSON.batch
    llm = make_workload("llm_like").make()
    assert isinstance(llm, TinyTransformer) and {b.sink.magnitude for b in llm.blocks} == {SINK_MAGNITUDE}
    with pytest.raises(ValueError, match="valid: unseen_mlp, lesson_mlp, llm_like"):
        make_workload("mlp")


def test_every_recipe_is_timed_against_fp32_on_the_unseen_mlp(capsys):
    rows = bench_train(rounds=1, consecutive=1, models=("unseen_mlp",))
    whats = [r["what"] for r in rows]
    assert whats[: 1 + len(TIMED_RECIPES)] == ["fp32", *TIMED_RECIPES]
    assert set(whats) - {"fp32", *TIMED_RECIPES} <= {"bf16", "tensorwise (torchao)"}
    for r in rows:
        assert r["model"] == "unseen_mlp" and r["ms/step"] > 0 and r["x fp32"] > 0
        assert r["cpu ms/step"] > 0 and r["cpu x fp32"] > 0  # (the calling thread's CPU time beside the wall clock)
        if r["what"] in TIMED_RECIPES:
            assert r["within 1.5x"] == ("yes" if r["x fp32"] <= TARGET_RATIO else "NO")
        else:
            assert r["within 1.5x"] == "-"
    assert next(r for r in rows if r["what"] == "fp32")["x fp32"] == 1.0
    assert next(r for r in rows if r["what"] == "fp32")["cpu x fp32"] == 1.0
    out = capsys.readouterr().out
    assert "unseen_mlp: MLP 256-512-256-8 (nn.Sequential), batch 256" in out and "reference: fp32 2048^3 mm" in out
    with pytest.raises(ValueError, match="unknown models"):
        bench_train(models=("toy",))


def test_a_step_whose_loss_is_not_finite_is_reported_not_passed_off_as_a_step(monkeypatch):
    def nan_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (pred - target).pow(2).mean() * math.nan

    def tiny(name: str) -> Workload:
        return Workload(name, "a tiny linear model whose loss is NaN", lambda: nn.Linear(32, 16),
                        torch.randn(8, 32), torch.randn(8, 16), nan_loss)

    monkeypatch.setattr(train_module, "make_workload", tiny)
    rows = bench_train(rounds=1, consecutive=2, models=("unseen_mlp",))
    assert rows and all(r["note"].endswith("steps with a non-finite loss (no backward)") for r in rows)


def test_the_table_covers_the_three_models_in_order(monkeypatch, capsys):
    """Every model of MODELS is run (each replaced by a tiny one here: their steps are timed above and by the
    benchmark), with every recipe, and titled in the table."""
    def tiny(name: str) -> Workload:
        return Workload(name, f"tiny stand-in for {name}", lambda: nn.Sequential(nn.Linear(32, 32), nn.GELU(),
                                                                                  nn.Linear(32, 16)),
                        torch.randn(8, 32), torch.randn(8, 16), nn.functional.mse_loss)

    monkeypatch.setattr(train_module, "make_workload", tiny)
    rows = bench_train(rounds=1, consecutive=1)
    assert list(dict.fromkeys(r["model"] for r in rows)) == list(MODELS)
    for name in MODELS:
        assert {r["what"] for r in rows if r["model"] == name} >= {"fp32", *TIMED_RECIPES}
    out = capsys.readouterr().out
    assert "unseen_mlp: tiny stand-in for unseen_mlp; lesson_mlp: tiny stand-in for lesson_mlp; llm_like:" in out


def test_c_passes_are_the_kernels_time_but_their_gemms():
    """c_passes(tally): the seconds of a kernel_times tally in passes over operands and outputs; a kernel that
    computes a GEMM (GEMM_KERNELS: the emulated GEMM's definition in C) does work fp32's matmuls do too."""
    assert GEMM_KERNELS == {"fp8lab_segment_mm"}
    assert c_passes(Counter({"fp8lab_quantize": 1.5, "fp8lab_segment_mm": 2.0, "fp8lab_widen": 0.25})) == 1.75
    assert c_passes(Counter()) == 0
    if not kernels.status()[0]:
        return
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 64, generator=g), torch.randn(64, 8, generator=g)  # (a[M, K] @ b[K, N])
    pair = quantize_operands(a, b, "nvfp4")
    with kernels.kernel_times() as tally:
        emulated_mm(*pair, emulation="reference")  # (E2M1 partial sums are exact: the definition's loop in C)
    assert "fp8lab_segment_mm" in tally
    assert c_passes(tally) == sum(seconds for name, seconds in tally.items() if name != "fp8lab_segment_mm")


def test_parts_time_each_steps_c_passes_and_give_each_recipes_floor(monkeypatch, capsys):
    """bench_train(parts=True): beside each row its C passes a step (the median over the rounds), and beside each
    recipe its floor, fp32's ms/step plus those passes over fp32's; nothing of it without `parts`."""
    def tiny(name: str) -> Workload:
        return Workload(name, "a tiny MLP", lambda: nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 16)),
                        torch.randn(8, 32), torch.randn(8, 16), nn.functional.mse_loss)

    monkeypatch.setattr(train_module, "make_workload", tiny)
    rows = bench_train(rounds=2, consecutive=1, models=("unseen_mlp",), parts=True)
    fp32 = next(r for r in rows if r["what"] == "fp32")
    for r in rows:
        if r["what"] in TIMED_RECIPES:
            assert r["C passes ms/step"] > 0 or not kernels.status()[0]  # (the recipes' quantize passes, in C)
            assert r["floor x fp32"] == pytest.approx((fp32["ms/step"] + r["C passes ms/step"]) / fp32["ms/step"])
            assert r["floor x fp32"] >= 1
        else:  # (fp32, bf16 and torchao's run none of fp8lab's kernels, and are held to no target)
            assert r["C passes ms/step"] == 0 and r["floor x fp32"] == "-"
    assert PARTS_NOTE in capsys.readouterr().out
    plain = bench_train(rounds=1, consecutive=1, models=("unseen_mlp",))
    assert not any("C passes ms/step" in r or "floor x fp32" in r for r in plain)
    assert PARTS_NOTE not in capsys.readouterr().out
