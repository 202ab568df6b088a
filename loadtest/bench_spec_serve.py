"""Speculative decoding over HTTP, against llama.cpp's own: MILI's server (gateway + worker) with and without
`--speculative-config`, and llama-server without speculation and with its n-gram speculation in its best
configuration, serving the same GGUF (MILI its quantized blocks), in one run:

    python -m loadtest.bench_spec --http [--model PATH.gguf] [--concurrency 1 4 16] [--max-tokens 128]

Every server gets the same requests: /v1/completions with the same prompt text (the workloads of
loadtest/spec_workloads.py rendered by the model's chat template), temperature 0, the same max_tokens; the c
requests of a level start together and the level ends with its last one; tok/s is the completion tokens
the servers report over that time, the best of --repeats runs. Before each timed run the same prompts are
sent with max_tokens 1, so every server holds them in its prompt cache and the runs time decoding.
Calibration runs are the best of --calibrate-repeats.

Calibration first: llama-server's n-gram types (`--spec-type`) with a couple of draft sizes each
(LLAMA_CONFIGS) on both workloads at --calibrate-concurrency; the one with the best tok/s per workload
(summed over those levels) is llama-server's "best" in the comparison. Each server starts once (llama-server
with -np the largest concurrency and 1024 tokens of context a slot), except llama-server with a type that
keeps drafting state between requests (`stateful`), which starts afresh for every timed run.

Writes loadtest/results/spec-serve-<model>.md (the CPU named) and prints the same tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2

from loadtest.machine import cpu_name
from loadtest.servers import RunningServer, ServerSpec, llama_server_spec, mili_spec, start_server
from loadtest.spec_workloads import DEFAULT_SPEC, WORKLOADS, chat_text, model_dir, model_gguf

RESULTS = Path(__file__).resolve().parent / "results"
LOGS = Path(__file__).resolve().parent.parent / "build" / "bench-logs"


def _ngram(kind: str, n: int, m: int, *more: str) -> tuple[str, ...]:
    """llama-server flags for an n-gram type with lookup key n and draft length m."""
    return ("--spec-type", kind, f"--spec-{kind}-size-n", str(n), f"--spec-{kind}-size-m", str(m), *more)


# llama-server's n-gram speculation (docs/speculative.md of its source): ngram-simple drafts what followed the
# latest earlier occurrence of the last n tokens (MILI's rule), ngram-map-k the same from a map of keys,
# ngram-map-k4v the most frequent of up to four continuations, ngram-mod from a hash pool all slots share
# (n_min..n_max drafted tokens, after an n_match-token key), ngram-cache from n-gram statistics of the context
# (8 tokens; no cache files given). Their defaults (n 12, m 48; mod 24, 48..64)
# are for long repetitions, so shorter keys and drafts are tried beside them.
LLAMA_CONFIGS: dict[str, tuple[str, ...]] = {
    "ngram-simple n3 m8": _ngram("ngram-simple", 3, 8),
    "ngram-simple n3 m16": _ngram("ngram-simple", 3, 16),
    "ngram-simple default (n12 m48)": ("--spec-type", "ngram-simple"),
    "ngram-map-k n3 m8": _ngram("ngram-map-k", 3, 8),
    "ngram-map-k n3 m16": _ngram("ngram-map-k", 3, 16),
    "ngram-map-k4v n3 m8": _ngram("ngram-map-k4v", 3, 8),
    "ngram-map-k4v n8 m8 hits2": _ngram("ngram-map-k4v", 8, 8, "--spec-ngram-map-k4v-min-hits", "2"),
    "ngram-mod match12 2..16": ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "12",
                                "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "16"),
    "ngram-mod default (24, 48..64)": ("--spec-type", "ngram-mod"),
    "ngram-cache (8)": ("--spec-type", "ngram-cache"),
}


STATEFUL_TYPES = ("ngram-mod", "ngram-cache")  # their drafting state outlives a request


def stateful(config: str) -> bool:
    """Whether the configuration's server must start afresh for every timed run: ngram-mod's hash pool is shared
    by all slots and kept between requests, so a server that had decoded the same prompts before would draft
    from their earlier outputs (ngram-cache is restarted too, its context statistics being kept per slot)."""
    flags = LLAMA_CONFIGS[config]
    return flags[flags.index("--spec-type") + 1] in STATEFUL_TYPES


@dataclass
class Run:
    """One timed level: generated tokens per second, the texts, and drafted / accepted tokens if known."""
    tok_s: float
    texts: list[str]
    drafted: int | None = None
    accepted: int | None = None

    def acceptance(self) -> str:
        return "-" if not self.drafted else f"{self.accepted}/{self.drafted}"


async def _send(url: str, model: str, prompts: list[str], max_tokens: int) -> tuple[float, list[dict]]:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0}
    async with httpx2.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        replies = await asyncio.gather(*(client.post("/v1/completions", json={**body, "prompt": p}) for p in prompts))
        seconds = time.perf_counter() - start
    for r in replies:
        r.raise_for_status()
    return seconds, [r.json() for r in replies]


_SPEC_TOTALS = re.compile(r"^vllm:spec_decode_num_(draft|accepted)_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _mili_spec_totals(url: str) -> dict[str, float]:
    """MILI's drafted and accepted token totals from /metrics ({} without speculation)."""
    text = httpx2.get(f"{url}/metrics", timeout=30).text
    return {kind: float(value) for kind, value in _SPEC_TOTALS.findall(text)}


