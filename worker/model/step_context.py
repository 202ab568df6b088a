"""What every decoder layer needs to know about the step, computed once by the model's forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from worker.attention.metadata import AttentionMetadata
from worker.model.rotary import RotaryEmbedding


@dataclass
class StepContext:
    """What every layer needs about the step, computed once by the model's forward."""

    meta: AttentionMetadata
    plan: Any  # the attention backend's per-step plan
    positions: torch.Tensor  # [num_tokens] int64
    rotary: RotaryEmbedding
    dtype: torch.dtype
    _tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def rotary_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_signed), each [num_tokens, 1, head_dim] in the activation dtype, gathered once per step."""
        if self._tables is None:
            self._tables = self.rotary.tables(self.positions, self.dtype)
        return self._tables
