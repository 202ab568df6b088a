"""Where MILI's resident memory goes: starts the real server (gateway + worker), sends a short load, and reads
each process's peak RSS (VmHWM) and its resident pages by mapping (/proc/<pid>/smaps) at steady state.

    python -m loadtest.rss_breakdown [--variant 'LABEL: ENV=VALUE --flag value ...'] [--concurrency 8]

Each --variant is one server start (flags passed to `mili serve`, NAME=VALUE words set in its environment);
the variants run one after another in the same run, so their numbers compare. Without --variant it measures
the sweep's configuration alone (`--num-kv-blocks` for 16384 tokens of KV, see loadtest/sweep.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from loadtest import bench_serve
from loadtest.fixtures.probes import peak_rss_mib
from loadtest.servers import RunningServer, ServerSpec
from shared.default_model import DEFAULT_SERVED_NAME

LOGS = Path(__file__).resolve().parent.parent / "build" / "bench-logs"
_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


@dataclass(frozen=True)
class Variant:
    label: str
    flags: list[str]
    env: dict[str, str]


def parse_variant(text: str) -> Variant:
    label, _, rest = text.partition(":")
    words = shlex.split(rest)
    env = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_][A-Z0-9_]*=", w))
    return Variant(label.strip(), [w for w in words if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)], env)


def category(path: str) -> str:
    """Which part of the program a mapping belongs to, by the file it maps (anonymous memory is one
    category: the Python heap, tensors, the KV cache and malloc's arenas all live there)."""
    if not path or path.startswith("[anon") or path == "[heap]":
        return "anonymous (heap, tensors, KV cache)"
    if path.endswith(".gguf"):
        return "GGUF file (mmapped)"
    if path.endswith(".safetensors"):
        return "safetensors (mmapped)"
    if "/build/kernels/" in path:
        return "MILI's Mojo kernels (.so)"
    if "/torch/" in path:
        return "torch libraries"
    if "/modular" in path or "/mojo" in path or "/max/" in path:
        return "Mojo runtime"
    if "site-packages" in path:
        return "other Python packages' libraries"
    if "python3" in path or "libpython" in path:
        return "Python interpreter"
    if path.startswith("["):
        return "stack and kernel pages"
    return "system libraries and other files"


def smaps_by_category(pid: int) -> dict[str, float]:
    """Resident MiB per category, from every mapping's Rss line."""
    out: dict[str, float] = defaultdict(float)
    path = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if _MAPPING.match(line):
            fields = line.split(None, 5)
            path = fields[5].strip() if len(fields) > 5 else ""
        elif line.startswith("Rss:"):
            out[category(path)] += int(line.split()[1]) / 1024
    return dict(out)


def current_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure_variant(variant: Variant, args) -> dict:
    base = [sys.executable, "-m", "gateway.cli", "serve", "--worker-threads", str(args.threads)]
    spec = ServerSpec(variant.label, lambda port, _: [*base, "--port", str(port), *variant.flags],
                      restart_per_level=False, model_processes="children")
    saved = {k: os.environ.get(k) for k in variant.env}
    os.environ.update(variant.env)  # the server and its worker inherit it
    try:
        server = RunningServer(spec, args.port, args.concurrency, LOGS / f"rss-{variant.label}.log", args.served_name)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        server.wait_ready()
        bench = bench_serve.parse_args([
            "--base-url", server.url, "--model", args.served_name, "--concurrency", str(args.concurrency),
            "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--quiet"])
        result = asyncio.run(bench_serve.run(bench))
        time.sleep(0.5)
        processes = server.processes()
        out = {"flags": variant.flags, "env": variant.env, "errors": result["errors"], "processes": {}}
        for role, pid in processes.items():
            out["processes"][role] = {"peak_rss_mib": peak_rss_mib(pid), "rss_mib": current_rss_mib(pid),
                                      "by_mapping_mib": smaps_by_category(pid)}
        return out
    finally:
        server.stop()


def print_report(results: dict[str, dict]) -> None:
    labels = list(results)
    print("\npeak RSS (VmHWM), MiB: " + ", ".join(
        f"{label}: gateway {r['processes']['gateway']['peak_rss_mib']:.0f} + worker "
        f"{r['processes']['worker']['peak_rss_mib']:.0f} = "
        f"{sum(p['peak_rss_mib'] for p in r['processes'].values()):.0f}" for label, r in results.items()))
    for role in ("worker", "gateway"):
        cats = sorted({c for r in results.values() for c in r["processes"][role]["by_mapping_mib"]},
                      key=lambda c: -results[labels[0]]["processes"][role]["by_mapping_mib"].get(c, 0.0))
        print(f"\n{role}: resident MiB at steady state, by mapping\n")
        print("| mapping | " + " | ".join(labels) + " |")
        print("|---|" + "---|" * len(labels))
        for c in cats:
            print(f"| {c} | " + " | ".join(f"{r['processes'][role]['by_mapping_mib'].get(c, 0.0):.1f}"
                                         for r in results.values()) + " |")
        print("| total (VmRSS) | " + " | ".join(f"{r['processes'][role]['rss_mib']:.1f}" for r in results.values())
              + " |")
        print("| peak (VmHWM) | " + " | ".join(f"{r['processes'][role]['peak_rss_mib']:.1f}"
                                             for r in results.values()) + " |")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", type=parse_variant,
                   help="'LABEL: [NAME=VALUE ...] [mili serve flags]'; repeat to compare in one run")
    p.add_argument("--served-model-name", dest="served_name", default=DEFAULT_SERVED_NAME)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = args.variant or [parse_variant("sweep: --num-kv-blocks 1024")]
    LOGS.mkdir(parents=True, exist_ok=True)
    results = {}
    for v in variants:
        print(f"{v.label}: {' '.join([*(f'{k}={x}' for k, x in v.env.items()), *v.flags])}", flush=True)
        results[v.label] = measure_variant(v, args)
    print_report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if any(r["errors"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
