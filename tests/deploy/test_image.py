"""The container image, built and run for real (opt-in and slow: MILI_TEST_IMAGE=1; minutes, and a few GB of
downloads on a cold cache).

Docker needs a daemon; this uses buildah (`--isolation chroot`) and podman (runc, cgroupfs), which work without
one, as root, inside a sandbox (Debian's podman, buildah, runc and debootstrap packages). No registry may be
reachable, so the base image is made locally with debootstrap (Debian bookworm with Python 3.11) and cached as
localhost/mili-test-base:bookworm. The host's pip configuration and CA bundle are mounted into the build, so pip
inside reaches PyPI the way the host does (through a TLS-intercepting proxy in some sandboxes); where PyTorch's CPU
index cannot be reached but a CPU torch wheel lies on disk, that wheel is served to the build as its
TORCH_INDEX_URL, so the image gets the CPU build as it would from PyTorch's index.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx2
import pytest

from tests.deploy.tools import DEPLOY, ROOT, run, tool
from tests.helpers.server import free_port

pytestmark = pytest.mark.skipif(os.environ.get("MILI_TEST_IMAGE") != "1",
                                reason="builds and runs the container image (slow): set MILI_TEST_IMAGE=1")

BASE = "localhost/mili-test-base:bookworm"
IMAGE = "localhost/mili:test"
# runc rather than crun (crun refuses the hybrid cgroup layout of some sandboxes), limits no higher than the host's.
PODMAN_RUNTIME = ("--runtime", "runc", "--cgroup-manager", "cgroupfs")
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096")


def _mounts() -> list[str]:
    """Host files that let pip inside the build reach PyPI as the host does."""
    mounts = []
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf", "/etc/xdg/pip", "/opt/wheels"):
        if Path(path).exists():
            mounts += ["-v", f"{path}:{path}:ro"]
    return mounts


def _local_torch_index(tmp_path: Path) -> list[str]:
    """A one-package index (PEP 503) of the CPU torch wheel on this disk, as build options; none if there is none."""
    wheels = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
    if not wheels:
        return []
    index = tmp_path / "torch-index"
    (index / "torch").mkdir(parents=True)
    (index / "torch" / "index.html").write_text("".join(f'<a href="file://{w}">{w.name}</a>\n' for w in wheels))
    return ["-v", f"{index}:/torch-index:ro", "--build-arg", "TORCH_INDEX_URL=file:///torch-index"]


def _ensure_base(podman: str, tmp_path: Path) -> None:
    if run(podman, "image", "exists", BASE).returncode == 0:
        return
    debootstrap = tool("debootstrap", "apt-get install debootstrap")
    rootfs = tmp_path / "rootfs"
    made = run(debootstrap, "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm",
               str(rootfs), "http://deb.debian.org/debian", timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    imported = run("sh", "-c", f"tar -C {rootfs} -c . | {podman} import - {BASE}", timeout=300)
    assert imported.returncode == 0, imported.stderr


def test_image_builds_runs_serves_and_drains(tmp_path):
    podman = tool("podman", "apt-get install podman runc")
    buildah = tool("buildah", "apt-get install buildah")
    _ensure_base(podman, tmp_path)
    built = run(buildah, "build", "--isolation", "chroot", "--format", "docker", *_mounts(),
                *_local_torch_index(tmp_path), "--build-arg",
                f"BASE_IMAGE={BASE}", "-t", IMAGE, "-f", str(DEPLOY / "docker" / "Dockerfile"), str(ROOT),
                timeout=3600)
    assert built.returncode == 0, (built.stdout + built.stderr)[-5000:]
    size = int(run(podman, "image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip())
    print(f"\n{IMAGE}: {size / 2**30:.2f} GiB")

    name = f"mili-test-{os.getpid()}"
    port = free_port()
    started = run(podman, *PODMAN_RUNTIME, "run", "-d", "--name", name, *ULIMITS, "-p", f"127.0.0.1:{port}:8000",
                  IMAGE, "--max-num-seqs", "4", "--kv-cache-memory", "256MiB", timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            try:
                health = httpx2.get(f"{url}/health", timeout=2)
                if health.status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            logs = run(podman, "logs", name).stdout + run(podman, "logs", name).stderr
            assert time.monotonic() < deadline, f"the container never became healthy:\n{logs[-3000:]}"
            time.sleep(1)
        # The default model converted in at build time, the kernels built then too.
        assert health.json()["model"] == "SmolLM2-135M-Instruct", health.json()
        reply = httpx2.post(f"{url}/v1/completions", timeout=60,
                            json={"model": "SmolLM2-135M-Instruct", "prompt": "Paris is", "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] > 0, reply.text
        assert "vllm:num_requests_waiting" in httpx2.get(f"{url}/metrics", timeout=5).text
        # Not root; the image's HEALTHCHECK passes.
        assert run(podman, *PODMAN_RUNTIME, "exec", name, "id", "-u").stdout.strip() == "10001"
        check = run(podman, *PODMAN_RUNTIME, "healthcheck", "run", name, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        # SIGTERM drains and exits cleanly well within the grace period.
        stopped = run(podman, *PODMAN_RUNTIME, "stop", "-t", "45", name, timeout=90)
        assert stopped.returncode == 0, stopped.stderr
        exit_code = run(podman, "inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        assert exit_code == "0", exit_code
    finally:
        run(podman, *PODMAN_RUNTIME, "rm", "-f", name, timeout=60)
