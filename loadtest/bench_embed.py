"""Embedding throughput: `mili serve --task embed` over HTTP against sentence-transformers' in-process `encode`, on
one random Qwen3-shaped embedding checkpoint (last-token pooling, Normalize, EOS appended) made here.

    python -m loadtest.bench_embed [--shape small|qwen3-0.6b] [--threads 2] [--requests 64]

For 64- and 512-token inputs: MILI's texts/s and tokens/s at concurrency 1 and 32 (each request one text, over
HTTP), sentence-transformers' `encode` at batch 32 in a process of its own and, in turn with it in that process on
the same texts, MILI's engine without HTTP; the ratios, and peak RSS.
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
from pathlib import Path

import httpx2

from loadtest.fixtures.pooling_checkpoint import append_eos, write_sentence_transformers_files
from loadtest.fixtures.probes import free_port, peak_rss_mib
from loadtest.fixtures.random_checkpoint import QWEN3_0_6B
from loadtest.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
# A Qwen3 of the 0.6B's family small enough to measure in seconds on a laptop-class CPU.
SMALL = dict(QWEN3_0_6B, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64)
SHAPES = {"small": SMALL, "qwen3-0.6b": QWEN3_0_6B}
LENGTHS = (64, 512)
CONCURRENCY = (1, 32)
WORDS = ("apple river stone cloud green light house music paper water table city night summer window story "
         "garden bridge forest winter market letter mountain train island silver voice doctor yellow ocean").split()


def build_model(out_dir: Path, shape: str, seed: int) -> Path:
    """A random checkpoint in `shape` with the default model's tokenizer (its vocabulary sets the embedding rows)."""
    import torch
    from tokenizers import Tokenizer

    from loadtest.fixtures.random_checkpoint import build_checkpoint
    from shared.default_model import default_model_path

    source = default_model_path()
    vocab = Tokenizer.from_file(str(source / "tokenizer.json")).get_vocab_size()
    spec = dict(SHAPES[shape], vocab_size=vocab, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096)
    build_checkpoint(out_dir, spec, torch.bfloat16, torch.device("cpu"), seed)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out_dir / name)
    append_eos(out_dir)
    write_sentence_transformers_files(out_dir, "last", normalize=True, max_seq_length=1024)
    return out_dir


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


