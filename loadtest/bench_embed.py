"""Embedding throughput on one random Qwen3-shaped embedding checkpoint made here (last-token pooling, Normalize, EOS
appended), in two files: a GGUF (its weights drawn as quantized blocks, `qwen3.pooling_type` LAST) and the bf16
safetensors sentence-transformers directory dequantized from it, so both hold the same weights up to bf16 rounding.

    python -m loadtest.bench_embed [--shape tiny|qwen3-0.6b] [--type q8_0] [--threads 2] [--requests 64]

For 64- and 512-token inputs, texts/s and tokens/s at concurrency 1 and 32 (each request one text, over HTTP, the
same client for every server) of `mili serve` on the GGUF (its quantized blocks as they are), `mili serve` on the
bf16 directory, and `llama-server --embeddings` on the same GGUF (loadtest/peers/llama_server.py; pooling as the
GGUF says); sentence-transformers' `encode` at batch 32 on the bf16 directory in a process of its own; each
server's peak RSS and the ratios (loadtest/embed_report.py). Servers run one at a time, so they never share cores.
Every text is distinct from its first words on, so no request reads another's prefix-cache blocks. Nothing here
asserts; it measures, and on a shared machine the numbers are indicative only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2

from loadtest.embed_report import LLAMA, ST, Row, goals, table
from loadtest.fixtures.probes import free_port, peak_rss_mib
from loadtest.machine import cpu_name
from loadtest.servers import RunningServer, ServerSpec

ROOT = Path(__file__).resolve().parent.parent
LENGTHS = (64, 512)
CONCURRENCY = (1, 32)
CONVERTED_LINK = "converted-gguf"  # the run's entry in the GGUF conversion cache
MAX_BATCHED_TOKENS = 4096  # MILI's step; llama-server's -ub below
WORDS = ("apple river stone cloud green light house music paper water table city night summer window story "
         "garden bridge forest winter market letter mountain train island silver voice doctor yellow ocean").split()


def build_checkpoints(work: Path, shape: str, kind: str, seed: int) -> tuple[Path, Path]:
    """(the embedding GGUF, the bf16 sentence-transformers directory of the same weights)."""
    import gguf
    import torch
    from safetensors.torch import load_file, save_file

    from loadtest.fixtures.make_gguf import write_model
    from shared.default_model import converted_gguf
    from shared.gguf_import.records import SOURCE_RECORD

    path = write_model(work / f"embed-{shape}-{kind}.gguf", shape, kind, seed, pooling=gguf.PoolingType.LAST)
    # Converted here, into the cache `mili serve` reads, so its gateway's peak RSS is a server's, not a converter's
    # (float32, with the sentence-transformers files the GGUF's pooling implies).
    converted = converted_gguf(path, path.stem)
    (work / CONVERTED_LINK).symlink_to(converted)  # removed with the run (2.4 GiB at 0.6B)
    out = Path(shutil.copytree(converted, work / f"embed-{shape}-bf16"))
    (out / SOURCE_RECORD).unlink()  # a plain checkpoint now, not a view of the GGUF's blocks
    weights = out / "model.safetensors"
    tensors = {name: t.to(torch.bfloat16) for name, t in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    del tensors
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"torch_dtype": "bfloat16"}, indent=2))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024, "do_lower_case": False}))
    return path, out


def make_texts(model_dir: Path, length: int, count: int, seed: int) -> list[str]:
    """`count` distinct texts of exactly `length` tokens each, the appended EOS included."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(seed)
    texts = []
    while len(texts) < count:
        words = [rng.choice(WORDS) for _ in range(length)]
        while len(tok.encode(" ".join(words)).ids) > length:
            words.pop()
        text = " ".join(words)
        if len(tok.encode(text).ids) == length:
            texts.append(text)
    return texts


# ----- the servers, over HTTP -----
def mili_spec(model: Path, threads: int, quantization: str, name: str = "embed") -> ServerSpec:
    """quantization "auto": a GGUF's quantized blocks as they are; "none": the directory's bf16."""
    return ServerSpec("MILI", lambda port, _: [
        sys.executable, "-m", "gateway.cli", "serve", "--model", str(model), "--port", str(port),
        "--worker-threads", str(threads), "--quantization", quantization, "--max-num-seqs", "64",
        "--max-num-batched-tokens", str(MAX_BATCHED_TOKENS), "--served-model-name", name],
        restart_per_level=False, model_processes="children")


