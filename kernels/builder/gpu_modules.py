"""Builds MILI's GPU attention module (kernels/gpu_attention.mojo) for one model shape, cached by hash.

Modular's flash attention needs the head counts and head_dim at compile time, so there is one module per model
shape: `python -m kernels.builder.gpu_modules 16 8 128` (or `make gpu-bundle`, for the shapes the GPU tests and benchmarks
use) compiles it for the H100 (`--target-accelerator nvidia:sm_90a`; plain `nvidia:90` selects an older kernel set
that rejects 16-token pages) into build/kernels/gpu/<hash of source, shape, target>/ in about 30-60 s. The same
lock-and-rename discipline as kernels/builder/modules.py keeps concurrent builds and readers safe. A GPU machine has no Mojo
compiler: there the module is only looked up (find_module), in $MILI_GPU_KERNEL_DIR (the carried bundle) first.
The CPU test suite never builds it (too slow); its unit tests cover the Python logic around it.

The module embeds PTX for sm_90a, not machine code: Modular's runtime compiles it when the module first runs,
with libNVPTX.so (from max-core's modular/lib; $MODULAR_NVPTX_LIBRARY_PATH names where it is) or an external
`ptxas` ($MODULAR_NVPTX_COMPILER_PATH). Besides that it loads libKGENCompilerRTShared.so and
libAsyncRTMojoBindings.so (its NEEDED entries) and, through them, libAsyncRTRuntimeGlobals.so and
libMSupportGlobals.so, then the CUDA driver (libcuda.so.1) and NVML (libnvidia-ml.so.1) at run time. libMGPRT.so
is not referenced by any of them.

Running on torch's CUDA stream (max-core 26.7.0, mojo 1.2.0), what was found:
- `DeviceContext.create_external_stream(ptr)` wraps a foreign `CUstream` (torch's
  `torch.cuda.current_stream().cuda_stream`) as a non-owning `DeviceStream`, and `DeviceStream.enqueue_function`
  launches a compiled kernel (`ctx.compile_function[kernel]()`) on it. MILI's own KV-write kernel runs that way:
  directly on torch's stream.
- A `DeviceContext` cannot be bound to an external stream in this API: its constructors take a device id (or an
  existing native context, for MAX's own interpreter), `select_stream(i)` picks among the context's OWN streams,
  and `enqueue_wait_for(other_ctx)` joins contexts, not foreign streams. Modular's `nn.flash_attention` takes a
  `DeviceContext` and enqueues on its stream.
- So attention joins the streams with events, never a host wait: record an event on torch's stream, make the
  context's stream wait for it, enqueue the attention, record an event on the context's stream and make torch's
  stream wait for that (`DeviceStream.record_event` / `enqueue_wait_for`). The context is created once per
  process. This is the fork/join pattern CUDA stream capture accepts (the context's stream joins the capture
  through the event), so decode steps stay capturable in principle.
Other ways looked at: MAX's own Python/torch integration is not in max-core as installed (only its libraries), and
the `DeviceContext` constructor from a type-erased native pointer takes an existing MAX context (for MAX's
interpreter), not a CUDA stream.
Per call, nothing waits for the device. What is still made per call: the external-stream wrapper and two CUDA
events (host objects), a look-up of the compiled KV-write kernel in the context's cache, the decode dispatch
metadata (host scalars; the SM count comes from the context's device info); inside Modular's attention, possibly
split-K scratch (a `mha_splitk_reduce` kernel is in the module), which Modular allocates stream-ordered on its
context. On the Python side (kernels/gpu_attention.py): the step plan's cache lengths (one small device tensor per
step) and each layer's output tensor, both from torch's caching allocator.
Seen on an H200: torch's pointers are valid in Modular's context (the kernels read and write torch's tensors);
`create_external_stream` takes torch's streams (the KV write runs on them, exact); decode steps capture in a CUDA
graph and replay right for three of the four carried shapes. Modular's sm_90a decode kernel reads block-table rows
with 16-byte loads (kernels/gpu_attention.py aligns them). Steps mixing sequences left short sequences' rows NaN
in processes whose earlier kernels had run, synced or not: not the streams' ordering but Modular's kernels reading
shared memory they had not loaded (kernels/gpu_attention.mojo, SHARED_MEMORY_FILL); the per-call host
overhead is unmeasured.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kernels.builder.modules import BUILD_ROOT, KERNELS_DIR, KernelBuildError, compile_source

GPU_SOURCE = KERNELS_DIR / "gpu_attention.mojo"
GPU_MODULE = "mili_gpu_attention"
GPU_TARGET = "nvidia:sm_90a"
# The module's host side (argument handling, launches) runs on the GPU machine's CPU, not on this one: built
# for the x86-64-v3 baseline (AVX2), which every current GPU server's CPU has, rather than for this host.
HOST_CPU = "x86-64-v3"
PAGE_SIZE = 16  # tokens per KV block: fixed in the module
HEAD_DIMS = (64, 128)  # what Modular's sm_90a flash attention kernels serve
GPU_BUILD_ROOT = BUILD_ROOT / "gpu"
CARRIED_DIR_ENV = "MILI_GPU_KERNEL_DIR"


@dataclass(frozen=True, order=True)
class GpuShape:
    """The compile-time shape of one GPU attention module."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __str__(self) -> str:
        return f"{self.num_heads}q/{self.num_kv_heads}kv/d{self.head_dim}"

    def unsupported_reason(self) -> str | None:
        if self.num_heads < 1 or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            return f"{self.num_heads} query heads do not group over {self.num_kv_heads} KV heads"
        if self.head_dim not in HEAD_DIMS:
            return f"head_dim {self.head_dim} is not one of {HEAD_DIMS}"
        return None

    def defines(self) -> tuple[str, ...]:
        return ("-D", f"MILI_NQ={self.num_heads}", "-D", f"MILI_NKV={self.num_kv_heads}",
                "-D", f"MILI_HD={self.head_dim}")


