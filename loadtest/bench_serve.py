"""A serving benchmark client in the manner of `vllm bench serve`, for any OpenAI-compatible server.

Sends streaming /v1/completions (or /v1/chat/completions) requests with random prompts of a fixed or
random length and a fixed number of output tokens (ignore_eos), either at a fixed concurrency or at a
Poisson request rate, and reports TTFT, TPOT (time per output token after the first), ITL (gaps between
streamed chunks) and end-to-end latency (mean, median, p99), request and output-token throughput, and
errors. Results go to stdout and, with --result-json, to a JSON file.

    python -m loadtest.bench_serve --base-url http://127.0.0.1:8000 --model SmolLM2-135M-Instruct \\
        --num-prompts 64 --concurrency 8 --input-len 128 --output-len 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx2

WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be or had "
         "not but one have they you all their has been there more when who will would no out so up said what "
         "its about into than them can only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where").split()


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def random_prompt(rng: random.Random, words: int) -> str:
    """Roughly one token per word for BPE vocabularies; the server's usage reports the exact count."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def one_request(client: httpx2.AsyncClient, args, prompt: str) -> RequestResult:
    chat = args.endpoint == "chat"
    body = {"model": args.model, "max_tokens": args.output_len, "temperature": args.temperature, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    result = RequestResult(ok=False)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = str(chunk["error"])[:200]
                    return result
                if chunk.get("usage"):
                    result.prompt_len = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                text = "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for c in choices)
                if text:
                    now = time.perf_counter()
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
        result.latency = time.perf_counter() - start
        result.ok = result.output_tokens > 0
        if not result.ok:
            result.error = "no usage chunk or no output"
    except (httpx2.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


def make_prompts(args) -> tuple[list[str], random.Random]:
    """The run's prompts (from --seed, --num-prompts, --input-len, --random-range) and the generator that made
    them, which then times Poisson arrivals."""
    rng = random.Random(args.seed)
    lengths = [args.input_len if not args.random_range else
               rng.randint(int(args.input_len * (1 - args.random_range)), int(args.input_len * (1 + args.random_range)))
               for _ in range(args.num_prompts)]
    return [random_prompt(rng, n) for n in lengths], rng


async def run(args) -> dict:
    prompts, rng = make_prompts(args)
    # A fresh connection per request: a server that closes idle keep-alive connections (llama-server does after a
    # few requests) must not turn a reused, already-closed connection into a failed request.
    limits = httpx2.Limits(max_connections=max(args.concurrency or 0, 256), max_keepalive_connections=0)
    semaphore = asyncio.Semaphore(args.concurrency) if args.concurrency else None
    done = 0

    async def limited(client, prompt):
        nonlocal done
        if semaphore is None:
            result = await one_request(client, args, prompt)
        else:
            async with semaphore:
                result = await one_request(client, args, prompt)
        done += 1
        if not args.quiet:
            width = 40
            filled = width * done // len(prompts)
            print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{len(prompts)}", end="", file=sys.stderr)
        return result

    async with httpx2.AsyncClient(base_url=args.base_url, timeout=args.timeout, limits=limits,
                                  headers={"authorization": f"Bearer {args.api_key}"} if args.api_key else None) as c:
        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(c, prompt)))
            if args.request_rate:  # Poisson arrivals
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    if not args.quiet:
        print(file=sys.stderr)
    return summarize(results, duration, args)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean_ms": 0.0, "median_ms": 0.0, "p99_ms": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean_ms": 1e3 * statistics.fmean(ordered), "median_ms": 1e3 * statistics.median(ordered),
            "p99_ms": 1e3 * p99}


def summarize(results: list[RequestResult], duration: float, args) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "base_url": args.base_url, "model": args.model, "endpoint": args.endpoint,
        "concurrency": args.concurrency, "request_rate": args.request_rate, "num_prompts": len(results),
        "input_len": args.input_len, "output_len": args.output_len,
        "completed": len(ok), "errors": len(results) - len(ok),
        "error_samples": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (output_tokens + sum(r.prompt_len for r in ok)) / duration,
        "mean_prompt_tokens": statistics.fmean(r.prompt_len for r in ok) if ok else 0,
        "ttft": _stats([r.ttft for r in ok]),
        "tpot": _stats(tpot),
        "itl": _stats([x for r in ok for x in r.itl]),
        "e2e_latency": _stats([r.latency for r in ok]),
    }


def print_summary(s: dict) -> None:
    print(f"{s['completed']}/{s['num_prompts']} requests in {s['duration_s']:.2f} s ({s['errors']} errors), "
          f"concurrency {s['concurrency'] or '-'}, rate {s['request_rate'] or 'all at once'}")
    print(f"  request throughput {s['request_throughput']:.2f} req/s, output {s['output_throughput']:.1f} tok/s, "
          f"total {s['total_token_throughput']:.1f} tok/s, mean prompt {s['mean_prompt_tokens']:.0f} tokens")
    for name in ("ttft", "tpot", "itl", "e2e_latency"):
        m = s[name]
        print(f"  {name:<12} mean {m['mean_ms']:8.1f} ms  median {m['median_ms']:8.1f} ms  p99 {m['p99_ms']:8.1f} ms")
    for sample in s["error_samples"]:
        print(f"  error: {sample}")


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (0: unlimited)")
    p.add_argument("--request-rate", type=float, default=0.0, help="Poisson arrivals per second (0: all at once)")
    p.add_argument("--input-len", type=int, default=128, help="prompt length in words (about one token each)")
    p.add_argument("--random-range", type=float, default=0.0, help="vary prompt lengths by this fraction")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--api-key")
    p.add_argument("--result-json")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = asyncio.run(run(args))
    print_summary(summary)
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
