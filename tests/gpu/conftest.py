"""tests/gpu: the engine and the server on CUDA. Every test here is skipped, with the reason, where torch sees no
CUDA device (CI, the development machines); `make gpu-check` runs them on a GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.gpu import DEVICE
from worker.model.devices import cuda_unavailable_reason

HERE = Path(__file__).resolve().parent

# The compiled layer ops (worker/model/compiled_ops.py) compile once per model shape and dtype; a server holds one
# model, a test process builds dozens, past Dynamo's default of 8 variants per function (a hard error under
# fullgraph).
torch._dynamo.config.recompile_limit = 128


def pytest_collection_modifyitems(config, items):
    reason = cuda_unavailable_reason(torch.device("cuda"))
    if reason is None or DEVICE == "cpu":  # a rehearsal runs them (tests/gpu/__init__.py)
        return
    # A skip mark, not a skip in a fixture: nothing is built or started for a test that cannot run.
    skip = pytest.mark.skip(reason=f"needs CUDA: {reason}")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)