def llama_flags(threads: int, slots: int, longest: int, task_flag: str = "--embeddings") -> list[str]:
    """llama-server at its best here: every core (-t/-tb), its default weight buffers (repacked kernels), the
    pooling the GGUF names; `slots` requests at once (-np), each slot room for the longest input and a little
    (-c: the KV cache all slots split; more only costs memory, 3.5 GiB at 32768 tokens of this shape); the batch
    (-b = -ub: llama-server sets n_batch to n_ubatch with --embeddings, as an input must fit one ubatch) MILI's
    per-step token budget, eight 512-token inputs a pass."""
    return [task_flag, "-t", str(threads), "-tb", str(threads), "-np", str(slots),
            "-c", str((longest + 64) * slots), "-b", str(MAX_BATCHED_TOKENS), "-ub", str(MAX_BATCHED_TOKENS),
            "--no-webui"]


def llama_spec(binary: Path, gguf_path: Path, threads: int, task_flag: str = "--embeddings",
               longest: int = max(LENGTHS), name: str = "embed") -> ServerSpec:
    flags = llama_flags(threads, max(CONCURRENCY), longest, task_flag)
    return ServerSpec(LLAMA, lambda port, _: [
        str(binary), "-m", str(gguf_path), "--alias", name, "--host", "127.0.0.1", "--port", str(port), *flags],
        restart_per_level=False, config=" ".join(flags))


def embedding_request(text: str) -> tuple[str, dict]:
    return "/v1/embeddings", {"model": "embed", "input": text, "encoding_format": "base64"}


