"""What every decoder layer needs to know about the step, computed once by the model's forward, and which rows
of the step the last layer computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from worker.attention.metadata import AttentionMetadata
from worker.model.rotary import RotaryEmbedding
from worker.quant.row_modes import PromptPositions


@dataclass
class StepContext:
    """What every layer needs about the step, computed once by the model's forward."""

    meta: AttentionMetadata
    plan: Any  # the attention backend's per-step plan
    positions: torch.Tensor  # [num_tokens] int64
    rotary: RotaryEmbedding
    dtype: torch.dtype
    prompt_positions: PromptPositions | None = None  # which rows are prompt positions (worker/quant/row_modes.py)
    _tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def rotary_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_signed), each [num_tokens, 1, head_dim] in the activation dtype, gathered once per step."""
        if self._tables is None:
            self._tables = self.rotary.tables(self.positions, self.dtype)
        return self._tables


@dataclass(frozen=True)
class OutputRows:
    """The rows of a step whose final hidden states are read (its sampling and prompt-scoring rows), and the
    attention metadata that has each of them attend as a one-token decode at its own position.

    Given these, the last layer writes every row's K and V to the cache, as it must, but computes its attention,
    output projection and MLP for these rows alone: a prefill chunk's other rows feed nothing past their K and V.
    Each of these rows then attends in the last layer the way a decode row does, whatever chunk it came in, so its
    bits do not depend on how its prompt was chunked or batched."""

    index: torch.Tensor  # [num_out] int64: rows of the step's tokens, ascending
    meta: AttentionMetadata | None  # one attention row per output row, each of query length 1 (None: no rows)
    prompt_positions: PromptPositions | None = None  # which of these rows are prompt positions (see StepContext)


@dataclass(frozen=True)
class RowStep:
    """OutputRows as the last layer takes them: the rows, and a step context of their own for their attention."""

    index: torch.Tensor  # [num_out] int64
    step: StepContext
