"""fp8lab.training.attention: MultiheadAttention's slow path with its projections routed (the conversion of whole
models is tested with fp8lab.training.convert)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from fp8lab.numerics.formats import E4M3
from fp8lab.numerics.quantize import quantize
from fp8lab.training.attention import FAST_PATH_SWITCHES, FP8MultiheadAttention, attention_forward
from fp8lab.training.convert import convert


def _mha(**kw) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    return nn.MultiheadAttention(16, 2, **kw).train()  # training mode: torch takes its slow path


def _inputs(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("batch_first", [False, True])
def test_with_plain_projections_it_is_torchs_slow_path_bit_for_bit(batch_first):
    mha = _mha(batch_first=batch_first, dropout=0.0)
    x = _inputs(3, 5, 16)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1) if batch_first else None
    for q, k, v in ((x, x, x), (x, x.flip(0), x.flip(0)), (x, x.flip(0), x * 2)):
        want, want_w = mha(q, k, v, attn_mask=mask)
        got, got_w = attention_forward(mha, q, k, v, attn_mask=mask)
        assert torch.equal(got, want) and torch.equal(got_w, want_w)


def test_each_in_projection_gemm_goes_through_project_by_part():
    mha = _mha(dropout=0.0)
    x, y, z = _inputs(4, 2, 16), _inputs(6, 2, 16), _inputs(6, 2, 16) * 3
    for (q, k, v), parts in (((x, x, x), ["qkv"]), ((x, y, y), ["q", "kv"]), ((x, y, z), ["q", "k", "v"])):
        seen = []

        def project(part, inp, weight, bias, seen=seen):
            seen.append((part, weight.shape[0]))
            return nn.functional.linear(inp, weight, bias)

        attention_forward(mha, q, k, v, project=project)
        widths = {"qkv": 48, "kv": 32, "q": 16, "k": 16, "v": 16}  # rows of in_proj_weight each part uses
        assert seen == [(p, widths[p]) for p in parts]


def test_converted_attention_projects_e4m3_casts_of_x_and_the_weight():
    mha = _mha(dropout=0.0)
    model = convert(nn.Sequential(mha), "tensorwise", backend="emulated", skip=["0.out_proj"])
    converted = model[0]
    assert isinstance(converted, FP8MultiheadAttention)
    x = _inputs(4, 2, 16)
    out, _ = converted(x, x, x)
    # by hand: the packed projection of E4M3 per-tensor casts of x and the weight, then torch's attention
    xq = quantize(x, E4M3).dequantize()
    wq = quantize(mha.in_proj_weight.detach(), E4M3).dequantize()

    def project(part, inp, weight, bias):
        assert part == "qkv"
        return nn.functional.linear(xq, wq, bias)

    plain = _mha(dropout=0.0)  # the same weights; out_proj kept in high precision on both sides
    ref, _ = attention_forward(plain, x, x, x, project=project)
    fp32, _ = plain(x, x, x)
    assert converted.fp8_in_proj.calls == 1
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert 0 < float((out - fp32).detach().norm() / fp32.detach().norm()) < 0.1  # FP8: close to fp32, not equal


def test_nested_inputs_are_refused_and_the_fast_path_switches_are_the_documented_ones():
    mha = _mha()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "prototype stage" notice
        nested = torch.nested.nested_tensor([torch.randn(2, 16), torch.randn(3, 16)])
    with pytest.raises(ValueError, match="NestedTensor"):
        attention_forward(mha, nested, nested, nested)
    assert FAST_PATH_SWITCHES[nn.TransformerEncoderLayer] == ("activation_relu_or_gelu", 0)
    assert FAST_PATH_SWITCHES[nn.TransformerEncoder] == ("use_nested_tensor", False)
