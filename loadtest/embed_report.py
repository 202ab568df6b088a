"""The embedding benchmark's table: one row per (input length, server, file, concurrency), its texts/s, tokens/s and
the server's peak RSS, and its ratios against llama-server (same length, same concurrency) and against
sentence-transformers' in-process `encode` (same length). Pure formatting: loadtest/bench_embed.py measures."""

from __future__ import annotations

from dataclasses import dataclass

LLAMA = "llama-server"
ST = "sentence-transformers"


@dataclass(frozen=True)
class Row:
    length: int  # tokens per text
    server: str  # LLAMA, ST or a MILI label
    file: str  # which checkpoint file it served
    concurrency: str  # "1", "32", "batch 32"
    texts: int
    tokens: int
    seconds: float
    peak_rss_mib: float | None

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _ratio(row: Row, base: Row | None) -> str:
    return "" if base is None or base is row else f"{row.texts_per_s / base.texts_per_s:.2f}x"


def table(rows: list[Row]) -> str:
    """Markdown, rows in the given order; the ratio columns are blank where there is no baseline (or for it)."""
    llama = {(r.length, r.concurrency): r for r in rows if r.server == LLAMA}
    st = {r.length: r for r in rows if r.server == ST}
    lines = [("| input tokens | server | file served | concurrency | texts/s | tokens/s | peak RSS MiB "
              "| vs llama-server | vs sentence-transformers |"),
             "|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rss = "" if r.peak_rss_mib is None else f"{r.peak_rss_mib:.0f}"
        lines.append(f"| {r.length} | {r.server} | {r.file} | {r.concurrency} | {r.texts_per_s:.2f} | "
                     f"{r.tokens_per_s:.0f} | {rss} | {_ratio(r, llama.get((r.length, r.concurrency)))} | "
                     f"{_ratio(r, st.get(r.length))} |")
    return "\n".join(lines)


def goals(rows: list[Row], mili: str) -> list[str]:
    """The issue's goals for the server labelled `mili` serving the GGUF llama-server serves: >= 1.2x llama-server
    at concurrency 1, >= 2x at 32; and, on any file, at least sentence-transformers' in-process throughput at 32."""
    out = []
    llama = {(r.length, r.concurrency): r for r in rows if r.server == LLAMA}
    st = {r.length: r for r in rows if r.server == ST}
    for r in rows:
        if r.server != mili:
            continue
        base = llama.get((r.length, r.concurrency))
        target = {"1": 1.2, "32": 2.0}.get(r.concurrency)
        if base is not None and base.file == r.file and target is not None:
            ratio = r.texts_per_s / base.texts_per_s
            out.append(f"{r.length} tokens, concurrency {r.concurrency}, {r.file}: {ratio:.2f}x llama-server "
                       f"(goal {target}x): {'met' if ratio >= target else 'not met'}")
        if r.concurrency == "32" and r.length in st:
            ratio = r.texts_per_s / st[r.length].texts_per_s
            out.append(f"{r.length} tokens, concurrency 32, {r.file}: {ratio:.2f}x sentence-transformers' encode "
                       f"(goal 1x): {'met' if ratio >= 1 else 'not met'}")
    return out
