"""The quantized matmuls' parameter slots and mode values exist twice, as Mojo `comptime` constants (what the
kernels read) and as Python constants (what kernels/quant_operands.py writes and compares): the two must agree,
or a call would hand the kernel its scratch in the wrong slots."""

from __future__ import annotations

import re
from pathlib import Path

from kernels import quant_operands

KERNELS = Path(quant_operands.__file__).resolve().parent


def _comptime_ints(name: str) -> dict[str, int]:
    text = (KERNELS / name).read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"^comptime (\w+) = (\d+)\b", text, re.MULTILINE)}


def test_the_python_mirrors_name_the_kernels_slots():
    act = _comptime_ints("quant_activations.mojo")
    assert quant_operands.BLOCK_STRIDE_PARAM == act["P_BLOCK_STRIDE"]
    assert quant_operands.ACTIVATION_MODE_PARAM == act["P_ACT_MODE"]
    assert quant_operands.ACTIVATION_MODES == {"int8x2": act["ACT_INT8X2"], "int8": act["ACT_INT8"]}
    for kernel in ("quant_matmul.mojo", "quant_kmatmul.mojo"):
        assert quant_operands.OUTPUT_STRIDE_PARAM == _comptime_ints(kernel)["P_LDC"], kernel


def test_the_shared_activation_slots_are_phase_ones():
    """same_activations compares exactly the slots phase 1 reads or writes (every P_ constant of
    quant_activations.mojo), so one call's quantized activations serve another's tiles only when they match."""
    slots = {value for name, value in _comptime_ints("quant_activations.mojo").items() if name.startswith("P_")}
    assert set(quant_operands.ACTIVATION_PARAMS) == slots
    assert len(quant_operands.ACTIVATION_PARAMS) == len(slots)
