"""Packed (oneDNN-layout) linear layers give exactly what F.linear gives on the plain weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from worker.model.packed_linear import PackedLinear, pack_linears, packing_supported

pytestmark = pytest.mark.skipif(not packing_supported(torch.bfloat16, "cpu"), reason="no oneDNN bfloat16 on this CPU")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 16, 33, 200])
def test_packed_linear_matches_plain(rows, bias):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 72, generator=g).to(torch.bfloat16)
    b = torch.randn(96, generator=g).to(torch.bfloat16) if bias else None
    x = torch.randn(rows, 72, generator=g).to(torch.bfloat16)
    packed = PackedLinear(weight, b, batch_hint=128)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), F.linear(x, weight, b), rtol=0, atol=0)


def test_pack_linears_replaces_nested_layers():
    model = nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 8, bias=False))).to(torch.bfloat16)
    x = torch.randn(5, 8).to(torch.bfloat16)
    with torch.inference_mode():
        expected = model(x)
        assert pack_linears(model, batch_hint=32) == 2
        assert not any(isinstance(m, nn.Linear) for m in model.modules())
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
