"""One user, several servers, in alternating rounds: the concurrency-1 comparison for a machine whose speed drifts.

    python -m loadtest.paired_rounds --servers mili,llama-server --gguf build/models/qwen3-0.6b-q4_k_m.gguf \
        [--rounds 4] [--prompts 6] [--ttft-input-len 512] [--name c1-rounds-qwen3-0.6b-q4_k_m]

A shared VM's memory bandwidth moves by a third within minutes (neighbours on the host), and a concurrency-1
decode is bound by it, so servers measured one after another (loadtest/sweep.py) can differ by the minute they
ran in. Here every round starts each server in turn, alone on the machine as in the sweep, measures its output
tok/s and TPOT at concurrency 1 (same seeded prompts, `--input-len` tokens, `--output-len` out) and its time to
first token at `--ttft-input-len`, then stops it; the order flips every round (A B, B A, ...), so a drift
within a round falls on both sides alike. Each round gives each server's ratio to the first server's; the table
prints every round's and their median. Nothing is asserted: the ratios are the result. Results go to
loadtest/results/<name>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from loadtest.sweep import LOGS, RESULTS, build_specs, machine, measure
from loadtest.servers import start_server
from shared.default_model import DEFAULT_SERVED_NAME, default_gguf_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="mili,llama-server", help="comma-separated, as loadtest.sweep takes them; "
                                                                  "ratios are to the first")
    p.add_argument("--gguf", type=Path, help="the model every server runs (default: the default model's GGUF)")
    p.add_argument("--served-model-name", dest="served_name")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--prompts", type=int, default=6, help="requests per measurement, one at a time")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ttft-input-len", type=int, default=512)
    p.add_argument("--ttft-prompts", type=int, default=3)
    p.add_argument("--context-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="c1-rounds")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.prompts < 1 or args.ttft_prompts < 1:
        p.error("--rounds, --prompts and --ttft-prompts must be at least 1")
    if len(args.servers.split(",")) < 2:
        p.error("--servers needs at least two servers to compare")
    return args


def run_round(specs, order: list[int], args) -> dict[str, dict]:
    out = {}
    for i in order:
        spec = specs[i]
        server = start_server(spec, args.port, 1, LOGS, args.served_name)
        try:
            measure(server, 2, 2, 16, 8, seed=999)  # warm-up, as in the sweep
            c1 = measure(server, 1, args.prompts, args.input_len, args.output_len, args.seed)
            long = measure(server, 1, args.ttft_prompts, args.ttft_input_len, args.output_len, args.seed + 1)
        finally:
            server.stop()
        out[spec.name] = {"config": server.spec.config, "tok_s": c1["output_throughput"],
                          "tpot_ms": c1["tpot"]["median_ms"], "ttft_ms": c1["ttft"]["median_ms"],
                          "ttft_long_ms": long["ttft"]["median_ms"], "errors": c1["errors"] + long["errors"]}
    return out


def markdown(results: dict) -> str:
    names = results["servers"]
    base, others = names[0], names[1:]
    s = results["settings"]
    lines = [f"Machine: {results['machine']['cpu']}, {results['machine']['cores']} cores; "
             f"{results['machine'].get('llama_server', '')}".rstrip("; "),
             f"Run {results['started']}. Model: {s['gguf']}. Concurrency 1, {s['prompts']} requests of {s['input_len']} "
             f"tokens in, {s['output_len']} out (temperature 0, ignore_eos), then {s['ttft_prompts']} of "
             f"{s['ttft_input_len']} for the time to first token; each server started alone in turn, the order "
             f"flipped every round. Ratios: {base} over each other server, within the round (higher is better for "
             f"{base}: its tok/s over theirs, their TTFT over its).", ""]
    head = "| round | order | " + " | ".join(f"{n} tok/s | {n} TTFT{s['ttft_input_len']} ms" for n in names)
    head += " | " + " | ".join(f"tok/s {base} / {o} | TTFT{s['ttft_input_len']} {o} / {base}" for o in others) + " |"
    lines += [head, "|" + "---|" * (2 + 2 * len(names) + 2 * len(others))]
    ratios = {o: ([], []) for o in others}
    for r, rnd in enumerate(results["rounds"]):
        m = rnd["servers"]
        row = [str(r + 1), " then ".join(rnd["order"])]
        row += [f"{m[n]['tok_s']:.1f} | {m[n]['ttft_long_ms']:.0f}" for n in names]
        for o in others:
            tok = m[base]["tok_s"] / m[o]["tok_s"]
            ttft = m[o]["ttft_long_ms"] / m[base]["ttft_long_ms"]
            ratios[o][0].append(tok)
            ratios[o][1].append(ttft)
            row.append(f"{tok:.2f}x | {ttft:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for o in others:
        tok, ttft = ratios[o]
        lines.append(f"{base} / {o}, median of {len(tok)} rounds: output tok/s {statistics.median(tok):.2f}x "
                     f"(rounds {min(tok):.2f}-{max(tok):.2f}x); TTFT at {s['ttft_input_len']} tokens "
                     f"{statistics.median(ttft):.2f}x ({min(ttft):.2f}-{max(ttft):.2f}x).")
    errors = sum(m["errors"] for rnd in results["rounds"] for m in rnd["servers"].values())
    lines.append(f"Errors: {errors}. Configurations: " + "; ".join(
        f"{n}: {results['rounds'][0]['servers'][n]['config'] or 'as shipped'}" for n in names) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.servers.split(",")
    if args.gguf is None:
        args.gguf = default_gguf_path()
        args.served_name = args.served_name or DEFAULT_SERVED_NAME
    args.served_name = args.served_name or args.gguf.stem
    LOGS.mkdir(parents=True, exist_ok=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    specs = build_specs(names, args.threads, args.gguf, args.served_name, "auto", args.context_tokens)
    results = {"machine": machine(), "settings": {k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(args).items() if k != "out_dir"},
               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "servers": names, "rounds": []}
    if any(n.startswith("llama-server") for n in names):
        from loadtest.peers.llama_server import version

        results["machine"]["llama_server"] = version()
    for r in range(args.rounds):
        order = list(range(len(specs))) if r % 2 == 0 else list(reversed(range(len(specs))))
        print(f"round {r + 1}:", flush=True)
        results["rounds"].append({"order": [names[i] for i in order], "servers": run_round(specs, order, args)})
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(results, indent=2, default=str))
    table = markdown(results)
    (args.out_dir / f"{args.name}.md").write_text(table)
    print(table)
    return 1 if any(m["errors"] for rnd in results["rounds"] for m in rnd["servers"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
