"""Moving one step's inputs to the model's device with one copy.

The model runner builds a step's index tensors (token ids, positions, slot mapping, block tables, lengths,
the rows that sample) on the host, from Python lists. On the CPU they are used as they are. On an
accelerator, one small copy per tensor would cost a transfer's fixed latency each (about ten of them a step),
so they are packed back to back into one host buffer, pinned so that the copy can run asynchronously, and
sent with ONE non-blocking transfer; the device tensors are views into the one device buffer. The caching
host allocator keeps a pinned block from being reused until the copy that read it has finished, so a fresh
buffer per step is safe and cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_UNIT = torch.int64  # the buffer's element
_UNIT_BYTES = 8
# Every field starts on a 64-byte boundary: kernels may read a field with vector loads that need an aligned base
# (the GPU attention module's block tables: kernels/gpu_attention.py), and a few bytes of padding cost nothing.
_FIELD_ALIGN_UNITS = 8


@dataclass(frozen=True)
class Field:
    offset: int  # in 8-byte units
    numel: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def units(self) -> int:
        return -(-self.numel * self.dtype.itemsize // _UNIT_BYTES)

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
        """This field's tensor inside a packed [units] int64 buffer (a view, no copy)."""
        return buffer[self.offset:self.offset + self.units].view(self.dtype)[:self.numel].view(self.shape)


def layout(tensors: list[torch.Tensor]) -> tuple[list[Field], int]:
    """Where each tensor goes in the packed buffer, and the buffer's length in 8-byte units."""
    fields, offset = [], 0
    for t in tensors:
        field = Field(offset, t.numel(), tuple(t.shape), t.dtype)
        fields.append(field)
        offset += -(-field.units // _FIELD_ALIGN_UNITS) * _FIELD_ALIGN_UNITS
    return fields, offset


def pack(tensors: list[torch.Tensor], pin: bool = False) -> tuple[torch.Tensor, list[Field]]:
    """Host tensors (contiguous, integer or bool) -> one [units] int64 host buffer holding them all."""
    fields, units = layout(tensors)
    buffer = torch.empty(units, dtype=_UNIT, pin_memory=pin)
    for t, field in zip(tensors, fields):
        field.view(buffer).copy_(t)
    return buffer, fields


def to_device(tensors: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The host tensors on `device`: on the CPU the tensors themselves (no work at all); elsewhere views of
    one device buffer filled by one non-blocking host-to-device copy."""
    if device.type == "cpu":
        return tensors
    buffer, fields = pack(tensors, pin=device.type == "cuda")
    on_device = buffer.to(device, non_blocking=True)  # [units] int64: the step's only host-to-device copy
    return [field.view(on_device) for field in fields]


def host_values_to(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small tensor of Python values on `device`. On CUDA it goes through pinned memory without blocking: a
    copy from ordinary (pageable) memory first waits for all the work queued before it, a sync per tensor."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