def timed(server: RunningServer, prompts: list[str], max_tokens: int) -> Run:
    asyncio.run(_send(server.url, server.served_name, prompts, 1))  # the prompts into every server's cache
    before = _mili_spec_totals(server.url) if server.spec.name.startswith("mili") else {}
    seconds, replies = asyncio.run(_send(server.url, server.served_name, prompts, max_tokens))
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    run = Run(tokens / seconds, [r["choices"][0]["text"] for r in replies])
    timings = [r.get("timings", {}) for r in replies]  # llama-server's, with its draft counts when it speculates
    if any("draft_n" in t for t in timings):
        run.drafted = sum(t.get("draft_n", 0) for t in timings)
        run.accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
    elif before:
        after = _mili_spec_totals(server.url)
        run.drafted, run.accepted = (int(after[k] - before[k]) for k in ("draft", "accepted"))
    return run


class Servers:
    """Starts each spec's server once and keeps it (MILI's two side by side, llama-server's with -np the largest
    concurrency), except a `fresh` run's: a server of its own, started for that run and stopped after it."""

    def __init__(self, served_name: str, port: int, slots: int):
        self.served_name, self.port, self.slots = served_name, port, slots
        self._running: dict[str, RunningServer] = {}
        self._ports: dict[str, int] = {}  # one per server name

    def _start(self, spec: ServerSpec) -> RunningServer:
        port = self._ports.setdefault(spec.name, self.port + len(self._ports))
        server = start_server(spec, port, self.slots, LOGS, self.served_name)
        asyncio.run(_send(server.url, self.served_name, ["Hello"], 4))  # first-request costs
        return server

    def run(self, spec: ServerSpec, prompts: list[str], max_tokens: int, fresh: bool = False) -> Run:
        if fresh:
            self.stop(spec.name)
            server = self._start(spec)
            try:
                return timed(server, prompts, max_tokens)
            finally:
                server.stop()
        if spec.name not in self._running:
            self._running[spec.name] = self._start(spec)
        return timed(self._running[spec.name], prompts, max_tokens)

    def stop(self, name: str | None = None) -> None:
        """Stops the server of that name (None: every one)."""
        for key in [name] if name else list(self._running):
            server = self._running.pop(key, None)
            if server is not None:
                server.stop()


