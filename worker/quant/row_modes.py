"""Which activation quantization each row of a projection runs.

`--activation-quantization int8-prompt` quantizes the rows of prompt positions in one int8 part (llama.cpp's
activations: one multiply-add per 4 K-steps, about twice the many-row throughput) and the rows of generated
positions in two (int8x2: decode's accuracy). A row's mode is a property of its position, never of its batch or
its chunk: a prompt position is one-part whether it comes in a long prefill chunk, a chunk of one, or a sequence
computed again after preemption; a generated position is two-part in a decode step, a verification, and a
recomputation alike. So a request's tokens still do not depend on what shares its steps, and a prefix-cache hit
on prompt blocks gets the bits computing them would (blocks holding generated positions are keyed apart:
worker/core/block_manager.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PROMPT_ONE_PART = "int8-prompt"


def row_activation_modes(mode: str) -> tuple[str, str]:
    """A server's activation quantization -> (the kernels' mode for generated positions' rows, for prompt
    positions' rows)."""
    return ("int8x2", "int8") if mode == PROMPT_ONE_PART else (mode, mode)


def prompt_rows_apart(mode: str) -> bool:
    """Whether a server's activation quantization runs prompt positions' rows differently."""
    generated, prompt = row_activation_modes(mode)
    return generated != prompt


@dataclass(frozen=True)
class PromptPositions:
    """Which rows of a step's tokens are prompt positions: all of them, or the two index sets."""

    all_prompt: bool
    prompt_index: torch.Tensor | None = None  # [num_prompt_rows] int64, ascending (None: all_prompt)
    other_index: torch.Tensor | None = None  # [num_other_rows] int64, ascending (None: all_prompt)

    @classmethod
    def from_flags(cls, flags: Sequence[bool], device: torch.device | str = "cpu") -> PromptPositions | None:
        """None where no row is a prompt position (a decode step)."""
        prompt = [i for i, is_prompt in enumerate(flags) if is_prompt]
        if not prompt:
            return None
        if len(prompt) == len(flags):
            return cls(True)
        other = [i for i, is_prompt in enumerate(flags) if not is_prompt]
        return cls(False, torch.tensor(prompt, dtype=torch.int64, device=device),
                   torch.tensor(other, dtype=torch.int64, device=device))
