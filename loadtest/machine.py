"""What the benchmarks say they ran on: the CPU's model name (what lscpu prints as "Model name"), or the GPU's."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name() -> str:
    """The model name, with the family and model numbers where a virtual machine shows only a bare brand ("AMD
    EPYC"): family 25 is AMD's Zen 3 and Zen 4 (model 17: Zen 4 Genoa), 26 is Zen 5."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not line.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
        name = fields.get("model name")
        if name:
            if not any(ch.isdigit() for ch in name) and "cpu family" in fields and "model" in fields:
                name = f"{name} (family {fields['cpu family']}, model {fields['model']})"
            return name
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def device_name(device) -> str:
    """A torch device (or its name): the GPU's name for a CUDA device, else the CPU's."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return cpu_name()
