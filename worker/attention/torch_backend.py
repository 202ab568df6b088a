"""The torch attention backend: the reference kernels (kernels/reference/attention.py), exact and portable,
the oracle for every other backend."""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from kernels.reference import attention as reference
from worker.attention.metadata import AttentionMetadata


class TorchAttentionBackend:
    """The reference backend: exact, portable, and the oracle for every other backend."""

    name = "torch"
    capturable_decode = True

    def describe(self) -> str:
        return self.name

    def plan(self, meta: AttentionMetadata) -> reference.AttentionPlan:
        if meta.lengths_are_bounds:
            return reference.plan_decode_on_device(meta.block_tables, meta.context_lens, meta.block_size)
        plan = reference.plan_attention(meta.block_tables, list(meta.context_lens_host),
                                        list(meta.query_lens_host), meta.block_size, meta.single_prompt_rows)
        device = meta.block_tables.device
        return plan if device.type == "cpu" else plan_on(plan, device)

    def write_kv(self, k_cache, v_cache, key, value, meta: AttentionMetadata, plan) -> None:
        reference.write_kv(k_cache, v_cache, key, value, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, plan, scale: float) -> torch.Tensor:
        return reference.paged_attention(query, k_cache, v_cache, plan, scale)


def plan_on(plan: reference.AttentionPlan, device: torch.device) -> reference.AttentionPlan:
    """The reference plan with every tensor on `device`. Its block ids are already views of the step's block
    tables there; the masks and row indices it builds on the host move here, once per step (not per layer).
    A stopgap while the reference serves on accelerators: a device attention kernel plans on the device."""
    def moved(row):
        return replace(row, **{f.name: getattr(row, f.name).to(device, non_blocking=True) for f in fields(row)
                               if isinstance(getattr(row, f.name), torch.Tensor)})

    return reference.AttentionPlan(tuple(map(moved, plan.decode)), tuple(map(moved, plan.prefills)))