# Built by `make gpu-bundle` and carried to the GPU machine: the GPU tests' tiny models (tests/gpu use exactly
# these; GQA ratios 1, 2, 4 at head_dim 64 and 128) and Qwen3-0.6B (16 query heads, 8 KV heads, head_dim 128).
CARRIED_SHAPES = (GpuShape(4, 2, 64), GpuShape(8, 2, 64), GpuShape(4, 4, 128), GpuShape(16, 8, 128))


def build_key(shape: GpuShape) -> str:
    digest = hashlib.sha256()
    digest.update(GPU_SOURCE.read_bytes())
    digest.update(repr((shape.num_heads, shape.num_kv_heads, shape.head_dim, PAGE_SIZE, GPU_TARGET,
                        HOST_CPU)).encode())
    return digest.hexdigest()[:16]


def module_path(shape: GpuShape, root: Path | None = None) -> Path:
    return (GPU_BUILD_ROOT if root is None else root) / build_key(shape) / f"{GPU_MODULE}.so"


def search_roots() -> list[Path]:
    carried = os.environ.get(CARRIED_DIR_ENV)
    return ([Path(carried)] if carried else []) + [GPU_BUILD_ROOT]


def find_module(shape: GpuShape) -> Path | None:
    """The built module for `shape` (the carried bundle's first), or None."""
    return next((p for p in (module_path(shape, root) for root in search_roots()) if p.is_file()), None)


def build_module(shape: GpuShape) -> Path:
    """The module for `shape`, compiled here if no build of this source exists yet (needs the mojo compiler)."""
    reason = shape.unsupported_reason()
    if reason is not None:
        raise KernelBuildError(f"no GPU attention module for {shape}: {reason}")
    target = module_path(shape)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not target.is_file():  # not built by another process while we waited
            compile_source(GPU_SOURCE, target, ("--target-accelerator", GPU_TARGET, "--target-cpu", HOST_CPU,
                                          *shape.defines()))
    return target


if __name__ == "__main__":
    shapes = [GpuShape(*map(int, sys.argv[1:4]))] if len(sys.argv) >= 4 else list(CARRIED_SHAPES)
    for s in shapes:
        print(s, build_module(s))
