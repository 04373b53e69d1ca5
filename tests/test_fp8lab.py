"""fp8lab (the package's __init__): the public names a learner's code relies on, with the formats' defining
constants (OCP FP8: E4M3 bias 7, max 448; E5M2 bias 15, max 57344, infinities), the status line and setup().

Each name's behaviour in depth: the tests of its own module (tests/numerics/, tests/gemm/, tests/training/).
"""

import gc

import pytest
import torch

import fp8lab


def test_every_public_name_is_there():
    for name in fp8lab.__all__:
        assert hasattr(fp8lab, name), name
    assert set(fp8lab.RECIPES) == {"tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4"}
    assert callable(fp8lab.nn.layer_gemms) and callable(fp8lab.inspect)


def test_the_formats_constants_are_the_specifications():
    e4, e5 = fp8lab.E4M3, fp8lab.E5M2
    assert (e4.exponent_bits, e4.mantissa_bits, e4.bias, e4.max_value) == (4, 3, 7, 448.0)
    assert (e4.min_normal, e4.min_subnormal, e4.has_inf) == (2.0**-6, 2.0**-9, False)
    assert (e5.exponent_bits, e5.mantissa_bits, e5.bias, e5.max_value) == (5, 2, 15, 57344.0)
    assert (e5.min_normal, e5.min_subnormal, e5.has_inf) == (2.0**-14, 2.0**-16, True)
    assert fp8lab.E2M1.values().abs().unique().tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert e4.torch_dtype == torch.float8_e4m3fn and e5.torch_dtype == torch.float8_e5m2


def test_the_front_door_quantizes_and_multiplies():
    x = torch.tensor([[448.0, -1.0], [0.5, 2.0**-9]])
    q = fp8lab.quantize(x, fp8lab.E4M3, fp8lab.PerTensor())
    assert float(q.scale) == 1.0 and torch.equal(q.dequantize(), x)  # every value is an E4M3 value
    assert torch.equal(fp8lab.cast(torch.tensor([1.0625, 500.0]), fp8lab.E4M3), torch.tensor([1.0, 448.0]))
    out = fp8lab.matmul(x, 448 * torch.eye(2), "tensorwise", backend="emulated", verbose=False)
    assert torch.equal(out, 448 * x)  # scales 1 and 1: exact products


def test_status_line():
    line = fp8lab.status_line()
    assert line.startswith(f"fp8lab {fp8lab.__version__} | torch {torch.__version__} | ")
    assert len(line.splitlines()) == 2


@pytest.mark.slow  # the lab's plot theme loads matplotlib and seaborn: seconds on a loaded machine
def test_setup_seeds_torch_and_prints_the_status_line(capsys):
    try:
        fp8lab.setup(seed=7, quiet=True)
        assert capsys.readouterr().out == ""
        drawn = torch.rand(3)
        torch.manual_seed(7)
        assert torch.equal(drawn, torch.rand(3))  # setup seeded torch's global generator
        fp8lab.setup(seed=7)
        assert capsys.readouterr().out.strip() == fp8lab.status_line()
    finally:
        gc.unfreeze()
