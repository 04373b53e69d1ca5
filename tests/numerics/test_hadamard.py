"""fp8lab.numerics.hadamard: the random Hadamard transform's contract, against a float64 matrix product.

The transform inside NVFP4's wgrad GEMM and its recipe: tests/numerics/test_fp4_numerics.py.
"""

import math

import pytest
import torch

from fp8lab.numerics.hadamard import SIZES, RandomHadamard, hadamard_matrix


def test_sylvester_matrix_is_orthogonal_up_to_its_size_and_has_the_known_small_case():
    assert torch.equal(hadamard_matrix(2), torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64))
    for d in (4, 16, 64):
        h = hadamard_matrix(d)
        assert torch.equal(h @ h.T, d * torch.eye(d, dtype=torch.float64))
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard_matrix(12)


@pytest.mark.parametrize("size", SIZES[:3])
def test_apply_is_x_times_q_and_inverse_undoes_it(size):
    t = RandomHadamard(size, seed=3)
    x = torch.randn(5, 2 * size, generator=torch.Generator().manual_seed(1))
    q = t.matrix()
    assert torch.equal(q @ q.T, torch.eye(size, dtype=torch.float64))  # entries +-2^-k: exactly orthonormal
    expected = (x.double().reshape(-1, size) @ q).reshape(5, -1)
    torch.testing.assert_close(t.apply(x).double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(t.inverse(t.apply(x)), x, atol=1e-5, rtol=1e-5)  # float32 sums: close, not equal


def test_a_gemm_over_both_transformed_operands_keeps_the_product_and_padding_is_zeros():
    t = RandomHadamard(16, seed=0)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 40, generator=g), torch.randn(3, 40, generator=g)  # 40: padded to 48
    ta, tb = t.apply(a), t.apply(b)
    assert ta.shape == (4, 48)
    torch.testing.assert_close(ta.double() @ tb.double().T, a.double() @ b.double().T, atol=1e-4, rtol=1e-5)
    assert torch.equal(t.inverse(ta)[:, 40:], torch.zeros(4, 8))


def test_signs_follow_the_seed_and_bad_settings_are_refused():
    s0, s1 = RandomHadamard(16, 0).signs, RandomHadamard(16, 1).signs
    assert set(s0.tolist()) <= {-1.0, 1.0} and torch.equal(s0, RandomHadamard(16, 0).signs)
    assert not torch.equal(s0, s1)
    for bad in (8, 16.0, True):
        with pytest.raises(ValueError, match="Hadamard size"):
            RandomHadamard(bad)
    with pytest.raises(ValueError, match="seed"):
        RandomHadamard(16, -1)
    assert 1 / math.sqrt(64) == 2.0**-3  # why SIZES are powers of 4