# ----- MILI over HTTP -----
def start_mili(model_dir: Path, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", str(model_dir), "--port", str(port),
           "--worker-threads", str(threads), "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
           "--served-model-name", "embed"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mili serve exited: {log.read_text()[-3000:]}")
        try:
            if httpx2.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("mili serve did not become healthy")


async def _drive(url: str, texts: list[str], concurrency: int) -> tuple[float, int]:
    """Seconds to embed every text with `concurrency` clients, one text a request; prompt tokens served."""
    queue = list(texts)
    tokens = 0

    async def client(http: httpx2.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            text = queue.pop()
            r = await http.post(f"{url}/v1/embeddings", json={"input": text, "encoding_format": "base64"})
            r.raise_for_status()
            tokens += r.json()["usage"]["prompt_tokens"]

    async with httpx2.AsyncClient(timeout=600) as http:
        await http.post(f"{url}/v1/embeddings", json={"input": "warm up"})
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return time.perf_counter() - start, tokens


def mili_peak_rss(proc: subprocess.Popen) -> float:
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return sum(filter(None, [peak_rss_mib(proc.pid), *(peak_rss_mib(int(c)) for c in children)]))


# ----- sentence-transformers in a process of its own (its RSS is its own) -----
def st_encode(model_dir: str, texts_file: str, threads: int) -> None:
    """Seconds for sentence-transformers' encode of each length's texts, and, in turn with it on the same texts, for
    MILI's engine in the same process (no HTTP, prefix caching off: each text computed whole, as encode does)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from shared.config import EngineConfig
    from shared.sampling_params import SamplingParams
    from worker.engine import LLMEngine

    torch.set_num_threads(threads)
    model = SentenceTransformer(model_dir, device="cpu", local_files_only=True, model_kwargs={"dtype": torch.bfloat16})
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    engine = LLMEngine(EngineConfig(model=model_dir, task="embed", max_num_seqs=64, max_num_batched_tokens=4096,
                                    enable_prefix_caching=False))

    def run_engine(texts: list[str]) -> None:
        for text in texts:
            engine.add_request(f"r{id(texts)}-{len(text)}-{hash(text)}", tok.encode(text).ids,
                               SamplingParams(max_tokens=0))
        while engine.has_unfinished_requests():
            engine.step()

    results: dict = {"st": {}, "engine": {}}
    for length, texts in json.loads(Path(texts_file).read_text()).items():
        model.encode(texts[:32], batch_size=32)  # warm-up
        run_engine(texts[:32])
        start = time.perf_counter()
        model.encode(texts, batch_size=32)
        results["st"][length] = time.perf_counter() - start
        start = time.perf_counter()
        run_engine(texts)
        results["engine"][length] = time.perf_counter() - start
    results["peak_rss_mib"] = peak_rss_mib(os.getpid())
    print(json.dumps(results))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_embed")
    p.add_argument("--shape", choices=SHAPES, default="small")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--requests", type=int, default=64, help="texts per measurement at concurrency 32 (8 at 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--st-worker", nargs=2, help=argparse.SUPPRESS)  # model dir, texts file: the ST side's process
    args = p.parse_args(argv)
    if args.st_worker:
        st_encode(*args.st_worker, args.threads)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    try:
        model_dir = build_model(work / f"embed-{args.shape}", args.shape, args.seed)
        texts = {n: make_texts(model_dir, n, args.requests, args.seed + n) for n in LENGTHS}
        (work / "texts.json").write_text(json.dumps(texts))
        st_run = subprocess.run([sys.executable, "-m", "loadtest.bench_embed", "--threads", str(args.threads),
                                 "--st-worker", str(model_dir), str(work / "texts.json")],
                                cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                                check=True)
        st = json.loads(st_run.stdout.strip().splitlines()[-1])
        proc, url = start_mili(model_dir, args.threads, work / "mili.log")
        try:
            mili = {}
            for n in LENGTHS:
                for c in CONCURRENCY:
                    batch = texts[n][:8] if c == 1 else texts[n]
                    mili[(n, c)] = (*asyncio.run(_drive(url, batch, c)), len(batch))
            rss = mili_peak_rss(proc)
        finally:
            proc.terminate()
            proc.wait(30)
        print(f"# embeddings, {args.shape} random Qwen3 (bf16, last-token pooling), {args.threads} threads, "
              f"{cpu_name()}")
        print("| input tokens | server | concurrency | texts/s | tokens/s | vs sentence-transformers |")
        print("|---:|---|---:|---:|---:|---:|")
        for n in LENGTHS:
            st_rate = len(texts[n]) / st["st"][str(n)]
            engine_rate = len(texts[n]) / st["engine"][str(n)]
            print(f"| {n} | sentence-transformers encode (in process) | batch 32 | {st_rate:.1f} | "
                  f"{st_rate * n:.0f} | 1.00 |")
            print(f"| {n} | MILI engine (in process, no HTTP) | all at once | {engine_rate:.1f} | "
                  f"{engine_rate * n:.0f} | {engine_rate / st_rate:.2f} |")
            for c in CONCURRENCY:
                seconds, tokens, count = mili[(n, c)]
                print(f"| {n} | MILI /v1/embeddings (HTTP) | {c} | {count / seconds:.1f} | {tokens / seconds:.0f} | "
                      f"{count / seconds / st_rate:.2f} |")
        print(f"\npeak RSS: MILI gateway + worker {rss:.0f} MiB; sentence-transformers' process (with an engine "
              f"beside it) {st['peak_rss_mib']:.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
