"""Rotary embedding: both layouts against the conventions users know (transformers' rotate_half for NeoX,
GPT-J's interleaved pairs), in place = out of place, the inverse undoes the rotation, bad input is named."""
from __future__ import annotations

import pytest
import torch

from hk_portable.interface import ArgumentError
from hk_portable.kernels.rotary import rotary, tables


def _x(shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _rotate_half(t):
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def test_neox_is_transformers_rotate_half():
    x = _x((2, 9, 3, 64)).double()                                  # [B, N, H, D]
    cos, sin = tables(20, 64)
    c = torch.cat((cos[4:13], cos[4:13]), -1).double()[None, :, None, :]
    s = torch.cat((sin[4:13], sin[4:13]), -1).double()[None, :, None, :]
    expect = x * c + _rotate_half(x) * s
    got = rotary(x.float(), cos, sin, layout="neox", offset=4)
    assert torch.allclose(got.double(), expect, atol=1e-5)


def test_gptj_rotates_interleaved_pairs():
    x = _x((1, 5, 2, 32)).double()
    cos, sin = tables(5, 32)
    xc = torch.view_as_complex(x.view(1, 5, 2, 16, 2).contiguous())
    rot = torch.polar(torch.ones(5, 16, dtype=torch.float64), torch.atan2(sin.double(), cos.double()))
    expect = torch.view_as_real(xc * rot[None, :, None, :]).reshape(1, 5, 2, 32)
    assert torch.allclose(rotary(x.float(), cos, sin, layout="gptj").double(), expect, atol=1e-5)


@pytest.mark.parametrize("layout", ["neox", "gptj"])
def test_in_place_equals_out_of_place_and_inverse_undoes(layout):
    x = _x((2, 3, 33, 128), torch.bfloat16, seed=1)
    cos, sin = tables(40, 128)
    y = rotary(x, cos, sin, layout=layout, heads_first=True, offset=7)
    z = x.clone()
    assert rotary(z, cos, sin, layout=layout, heads_first=True, offset=7, inplace=True) is z
    assert torch.equal(z, y)
    back = rotary(y.float(), cos, sin, layout=layout, heads_first=True, offset=7, inverse=True)
    assert (back - x.float()).abs().max() < 0.05                     # bf16 rounding of y, then rotated back


@pytest.mark.parametrize("call,match", [
    (lambda x, c, s: rotary(x[0], c, s), r"'x' must be a 4-D tensor"),
    (lambda x, c, s: rotary(x.int(), c, s), r"'x' must be bfloat16, float16 or float32"),
    (lambda x, c, s: rotary(x, c, s, layout="llama"), r"layout must be one of"),
    (lambda x, c, s: rotary(x, c[:3], s), r"'cos' must be \[>= offset \+ N = 8, D/2 = 32\]"),
    (lambda x, c, s: rotary(x, c.double(), s), r"'cos' must be a float32 table"),
    (lambda x, c, s: rotary(x, c, s, offset=-1), r"'offset' must be an int >= 0"),
    (lambda x, c, s: rotary(x, c, s, inplace=True, out=x), r"either inplace=True or out="),
    (lambda x, c, s: rotary(x, c, s, out=x[..., :32]), r"'out' must be \(1, 8, 2, 64\)"),
    (lambda x, c, s: rotary(x[..., :48], c, s), r"head dim D must be"),
])
def test_bad_input_is_named(call, match):
    x = _x((1, 8, 2, 64))
    cos, sin = tables(8, 64)
    with pytest.raises(ArgumentError, match=match):
        call(x, cos, sin)
