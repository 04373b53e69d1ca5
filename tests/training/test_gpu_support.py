"""fp8lab.training.gpu_support: which GEMMs run real on which GPU generation (no GPU needed: the decision is made
for a stated compute capability)."""

from __future__ import annotations

import pytest

from fp8lab.training.gpu_support import GPU_GENERATIONS, gemm_table, gpu_support_markdown

# what each generation's hardware and cuBLAS run: FP8 from sm_89; 1x128/128x128 blocks on Hopper only;
# MX (1x32, E8M0) and NVFP4 (1x16, E4M3) block scaling from Blackwell
REAL = {
    (8, 0): set(),
    (8, 9): {"tensorwise", "rowwise"},
    (9, 0): {"tensorwise", "rowwise", "blockwise"},
    (10, 0): {"tensorwise", "rowwise", "mxfp8", "nvfp4"},
}


@pytest.mark.parametrize("arch", list(REAL))
def test_each_generation_runs_real_what_its_hardware_supports(arch):
    rows = gemm_table(arch, "12.9", recipes=["tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"],
                      shape=(128, 128, 128))
    assert len(rows) == 5 * 3 and {r["gemm"] for r in rows} == {"fprop", "dgrad", "wgrad"}
    real = {r["recipe"] for r in rows if r["backend"] == "scaled_mm"}
    emulated = {r["recipe"] for r in rows if r["backend"] == "emulated"}
    assert real == REAL[arch]
    assert real.isdisjoint(emulated)  # a recipe's three GEMMs agree here
    assert all(f"sm_{arch[0]}{arch[1]}" in r["reason"] for r in rows)


def test_a_high_precision_gemm_is_named_and_the_kernel_of_a_real_one_given():
    rows = {r["gemm"]: r for r in gemm_table((9, 0), "12.9", recipes=["rowwise_with_gw_hp"], shape=(128, 128, 128))}
    assert rows["wgrad"]["backend"] == "high precision" and rows["wgrad"]["kernel"] == "-"
    assert rows["fprop"]["backend"] == "scaled_mm" and rows["fprop"]["kernel"] == "RowWise"


@pytest.mark.slow  # every recipe on every generation (seconds)
def test_the_markdown_table_has_a_row_per_generation_and_an_older_gpu():
    md = gpu_support_markdown().splitlines()
    assert len(md) == 3 + len(GPU_GENERATIONS)
    assert md[2].startswith("| none, or older than sm_89 |")
    hopper = next(line for line in md if line.startswith("| Hopper"))
    assert "blockwise" in hopper.split("|")[2] and "mxfp8" in hopper.split("|")[3]