async def _drive(url: str, warmup: tuple[str, dict], requests: list[tuple[str, dict]],
                 concurrency: int) -> tuple[float, int]:
    """Seconds to send every (route, body) with `concurrency` clients, after `warmup`; prompt tokens served."""
    queue = list(requests)
    tokens = 0

    async def client(http: httpx2.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            route, body = queue.pop()
            r = await http.post(f"{url}{route}", json=body)
            r.raise_for_status()
            tokens += r.json()["usage"]["prompt_tokens"]

    async with httpx2.AsyncClient(timeout=1800) as http:
        route, body = warmup
        (await http.post(f"{url}{route}", json=body)).raise_for_status()
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return time.perf_counter() - start, tokens


def measure_server(spec: ServerSpec, file: str, texts: dict[int, list[str]], c1_texts: int, log: Path,
                   request=embedding_request, served_name: str = "embed") -> list[Row]:
    """Every length at every concurrency on one server start, one text a `request(text)`; its processes' peak RSS
    summed, on every row."""
    server = RunningServer(spec, free_port(), max(CONCURRENCY), log, served_name)
    try:
        server.wait_ready()
        runs = []
        for n in LENGTHS:
            for c in CONCURRENCY:
                batch = texts[n][:c1_texts] if c == 1 else texts[n]
                requests = [request(t) for t in batch]
                seconds, tokens = asyncio.run(_drive(server.url, request("warm up"), requests, c))
                runs.append((n, str(c), len(batch), tokens, seconds))
                print(f"  {spec.name} {file} {n} tokens, concurrency {c}: {len(batch) / seconds:.2f} texts/s",
                      file=sys.stderr, flush=True)
        rss = sum(filter(None, (peak_rss_mib(pid) for pid in server.processes().values())))
    finally:
        server.stop()
    return [Row(n, spec.name, file, c, count, tokens, seconds, rss) for n, c, count, tokens, seconds in runs]


# ----- sentence-transformers in a process of its own (its RSS is its own) -----
def st_encode(model_dir: str, texts_file: str, threads: int) -> None:
    """Seconds for sentence-transformers' encode of each length's texts at batch 32, and the process's peak RSS."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(model_dir, device="cpu", local_files_only=True, model_kwargs={"dtype": torch.bfloat16})
    results: dict = {"seconds": {}}
    for length, texts in json.loads(Path(texts_file).read_text()).items():
        model.encode(texts[:2], batch_size=32)  # warm-up
        start = time.perf_counter()
        model.encode(texts, batch_size=32)
        results["seconds"][length] = time.perf_counter() - start
    results["peak_rss_mib"] = peak_rss_mib(os.getpid())
    print(json.dumps(results))


def measure_st(model_dir: Path, texts: dict[int, list[str]], threads: int, work: Path) -> list[Row]:
    (work / "texts.json").write_text(json.dumps(texts))
    run = subprocess.run([sys.executable, "-m", "loadtest.bench_embed", "--threads", str(threads),
                          "--st-worker", str(model_dir), str(work / "texts.json")],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                         check=True)
    st = json.loads(run.stdout.strip().splitlines()[-1])
    return [Row(n, ST, "bf16 safetensors", "batch 32", len(texts[n]), n * len(texts[n]), st["seconds"][str(n)],
                st["peak_rss_mib"]) for n in LENGTHS]


def bench_arguments(prog: str, unit: str, requests: int) -> argparse.ArgumentParser:
    """The options the embedding and reranking benchmarks share."""
    from loadtest.fixtures.make_gguf import FILE_TYPES, SHAPES

    p = argparse.ArgumentParser(prog=f"python -m {prog}")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--type", choices=sorted(FILE_TYPES), default="q8_0", dest="kind", help="the GGUF's blocks")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--requests", type=int, default=requests, help=f"{unit} per measurement at concurrency 32")
    p.add_argument("--c1-requests", type=int, default=8, help=f"{unit} per measurement at concurrency 1")
    p.add_argument("--seed", type=int, default=0)
    return p


@contextmanager
def work_dir(prefix: str) -> Iterator[Path]:
    """A scratch directory for the run's files, removed after it with the GGUF conversion it links to."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        if (work / CONVERTED_LINK).is_symlink():
            shutil.rmtree((work / CONVERTED_LINK).resolve(), ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    from loadtest.peers import llama_server

    p = bench_arguments("loadtest.bench_embed", "texts", 64)  # the texts of batch 32 too
    p.add_argument("--st-worker", nargs=2, help=argparse.SUPPRESS)  # model dir, texts file: the ST side's process
    args = p.parse_args(argv)
    if args.st_worker:
        st_encode(*args.st_worker, args.threads)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    binary = llama_server.ensure_llama_server()
    with work_dir("bench-embed-") as work:
        gguf_path, bf16_dir = build_checkpoints(work, args.shape, args.kind, args.seed)
        texts = {n: make_texts(bf16_dir, n, args.requests, args.seed + n) for n in LENGTHS}
        gguf_file, bf16_file = f"GGUF {args.kind.upper()}", "bf16 safetensors"
        rows = measure_st(bf16_dir, texts, args.threads, work)
        rows += measure_server(mili_spec(gguf_path, args.threads, "auto"), gguf_file, texts, args.c1_requests,
                               work / "mili-gguf.log")
        rows += measure_server(mili_spec(bf16_dir, args.threads, "none"), bf16_file, texts, args.c1_requests,
                               work / "mili-bf16.log")
        llama = llama_spec(binary, gguf_path, args.threads)
        rows += measure_server(llama, gguf_file, texts, args.c1_requests, work / "llama.log")
        rows.sort(key=lambda r: (r.length, r.concurrency != "batch 32", r.concurrency, r.server, r.file))
        print(f"# Embeddings: random {args.shape}-shaped Qwen3 (last-token pooling, Normalize), {args.threads} "
              f"threads, {cpu_name()}\n")
        print(f"Files: `{gguf_file}` is the GGUF (MILI serves its quantized blocks, llama-server the same file); "
              f"`{bf16_file}` is the sentence-transformers directory dequantized from it (MILI `--quantization "
              f"none`, sentence-transformers). Texts per measurement: {args.requests} at concurrency 32 and batch "
              f"32, {args.c1_requests} at concurrency 1. Peak RSS: the server's processes (MILI: gateway + worker) "
              f"over the whole run on that file; sentence-transformers: its process.\n")
        print(f"llama-server: {llama_server.version()}; flags: {llama.config}\n")
        print(table(rows))
        print("\nGoals:\n" + "\n".join(f"- {g}" for g in goals(rows, "MILI")))


if __name__ == "__main__":
    main()
