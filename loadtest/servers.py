"""Starting, probing and stopping the servers a sweep measures, one at a time so they never share cores.

Each peer is a `ServerSpec`: how to start it for a given concurrency (llama-server's slot count must
equal it, so it restarts per level), and which processes it runs as (each one's peak RSS is reported).

Equal context: given `kv_tokens`, MILI's paged KV cache holds exactly that many tokens (`--num-kv-blocks`
kv_tokens / 16, one pool every sequence draws from, a sequence up to the whole pool or the model's context
length, whichever is less) and llama-server gets `-c kv_tokens` (its total context; with `-np N` slots and
no unified cache, each slot may hold kv_tokens / N). By default both keep K and V in 16-bit floats, so the
same token count is the same number of bytes; their 8-bit caches (MILI's --kv-cache-dtype int8, llama-server's
-ctk/-ctv q8_0) hold the same tokens in about half.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2

from loadtest.fixtures.probes import all_pids, parent_pid, process_name

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ServerSpec:
    name: str
    command: Callable[[int, int], list[str]]  # (port, concurrency) -> argv
    restart_per_level: bool  # the server's own parallelism must be set to the concurrency
    max_concurrency: int | None = None  # levels above this are not run (a one-request server only queues)
    # "self": one process; "children": a gateway whose children (workers) hold the model; "named": a server and
    # the processes it starts, each child named by its process name (vLLM's API server and its engine core)
    model_processes: str = "self"
    fallback: "ServerSpec | None" = None  # started instead if this one exits before it is ready
    config: str = ""  # how it runs, for the results
    # False: not the peer at its best (a fallback after its default failed, or a slower setting forced); the
    # report prints no speed ratio against it (loadtest/report.py).
    best: bool = True
    context: str = ""  # its KV capacity and per-sequence limit, for the results
    env: dict[str, str] | None = None  # the process's environment (None: this process's, os.environ)
    cwd: Path | None = None  # where it starts (None: the repository root)


MILI_BLOCK_SIZE = 16  # `mili serve`'s default --block-size


def mili_spec(threads: int, model: str = "default", served_name: str | None = None,
              quantization: str = "auto", name: str = "mili", kv_tokens: int | None = None,
              kv_cache_dtype: str = "auto", extra_args: tuple[str, ...] = ()) -> ServerSpec:
    """MILI serving `model` (a .gguf, an HF directory or "default"); quantization "auto" serves a GGUF's
    quantized blocks as they are, "none" the model dtype (bfloat16 here). kv_tokens: the KV cache's size in
    tokens (None: its default, --kv-cache-memory 1GiB). extra_args: more `mili serve` flags."""
    extra = ["--served-model-name", served_name] if served_name else []
    extra += list(extra_args)
    extra += ["--kv-cache-dtype", kv_cache_dtype]
    if kv_tokens is not None:
        if kv_tokens <= 0 or kv_tokens % MILI_BLOCK_SIZE:
            raise ValueError(f"KV tokens must be a positive multiple of {MILI_BLOCK_SIZE}, got {kv_tokens}")
        extra += ["--num-kv-blocks", str(kv_tokens // MILI_BLOCK_SIZE)]
    context = "KV cache 1GiB (its default)" if kv_tokens is None else (
        f"KV cache {kv_tokens} tokens ({kv_tokens // MILI_BLOCK_SIZE} blocks of {MILI_BLOCK_SIZE}), one pool for all "
        f"sequences; a sequence up to min({kv_tokens}, the model's context length)")
    return ServerSpec(name, lambda port, _: [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
                                             "--worker-threads", str(threads), "--model", model,
                                             "--quantization", quantization, *extra],
                      restart_per_level=False, model_processes="children", context=context,
                      config=" ".join([*extra_args, *(["--kv-cache-dtype", kv_cache_dtype] if kv_cache_dtype != "auto"
                                                      else [])]))


def llama_server_spec(binary: Path, gguf: Path, served_name: str, threads: int, repack: str = "auto",
                      kv_tokens: int | None = None, kv_cache_type: str | None = None,
                      name: str = "llama-server", extra_args: tuple[str, ...] = ()) -> ServerSpec:
    """repack "auto": llama-server's default (its repacked and AMX weight buffers, its fastest kernels), and
    --no-repack only if that exits before it is ready. On this machine's AMX CPU it does, for every type
    tried (Q4_1, Q4_0, Q4_K): ggml's AMX matmul segfaults in the warm-up; without the extra buffers
    llama-server runs its AVX-512 kernels. "on" / "off" force one or the other. kv_cache_type: its K and V
    cache type (-ctk/-ctv, e.g. q8_0; None: its default f16). extra_args: more llama-server flags."""
    kv_type = ["-ctk", kv_cache_type, "-ctv", kv_cache_type] if kv_cache_type else []
    # -c is the total context its -np slots split (each kv_tokens / c); without kv_tokens each slot gets 1024
    # tokens, as the longest benchmark request is 512 + 64.
    def context(c: int) -> int:
        return kv_tokens if kv_tokens is not None else 1024 * c

    def spec(with_repack: bool, fallback: ServerSpec | None = None) -> ServerSpec:
        return ServerSpec(name, lambda port, c: [
            str(binary), "-m", str(gguf), "--alias", served_name, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(c), "-c", str(context(c)), "-t", str(threads), "-tb", str(threads), "--no-webui",
            *kv_type, *([] if with_repack else ["--no-repack"]), *extra_args],
            restart_per_level=True, fallback=fallback, best=with_repack,
            config="default weight buffers (repack)" if with_repack else
            "--no-repack" + (" (the default exited before it was ready)" if repack == "auto" else ""),
            context="-c 1024 x concurrency (its KV grows with the level)" if kv_tokens is None else
            f"-c {kv_tokens}: KV cache {kv_tokens} tokens, split evenly between the -np slots (a sequence up to "
            f"{kv_tokens} / concurrency)")

    if repack == "auto":
        return spec(True, fallback=spec(False))
    return spec(repack == "on")


def transformers_spec(model_dir: Path, served_name: str, threads: int, max_concurrency: int) -> ServerSpec:
    return ServerSpec("transformers", lambda port, _: [
        sys.executable, "-m", "loadtest.peers.transformers_server", "--model", str(model_dir), "--served-model-name",
        served_name, "--port", str(port), "--threads", str(threads)],
        restart_per_level=False, max_concurrency=max_concurrency)


def vllm_cpu_spec(model_dir: Path, served_name: str, threads: int, kv_tokens: int | None = None) -> ServerSpec:
    """vLLM's CPU backend in its own venv (loadtest/peers/vllm_cpu.py), serving the HF directory in bfloat16 (float32
    on a CPU without bfloat16 arithmetic).
    kv_tokens caps its KV cache at that many tokens (whole blocks of its own size), the same capacity as the
    others; it starts outside the repository so that none of MILI's packages shadows one of vLLM's."""
    from loadtest.peers import vllm_cpu

    found, missing = vllm_cpu.preloads()
    preloaded = "preloaded " + " + ".join(p.name for p in found) if found else "nothing preloaded"
    config = (f"{vllm_cpu.model_dtype()}, VLLM_ENABLE_V1_MULTIPROCESSING=0 (the model in the engine-core process, "
              f"no worker process), VLLM_CPU_KVCACHE_SPACE={vllm_cpu.KV_CACHE_SPACE_GIB}, {preloaded}")
    if missing:
        config += f"; missing {', '.join(missing)}"
    context = (f"VLLM_CPU_KVCACHE_SPACE {vllm_cpu.KV_CACHE_SPACE_GIB} GiB, all of it" if kv_tokens is None else
               f"KV cache {kv_tokens} tokens ({kv_tokens // vllm_cpu.BLOCK_SIZE} blocks of {vllm_cpu.BLOCK_SIZE}), "
               f"one pool for all sequences")
    return ServerSpec("vllm-cpu", lambda port, _: vllm_cpu.server_command(model_dir, served_name, port, kv_tokens),
                      restart_per_level=False, model_processes="named", config=config, best=not missing, context=context,
                      env=vllm_cpu.environment(threads), cwd=vllm_cpu.install_dir())


class RunningServer:
    def __init__(self, spec: ServerSpec, port: int, concurrency: int, log_path: Path, served_name: str,
                 cwd: Path = ROOT):
        self.spec = spec
        self.served_name = served_name  # the model name requests send
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "ab")
        # env: os.environ as Python knows it. Without it the child inherits the C environment, where a Mojo
        # module loaded in this process has set PYTHONEXECUTABLE, which points the child outside the venv.
        self.proc = subprocess.Popen(spec.command(port, concurrency), cwd=spec.cwd or cwd, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=spec.env if spec.env is not None else dict(os.environ))

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited with code {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx2.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.spec.name} not ready after {timeout:.0f} s; see {self.log.name}")

    def processes(self) -> dict[str, int]:
        """Role -> pid of every process the server runs: itself, or a gateway and its workers."""
        if self.spec.model_processes == "self":
            return {self.spec.name: self.proc.pid}
        workers = sorted(pid for pid in all_pids() if parent_pid(pid) == self.proc.pid)
        if self.spec.model_processes == "named":
            roles = {self.spec.name: self.proc.pid}
            for pid in workers:
                name = process_name(pid)
                roles[name if name not in roles else f"{name}-{pid}"] = pid
            return roles
        names = ["worker"] if len(workers) == 1 else [f"worker-{i}" for i in range(len(workers))]
        return {"gateway": self.proc.pid, **dict(zip(names, workers))}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def start_server(spec: ServerSpec, port: int, concurrency: int, log_dir: Path, served_name: str) -> RunningServer:
    """The spec's server, started and ready; where it exits before it is ready, its fallback's instead (the
    returned server's .spec says which runs)."""
    server = RunningServer(spec, port, concurrency, log_dir / f"{spec.name}.log", served_name)
    try:
        server.wait_ready()
    except RuntimeError as e:  # exited before it was ready
        if spec.fallback is None:
            raise
        print(f"  {spec.name} ({spec.config}) {e}; using {spec.fallback.config}", flush=True)
        server.stop()
        server = RunningServer(spec.fallback, port, concurrency, log_dir / f"{spec.name}.log", served_name)
        server.wait_ready()
    return server
