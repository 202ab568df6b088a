"""Resolving --device: which torch device the engine's weights, KV cache and sampler live on."""

from __future__ import annotations

import sys

import torch


def cuda_unavailable_reason(device: torch.device) -> str | None:
    """Why the CUDA device cannot be used here, or None when it can."""
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return f"torch {torch.__version__} ({build}) sees no CUDA device"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"there is no {device}: torch sees {torch.cuda.device_count()} CUDA device(s)"
    return None


def resolve_device(name: str) -> torch.device:
    """auto -> cuda where torch sees a CUDA device, else cpu; cpu and cuda[:N] as given, cuda checked."""
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda" if name == "auto" else name)
    if device.type != "cuda":
        return device
    reason = cuda_unavailable_reason(device)
    if reason is not None:
        raise ValueError(f"--device {name}: {reason}")
    # Named with its index ("cuda:0"), so /health and the logs say which GPU.
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def main(argv: list[str]) -> int:
    """`python -m worker.model.devices NAME`: prints the device NAME resolves to and exits 0, or prints why it
    cannot be used and exits 1. The gateway runs this before it starts workers, without importing torch."""
    try:
        print(resolve_device(argv[0]))
    except (ValueError, RuntimeError) as e:
        print(e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
