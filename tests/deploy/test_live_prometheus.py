"""deploy/ against a running MILI: every metric that the dashboard, the rules, the autoscalers and the routers
query exists in its /metrics; and a real Prometheus (Debian's), with the shipped scrape config and rules,
scrapes it and evaluates the rules, and every dashboard query runs against it.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import httpx2
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import SERVED_NAME
from tests.deploy.test_static import RULES, as_promql, dashboard_exprs
from tests.deploy.tools import DEPLOY, K8S, tool
from tests.helpers.server import free_port

# What the routers read (gateway/metrics/router_metrics.py): the llm-d / GAIE endpoint picker's vLLM mapping, and SMG.
EPP_READS = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
             "vllm:cache_config_info")
SMG_READS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
             "vllm:gpu_prefix_cache_hit_rate")
METRIC = re.compile(r"(?<![\w:])(mili_[a-z0-9_]+|vllm:[a-z0-9_]+)")  # not inside a recorded name


def queried_metrics() -> dict[str, set[str]]:
    """Metric names each deploy artifact queries, by artifact."""
    texts = {
        "dashboard": "\n".join(dashboard_exprs()),
        "rules": RULES.read_text(),
        "keda": (K8S / "autoscaling" / "keda" / "scaledobject.yaml").read_text(),
        "prometheus-adapter": (K8S / "autoscaling" / "prometheus-adapter" / "prometheus-adapter-rules.yaml").read_text()
        + (K8S / "autoscaling" / "prometheus-adapter" / "hpa.yaml").read_text(),
    }
    found = {name: set(METRIC.findall(text)) for name, text in texts.items()}
    found["endpoint picker"] = set(EPP_READS)
    found["smg"] = set(SMG_READS)
    return found


def exposed(server) -> set[str]:
    text = httpx2.get(f"{server.url}/metrics", timeout=5).text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def generate(server, n: int = 4) -> None:
    for i in range(n):
        r = httpx2.post(f"{server.url}/v1/completions", timeout=60,
                        json={"model": SERVED_NAME, "prompt": f"deploy {i}", "max_tokens": 8, "ignore_eos": True})
        assert r.status_code == 200, r.text


def test_every_queried_metric_exists(mili):
    generate(mili, 2)  # counters labelled by finish reason appear with the first finished request
    names = exposed(mili)
    for artifact, metrics in queried_metrics().items():
        assert metrics, f"{artifact} queries no metric?"
        for metric in metrics:
            # A histogram or counter is queried by its family name plus a suffix, or by the name exposed.
            variants = {metric, f"{metric}_total", f"{metric}_bucket"}
            assert variants & names, f"{artifact} queries {metric}, which MILI does not expose"


def test_recording_rules_used_by_alerts_are_defined():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    for g in groups:
        for rule in g["rules"]:
            for name in re.findall(r"\b(model:[a-z_:0-9]+)", rule["expr"]):
                assert name in recorded, f"{rule.get('alert', rule.get('record'))} uses {name}, recorded nowhere"


class Prometheus:
    """Debian's Prometheus on loopback with the shipped scrape config and rules, scraping every second."""

    def __init__(self, tmp_path, target: str):
        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            group["interval"] = "1s"  # the shipped 30 s would make this test wait
        (rules_dir / "mili.rules.yml").write_text(yaml.safe_dump(rules))
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(rules_dir / "*.yml")]
        (job,) = config["scrape_configs"]
        assert job["job_name"] == "mili"
        job["static_configs"] = [{"targets": [target]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [tool("prometheus", "apt-get install prometheus (.ci/run does)"),
             f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "prometheus exited"
            try:
                if httpx2.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("prometheus not ready")

    def query(self, expr: str) -> list[dict]:
        body = httpx2.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def wait_for(self, expr: str, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            assert time.monotonic() < deadline, f"no result for {expr} after {timeout} s"
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus(mili, tmp_path):
    prom = Prometheus(tmp_path, f"127.0.0.1:{mili.port}")
    try:
        prom.wait_ready()
        yield prom
    finally:
        prom.stop()


def test_prometheus_scrapes_mili_and_evaluates_the_rules(mili, prometheus):
    (up,) = prometheus.wait_for('up{job="mili"} == 1')
    assert up["metric"]["instance"] == f"127.0.0.1:{mili.port}"
    (workers,) = prometheus.wait_for("mili_worker_up == 1")
    assert workers["metric"]["model"] == SERVED_NAME
    prometheus.wait_for("vllm:kv_cache_usage_perc")  # the router aliases are scraped as they are
    generate(mili)
    time.sleep(2)  # two more scrapes, so rate() sees the increase
    generate(mili)
    # Recording rules evaluated over what was scraped.
    (tokens,) = prometheus.wait_for("model:mili_generation_tokens:rate5m > 0")
    assert tokens["metric"]["model"] == SERVED_NAME
    (kv,) = prometheus.wait_for("model:mili_kv_cache_usage:ratio")
    assert 0 <= float(kv["value"][1]) <= 1
    prometheus.wait_for('model:mili_time_to_first_token_seconds:quantile_rate5m{quantile="0.99"} > 0')
    # Every rule loaded and evaluated without error; no alert fires on a healthy server.
    groups = httpx2.get(f"{prometheus.url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    firing = [a for a in httpx2.get(f"{prometheus.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
              if a["state"] == "firing"]
    assert not firing, firing
    # Every dashboard query runs; those about traffic that happened have data.
    empty = [e for e in dashboard_exprs() if not prometheus.query(as_promql(e))]
    allowed_empty = ("preemptions", "queue_time")  # nothing was preempted; queue time needs a queue to form
    assert all(any(word in e for word in allowed_empty) for e in empty), json.dumps(empty, indent=1)
