"""Constrained (JSON schema) against unconstrained decoding on a real `mili serve`, printed, never asserted.

Both kinds of request run exactly `--max-tokens` output tokens: the unconstrained ones with ignore_eos,
the constrained ones because the schema asks for more JSON than that. So output tokens per second
compare the same work, with and without the grammar. Levels alternate (plain, JSON, plain, JSON, ...)
so load from anything else on the machine falls on both alike; the ratio per concurrency is the figure.

Then, in this process, the grammar's own per-token costs on the served model's tokenizer: the check of a
sampled token (what most steps pay), a full mask applied to a row of logits (what a refused token pays),
and advancing the matcher.

    python -m loadtest.bench_structured [--base-url URL] [--concurrency 1 8] [--rounds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2

from loadtest.machine import cpu_name

ROOT = Path(__file__).resolve().parent.parent
MODEL = "SmolLM2-135M-Instruct"
# Ten people of four fields each: more JSON than 64 tokens hold, so every constrained request runs to max_tokens.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"], "properties": {"people": {
    "type": "array", "minItems": 10, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "age", "city", "job"],
        "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                                                                             "maximum": 120},
                       "city": {"type": "string", "maxLength": 24}, "job": {"type": "string", "maxLength": 24}}}}}}
PROMPTS = [f"List ten fictional people from {place} as JSON, with name, age, city and job."
           for place in ("France", "Japan", "Brazil", "Kenya", "Canada", "India", "Norway", "Peru")]


async def one(client: httpx2.AsyncClient, url: str, prompt: str, constrained: bool, max_tokens: int) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    r = await client.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    reply = r.json()
    if constrained:
        assert reply["choices"][0]["finish_reason"] == "length", reply  # the schema outlasts max_tokens
    return reply["usage"]["completion_tokens"]


async def level(url: str, concurrency: int, constrained: bool, requests: int, max_tokens: int) -> float:
    """Output tokens per second for `requests` requests at a fixed concurrency."""
    async with httpx2.AsyncClient() as client:
        queue = [PROMPTS[i % len(PROMPTS)] + f" (set {i})" for i in range(requests)]
        tokens = 0

        async def worker():
            nonlocal tokens
            while queue:
                # Awaited first: `tokens += await ...` would read `tokens` before the await and lose the
                # other workers' additions made meanwhile.
                done = await one(client, url, queue.pop(), constrained, max_tokens)
                tokens += done

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return tokens / (time.perf_counter() - start)


def serving(url: str, concurrencies: list[int], rounds: int, max_tokens: int) -> list[dict]:
    rows = []
    print(f"{'concurrency':>11} {'plain tok/s':>12} {'JSON tok/s':>11} {'ratio':>6}   (rounds: ratio each)")
    for c in concurrencies:
        requests = max(4, 2 * c)
        asyncio.run(level(url, c, True, c, max_tokens))  # warm-up: the tokenizer for grammars, the prefix cache
        plain, constrained = [], []
        for _ in range(rounds):
            plain.append(asyncio.run(level(url, c, False, requests, max_tokens)))
            constrained.append(asyncio.run(level(url, c, True, requests, max_tokens)))
        each = " ".join(f"{b / a:.2f}" for a, b in zip(plain, constrained))
        p, q = statistics.mean(plain), statistics.mean(constrained)
        print(f"{c:>11} {p:>12.1f} {q:>11.1f} {q / p:>5.2f}x   ({each})", flush=True)
        rows.append({"concurrency": c, "plain_tok_s": plain, "json_tok_s": constrained, "ratio": q / p})
    return rows


def mask_costs(model_dir: Path) -> dict:
    import llguidance
    import torch

    from gateway.text.grammars import ResponseFormat, build_grammar, response_format_rules
    from worker.runner.structured_output import GrammarCompiler

    config = json.loads((model_dir / "config.json").read_text())
    compiler = GrammarCompiler(model_dir, config["vocab_size"], [config.get("eos_token_id", 2)])
    tok = compiler.tokenizer
    started = time.perf_counter()
    grammar = build_grammar(response_format_rules(ResponseFormat(SCHEMA, False)), "none")
    seq = compiler.sequence_grammar(grammar)
    compile_ms = (time.perf_counter() - started) * 1e3
    people = [{"name": f"Person {i}", "age": 20 + i, "city": "Lyon", "job": "baker"} for i in range(10)]
    tokens = tok.tokenize_str(json.dumps({"people": people}))
    logits = torch.randn(config["vocab_size"])
    check, mask, advance = [], [], []
    for t in tokens:
        row = logits.clone()  # a fresh row per token, copied outside the timing
        a = time.perf_counter()
        assert seq.allows(t)
        b = time.perf_counter()
        seq.mask_(row)
        c = time.perf_counter()
        seq.advance(t)
        d = time.perf_counter()
        check.append(b - a)
        mask.append(c - b)
        advance.append(d - c)
    us = lambda xs: f"median {statistics.median(xs) * 1e6:.0f} us, mean {statistics.mean(xs) * 1e6:.0f} us"
    print(f"\nper-token grammar costs over {len(tokens)} tokens of schema output (vocab {config['vocab_size']}, "
          f"llguidance {llguidance.__version__}; compile {compile_ms:.1f} ms):")
    print(f"  check a sampled token:      {us(check)}")
    print(f"  full mask + apply to logits: {us(mask)}")
    print(f"  advance the matcher:         {us(advance)}")
    median_us = lambda xs: round(statistics.median(xs) * 1e6, 1)
    return {"tokens": len(tokens), "vocab": config["vocab_size"], "llguidance": llguidance.__version__,
            "compile_ms": round(compile_ms, 2), "check_us_median": median_us(check),
            "mask_us_median": median_us(mask), "advance_us_median": median_us(advance)}


def start_server(port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)], cwd=ROOT,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mili serve exited; see {log}")
        try:
            if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx2.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise TimeoutError("mili serve did not become healthy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench_structured")
    parser.add_argument("--base-url", help="a running MILI serving the default model (else one is started)")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the figures here (with the CPU named)")
    args = parser.parse_args(argv)
    from shared.default_model import default_model_path

    proc = None
    url = args.base_url
    if url is None:
        proc = start_server(args.port, ROOT / "build" / "bench_structured_server.log")
        url = f"http://127.0.0.1:{args.port}"
    try:
        rows = serving(url, args.concurrency, args.rounds, args.max_tokens)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    costs = mask_costs(default_model_path())
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": cpu_name(), "model": MODEL, "max_tokens": args.max_tokens,
                                         "rounds": args.rounds, "serving": rows, "grammar_costs": costs},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
