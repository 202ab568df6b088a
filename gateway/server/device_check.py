"""`--device cuda` is checked before any worker starts, so a machine without CUDA gets one clear line and exit
status 2 instead of a worker that dies while loading. The gateway never imports torch (it would cost about 190
MiB for nothing), so the check runs in a short-lived interpreter: `python -m worker.model.devices`."""

from __future__ import annotations

import os
import subprocess
import sys

# Importing torch (and initializing CUDA) on a busy machine can take a while.
CHECK_TIMEOUT_S = 120.0


def check_device(device: str) -> str:
    """The torch device `device` resolves to (e.g. "cuda"), or ValueError saying why it cannot be used."""
    try:
        run = subprocess.run([sys.executable, "-m", "worker.model.devices", device], capture_output=True, text=True,
                             timeout=CHECK_TIMEOUT_S, env=dict(os.environ))
    except subprocess.TimeoutExpired as e:
        raise ValueError(f"--device {device}: checking for CUDA took over {CHECK_TIMEOUT_S:.0f} s") from e
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        reason = lines[-1] if lines else (run.stderr.strip().splitlines() or ["the check failed"])[-1]
        raise ValueError(reason if reason.startswith("--device") else f"--device {device}: {reason}")
    return lines[-1]