def best_of(servers: Servers, spec: ServerSpec, prompts: list[str], max_tokens: int, repeats: int,
            fresh: bool = False) -> Run:
    runs = [servers.run(spec, prompts, max_tokens, fresh) for _ in range(repeats)]
    return max(runs, key=lambda r: r.tok_s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="a .gguf every server loads (default: the default model's)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--calibrate-concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--spec", default=json.dumps(DEFAULT_SPEC), help="MILI's --speculative-config")
    p.add_argument("--llama-configs", nargs="+", choices=list(LLAMA_CONFIGS), default=list(LLAMA_CONFIGS),
                   metavar="NAME", help=f"llama-server configurations to calibrate, from: {', '.join(LLAMA_CONFIGS)}")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--calibrate-repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--out", type=Path, help="result file (default: loadtest/results/spec-serve-<model>.md)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from loadtest.peers.llama_server import ensure_llama_server, version

    gguf = model_gguf(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir(args.model)))
    served = gguf.stem
    LOGS.mkdir(parents=True, exist_ok=True)
    binary = ensure_llama_server()
    mili = {"plain": mili_spec(args.threads, str(gguf), served, name="mili-plain"),
            "spec": mili_spec(args.threads, str(gguf), served, name="mili-spec",
                              extra_args=("--speculative-config", args.spec))}

    def llama(config: str | None) -> ServerSpec:
        # -c: 1024 tokens a slot (the grounded prompts are about 550, plus the output).
        slug = re.sub(r"[^a-z0-9]+", "-", config.lower()).strip("-") if config else "plain"
        return llama_server_spec(binary, gguf, served, args.threads, name=f"llama-server-{slug}",
                                 extra_args=LLAMA_CONFIGS[config] if config else ())

    texts = {w: [chat_text(tokenizer, w, i) for i in range(max(args.concurrency + args.calibrate_concurrency))]
             for w in args.workloads}
    lines = [f"# Speculative decoding over HTTP: MILI against llama-server, {gguf.name}", "",
             f"CPU: {cpu_name()}, {args.threads} threads. llama-server: {version()}.",
             f"`{shlex.join(['python', '-m', 'loadtest.bench_spec', '--http', *(argv or [])])}`", "",
             f"Greedy, max_tokens {args.max_tokens}, /v1/completions with the same prompt text, the c requests "
             f"started together, prompts cached first, best of {args.repeats}. MILI speculative: `{args.spec}`.", ""]
    servers = Servers(served, args.port, max(args.concurrency + args.calibrate_concurrency))
    started = time.monotonic()
    try:
        # Calibration: every llama-server configuration on each workload; the best (summed tok/s) per workload.
        lines += ["## llama-server calibration", "", "| configuration | workload | c | tok/s | x plain | acceptance |",
                  "|---|---|---|---|---|---|"]
        best: dict[str, str] = {}
        for w in args.workloads:
            totals: dict[str, float] = {}
            plain = {c: best_of(servers, llama(None), texts[w][:c], args.max_tokens, args.calibrate_repeats)
                     for c in args.calibrate_concurrency}
            for config in args.llama_configs:
                totals[config] = 0.0
                for c in args.calibrate_concurrency:
                    try:
                        run = best_of(servers, llama(config), texts[w][:c], args.max_tokens, args.calibrate_repeats,
                                      stateful(config))
                    except (RuntimeError, httpx2.HTTPError) as e:  # a type that exits or fails a request
                        line = f"| {config} | {w} | {c} | failed: {str(e)[:80]} | | |"
                        totals[config] = float("-inf")
                    else:
                        totals[config] += run.tok_s
                        line = (f"| {config} | {w} | {c} | {run.tok_s:.1f} | {run.tok_s / plain[c].tok_s:.2f} "
                                f"| {run.acceptance()} |")
                    lines.append(line)
                    print(line, flush=True)
                servers.stop(llama(config).name)
            best[w] = max(totals, key=totals.get)
        lines += ["", "Best per workload: " + ", ".join(f"{w}: {c}" for w, c in best.items()), ""]
        # The comparison.
        lines += ["## Comparison", "",
                  "| workload | c | MILI plain | MILI spec | llama plain | llama spec | MILI spec / MILI plain "
                  "| MILI spec / llama spec | llama spec / llama plain | acceptance MILI | acceptance llama "
                  "| identical MILI, llama |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for w in args.workloads:
            for c in args.concurrency:
                prompts = texts[w][:c]
                mp, ms, lp, ls = (Run(0.0, []) for _ in range(4))
                for _ in range(args.repeats):  # alternated, best of each: other load only slows a run
                    mp, ms, lp, ls = (max(old, new, key=lambda r: r.tok_s) for old, new in zip(
                        (mp, ms, lp, ls), (servers.run(s, prompts, args.max_tokens, fresh) for s, fresh in (
                            (mili["plain"], False), (mili["spec"], False), (llama(None), False),
                            (llama(best[w]), stateful(best[w]))))))
                same_mili = sum(a == b for a, b in zip(mp.texts, ms.texts))
                same_llama = sum(a == b for a, b in zip(lp.texts, ls.texts))
                line = (f"| {w} | {c} | {mp.tok_s:.1f} | {ms.tok_s:.1f} | {lp.tok_s:.1f} | {ls.tok_s:.1f} "
                        f"| {ms.tok_s / mp.tok_s:.2f}x | {ms.tok_s / ls.tok_s:.2f}x | {ls.tok_s / lp.tok_s:.2f}x "
                        f"| {ms.acceptance()} | {ls.acceptance()} | {same_mili}/{c}, {same_llama}/{c} |")
                lines.append(line)
                print(line, flush=True)
        lines += ["", "llama spec: " + ", ".join(f"{w}: {best[w]} (`{' '.join(LLAMA_CONFIGS[best[w]])}`)"
                                                 for w in args.workloads) + ".",
                  f"The run took {(time.monotonic() - started) / 60:.1f} minutes.", ""]
    finally:
        servers.stop()
    out = args.out or RESULTS / f"spec-serve-{gguf.stem}.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}")
