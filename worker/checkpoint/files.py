"""A checkpoint directory's weight files: safetensors only (pickled .bin checkpoints are never loaded)."""

from __future__ import annotations

import json
from pathlib import Path


class WeightLoadError(ValueError):
    """A checkpoint whose weights cannot be served as they are: missing files, tensors or shapes."""


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors files in {model_dir} (pickled .bin checkpoints are not loaded)")
    return files
