"""A peer's own virtual environment under build/peers/: created once, its packages installed by exact version,
what breaks it removed, and an import check whose output is recorded last, so a complete venv is one whose record
exists. MILI's .venv is never touched: the peers pin their own torch and pull packages that break each other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Pulled in by the peers' dependencies (transformers' optional vision and audio parts), unused by text
# generation, and built against another torch than the pinned CPU wheel: with them installed, importing
# transformers' models (so vllm, and optimum-intel's export) fails ("operator torchvision::nms does not exist").
MISMATCHED_WITH_TORCH = ("torchvision", "torchaudio", "torchcodec")
RECORD = "installed.json"


def python_in(install_dir: Path) -> Path:
    return install_dir / "venv" / "bin" / "python"


def ensure_venv(install_dir: Path, requirements: list[str], check: str) -> dict:
    """The record of a complete venv under install_dir, installing it first if needed. `check` is Python code run
    in the venv (outside the repository, so none of MILI's packages shadows the peer's) that prints a JSON
    object: the versions recorded."""
    record = install_dir / RECORD
    if record.is_file():
        return json.loads(record.read_text())
    python = python_in(install_dir)
    subprocess.run([sys.executable, "-m", "venv", str(install_dir / "venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *requirements], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", *MISMATCHED_WITH_TORCH], check=True)
    run = subprocess.run([str(python), "-c", check], capture_output=True, text=True, timeout=600, cwd=install_dir)
    if run.returncode != 0:
        raise RuntimeError(f"{install_dir.name} installed but does not import:\n{run.stderr[-2000:]}")
    versions = json.loads(run.stdout.strip().splitlines()[-1])
    record.write_text(json.dumps(versions) + "\n")
    return versions


def recorded(install_dir: Path) -> dict | None:
    """The versions a complete venv recorded, or None."""
    record = install_dir / RECORD
    return json.loads(record.read_text()) if record.is_file() else None
