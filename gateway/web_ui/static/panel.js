// The server panel: /metrics (Prometheus text) and /health, read every second while the page is visible.

import { getJson, call, Unauthorized } from "./api.js";
import { parseMetrics, total } from "./prometheus.js";

const PERIOD_MS = 1000;

function show(id, text) {
  document.getElementById(id).textContent = text;
}

function count(value) {
  return value === null ? "–" : String(Math.round(value));
}

export class ServerPanel {
  constructor(onUnauthorized) {
    this.onUnauthorized = onUnauthorized;
    this.previous = null; // {tokens, at}: the generation counter at the last read, for tokens/s
    this.timer = null;
    this.paused = false;
  }

  start() {
    if (this.timer === null) this.timer = setInterval(() => this.tick(), PERIOD_MS);
    this.tick();
  }

  pause() {
    this.paused = true;
  }

  resume() {
    this.paused = false;
    this.tick();
  }

  async tick() {
    if (this.paused || document.hidden) return;
    await Promise.all([this.readMetrics(), this.readHealth()]);
  }

  async readMetrics() {
    let samples;
    try {
      samples = parseMetrics(await (await call("/metrics")).text());
    } catch (e) {
      if (e instanceof Unauthorized) this.onUnauthorized(e.message);
      show("srv-note", "Metrics unavailable: " + e.message);
      return;
    }
    show("srv-note", "From /metrics and /health, every second.");
    show("srv-running", count(total(samples, "mili_requests_running")));
    show("srv-waiting", count(total(samples, "mili_requests_waiting")));
    const used = total(samples, "mili_kv_blocks_used");
    const blocks = total(samples, "mili_kv_blocks_total");
    show("srv-kv", blocks ? `${(100 * used / blocks).toFixed(1)}% of ${blocks} blocks` : "–");
    const tokens = total(samples, "mili_generation_tokens_total");
    const now = performance.now();
    if (this.previous !== null && tokens !== null) {
      const rate = (tokens - this.previous.tokens) / ((now - this.previous.at) / 1000);
      show("srv-tps", rate >= 0 ? rate.toFixed(1) : "–");
    }
    this.previous = tokens === null ? null : { tokens, at: now };
    const queries = total(samples, "mili_prefix_cache_queries_total");
    const hits = total(samples, "mili_prefix_cache_hits_total");
    show("srv-prefix", queries ? `${(100 * hits / queries).toFixed(1)}% of ${Math.round(queries)} tokens` : "–");
  }

  async readHealth() {
    const state = document.getElementById("server-state");
    let health;
    try {
      health = await getJson("/health");
    } catch (e) {
      state.textContent = "● " + (e.message || "unreachable");
      state.className = "server-state down";
      return;
    }
    state.textContent = "● ready";
    state.className = "server-state up";
    show("srv-device", health.device || "–");
    show("srv-backend", health.attention_backend || "–");
    show("srv-quant", health.quantization || "none");
  }
}
