"""Reranking throughput on one random Qwen3-shaped reranker GGUF made here (loadtest/fixtures/make_gguf.py: pooling
RANK, a two-row yes/no head and the rerank prompt, as llama.cpp's converter writes Qwen3-Reranker), served by
`mili serve` (its quantized blocks as they are) and by `llama-server --reranking` on the same file.

    python -m loadtest.bench_rerank [--shape tiny|qwen3-0.6b] [--type q8_0] [--threads 2] [--requests 32]

For documents of 64 and 512 tokens, query+document pairs/s and prompt tokens/s at concurrency 1 and 32, each request
one query and one document on /v1/rerank (both servers' route, the same client for both), and each server's peak RSS
(loadtest/embed_report.py's table; "texts" are pairs). A pair's prompt is the reranker's frame, the query and the
document, so it runs about 90 tokens more than its document. Servers run one at a time; every document is distinct
from its first words on. Nothing here asserts; on a shared machine the numbers are indicative only.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from loadtest.bench_embed import (CONVERTED_LINK, LENGTHS, bench_arguments, llama_spec, make_texts, measure_server,
                                  mili_spec, work_dir)
from loadtest.embed_report import LLAMA, table
from loadtest.machine import cpu_name

QUERY = "which of these passages says how a reranker scores a document against a query?"
NAME = "rerank"
# The longest pair past its document: the reranker's system line, instruction and think block, and the query.
FRAME_TOKENS = 128


def build_gguf(work: Path, shape: str, kind: str, seed: int) -> tuple[Path, Path]:
    """(the reranker GGUF, its conversion in the cache `mili serve` reads: converted here, so the server's peak RSS
    is a server's, not a converter's)."""
    import gguf

    from loadtest.fixtures.make_gguf import write_model
    from shared.default_model import converted_gguf

    path = write_model(work / f"rerank-{shape}-{kind}.gguf", shape, kind, seed, pooling=gguf.PoolingType.RANK)
    converted = converted_gguf(path, path.stem)
    (work / CONVERTED_LINK).symlink_to(converted)
    return path, converted


def rerank_request(document: str) -> tuple[str, dict]:
    return "/v1/rerank", {"model": NAME, "query": QUERY, "documents": [document]}


def main(argv: list[str] | None = None) -> None:
    from loadtest.peers import llama_server

    args = bench_arguments("loadtest.bench_rerank", "pairs", 32).parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    binary = llama_server.ensure_llama_server()
    with work_dir("bench-rerank-") as work:
        gguf_path, converted = build_gguf(work, args.shape, args.kind, args.seed)
        texts = {n: make_texts(converted, n, args.requests, args.seed + n) for n in LENGTHS}
        file = f"GGUF {args.kind.upper()}"
        rows = measure_server(mili_spec(gguf_path, args.threads, "auto", NAME), file, texts, args.c1_requests,
                              work / "mili.log", rerank_request, NAME)
        llama = llama_spec(binary, gguf_path, args.threads, "--reranking", max(LENGTHS) + FRAME_TOKENS, NAME)
        rows += measure_server(llama, file, texts, args.c1_requests, work / "llama.log", rerank_request, NAME)
        rows.sort(key=lambda r: (r.length, r.concurrency, r.server))
        print(f"# Reranking: random {args.shape}-shaped Qwen3-Reranker GGUF ({args.kind.upper()}), {args.threads} "
              f"threads, {cpu_name()}\n")
        print(f"Command: `python -m loadtest.bench_rerank {shlex.join(sys.argv[1:] if argv is None else argv)}`\n")
        print(f"Each request is one query and one document on /v1/rerank; \"input tokens\" are the document's, "
              f"texts/s are pairs/s, tokens/s the pairs' whole prompts (frame, query, document) as each server "
              f"counts them. Pairs per measurement: {args.requests} at concurrency 32, {args.c1_requests} at "
              f"concurrency 1. MILI serves the GGUF's quantized blocks; peak RSS: the server's processes (MILI: "
              f"gateway + worker) over the whole run.\n")
        print(f"llama-server: {llama_server.version()}; flags: {llama.config}\n")
        print(table(rows))


if __name__ == "__main__":
    main()
