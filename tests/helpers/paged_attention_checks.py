"""The Mojo paged-attention kernel against the torch reference over the same pages, for the kernels' tests."""

from __future__ import annotations

import torch

from kernels import attention as mojo_attention
from kernels.reference import attention as reference


def assert_kernel_matches_reference(module, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan,
                                    ref_plan, scale: float, atol: float, rtol: float) -> None:
    """The kernel on this thread and on torch's OpenMP team, its output poisoned with NaN first (an element it
    forgets to write fails), within atol/rtol of the reference."""
    expected = reference.paged_attention(query, k_cache, v_cache, ref_plan, scale)
    for threading in mojo_attention.THREADINGS:
        out = torch.full_like(query, float("nan"))
        mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, scale, out=out, threading=threading)
        assert not out.isnan().any(), "an output element was never written"
        torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=rtol)
