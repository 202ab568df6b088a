"""SMG (the SGLang-lineage router, PyPI `smg`, pinned in the test extra) in front of two real MILI instances on
loopback, as deploy/README.md runs it for several hosts: `smg launch --backend vllm --worker-urls A B`.

- round_robin reaches both instances;
- power_of_two, which reads each instance's load from its /metrics (vllm:num_requests_running / waiting,
  vllm:gpu_cache_usage_perc), sends new requests away from an instance that long streams sent to it directly
  (so the router's own count of requests in flight cannot know) have saturated;
- with MILI_API_KEY on the instances and `--api-key` on SMG: SMG asks its clients for the key and sends it to
  the instances, which refuse none of its health checks, discovery and load polls;
- after one instance is killed, no later request is lost.

Which instance served a request is read from each instance's own counters (mili_http_responses_total).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import SERVED_NAME, env_configured_server
from tests.deploy.tools import tool
from tests.helpers.server import free_port

SHORT = {"model": SERVED_NAME, "prompt": "route me", "max_tokens": 2}
# Sixteen choices of 480 tokens each: seconds of work for an instance on any machine (one choice alone takes
# under a second on a quiet one).
LONG = {"model": SERVED_NAME, "prompt": "a long story", "max_tokens": 480, "ignore_eos": True, "stream": True,
        "n": 16}


class Smg:
    def __init__(self, log_path, workers: list[str], policy: str, api_key: str | None = None):
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "wb")
        cmd = [tool("smg", "pip install smg (test extra)"), "launch", "--host", "127.0.0.1", "--port", str(self.port),
               "--worker-urls", *workers, "--backend", "vllm", "--policy", policy, "--disable-tokenizer-autoload",
               "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--load-monitor-interval", "1",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               *(["--api-key", api_key] if api_key else [])]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"smg exited:\n{self.log_tail()}"
            try:
                r = httpx2.post(f"{self.url}/v1/completions", json=SHORT, headers=self.headers, timeout=30)
                if r.status_code == 200:
                    return
            except httpx2.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"smg does not route after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        self.proc.kill()  # a graceful stop waits seconds for idle connections; nothing is left to lose here
        self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def instances(mili, deploy_model_dir, tmp_path_factory):
    """[an instance of this module's own, the shared one]: the last test kills the first."""
    own = env_configured_server(deploy_model_dir, tmp_path_factory.mktemp("smg-logs") / "mili-own.log").start(180)
    yield [own, mili]
    own.stop()


@pytest.fixture
def smg(instances, tmp_path):
    routers = []

    def start(policy: str, workers=None, api_key: str | None = None) -> Smg:
        router = Smg(tmp_path / f"smg-{policy}.log", [s.url for s in (workers or instances)], policy, api_key)
        routers.append(router)
        router.wait_ready()
        return router

    start.tmp_path = tmp_path
    yield start
    for router in routers:
        router.stop()


def served(server) -> float:
    return server.metric("mili_http_responses_total", status="2xx")


def test_round_robin_reaches_both_instances(instances, smg):
    router = smg("round_robin")
    before = [served(s) for s in instances]
    for _ in range(6):
        r = httpx2.post(f"{router.url}/v1/completions", json=SHORT, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    got = [served(s) - b for s, b in zip(instances, before)]
    assert got == [3, 3], got


def test_load_aware_policy_avoids_a_saturated_instance(instances, smg):
    busy, idle = instances
    # The same router without the load it reads would split these requests evenly (round robin above).
    router = smg("power_of_two")
    stop = threading.Event()

    def hold_stream():  # straight to `busy`, past the router
        with httpx2.stream("POST", f"{busy.url}/v1/completions", json=LONG, timeout=120) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    streams = [threading.Thread(target=hold_stream, daemon=True) for _ in range(8)]  # 4 run, 4 wait
    for t in streams:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while busy.metric("vllm:num_requests_waiting") < 4:
            assert time.monotonic() < deadline, "the long streams never filled the busy instance"
            time.sleep(0.2)
        time.sleep(2.5)  # two load polls of the router (--load-monitor-interval 1)
        before = served(idle)
        for _ in range(8):
            r = httpx2.post(f"{router.url}/v1/completions", json=SHORT, timeout=60)
            assert r.status_code == 200
        assert served(idle) - before == 8, f"some requests went to the saturated instance:\n{router.log_tail()}"
    finally:
        stop.set()
        for t in streams:
            t.join(30)


KEY = "sk-router-and-instances"


@pytest.fixture(scope="module")
def keyed_instances(deploy_model_dir, tmp_path_factory):
    """Two instances that require KEY (MILI_API_KEY, as the Kubernetes component sets it)."""
    logs = tmp_path_factory.mktemp("smg-key-logs")
    servers = [env_configured_server(deploy_model_dir, logs / f"mili-key-{i}.log") for i in range(2)]
    started = []
    try:
        for server in servers:
            server.env["MILI_API_KEY"] = KEY
            started.append(server.start(180))
        yield servers
    finally:
        for server in started:
            server.stop()


def refused(server) -> dict[str, float]:
    """The instance's 401s by route (health checks, discovery and load polls are not API answers, so only this
    counter sees them)."""
    text = httpx2.get(f"{server.url}/metrics", headers=server.auth_headers(), timeout=5).text
    return {f"{s.labels['route']}": s.value for f in text_string_to_metric_families(text)
            if f.name == "mili_http_unauthorized" for s in f.samples}


def test_api_key_between_router_and_instances(keyed_instances, smg):
    busy, idle = keyed_instances
    # Contrast first: SMG without the key is refused by the instances (its discovery and /version calls
    # are counted), so the zero below means the key was sent, not that nothing was asked.
    before = [refused(s) for s in keyed_instances]
    keyless = Smg(smg.tmp_path / "smg-keyless.log", [s.url for s in keyed_instances], "power_of_two")
    try:
        deadline = time.monotonic() + 30
        while not all(sum(refused(s).values()) > sum(b.values()) for s, b in zip(keyed_instances, before)):
            assert time.monotonic() < deadline, f"SMG without the key was never refused:\n{keyless.log_tail()}"
            time.sleep(0.5)
    finally:
        keyless.stop()

    router = smg("power_of_two", keyed_instances, api_key=KEY)
    before = [refused(s) for s in keyed_instances]
    assert httpx2.post(f"{router.url}/v1/completions", json=SHORT, timeout=60).status_code == 401
    wrong = {"Authorization": "Bearer not-the-key"}
    assert httpx2.post(f"{router.url}/v1/completions", json=SHORT, headers=wrong, timeout=60).status_code == 401
    for _ in range(4):
        r = httpx2.post(f"{router.url}/v1/completions", json=SHORT, headers=router.headers, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None
    # SMG reads the load from /metrics with the key: a stream sent straight to `busy` (16 choices: 4 run,
    # 12 wait) shows in SMG's view of that instance.
    stop = threading.Event()

    def hold_stream():
        with httpx2.stream("POST", f"{busy.url}/v1/completions", json=LONG, headers=busy.auth_headers(),
                           timeout=120) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    stream = threading.Thread(target=hold_stream, daemon=True)
    stream.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            workers = httpx2.get(f"{router.url}/workers", headers=router.headers, timeout=5).json()["workers"]
            loads = {w["url"]: w.get("engine_load", {}).get("loads", [{}])[0] for w in workers}
            # The choices start once the first has prefilled the prompt (1 running, 15 waiting, for a moment).
            busy_load = loads.get(busy.url, {})
            if busy_load.get("num_waiting_reqs", 0) > 0 and busy_load.get("num_running_reqs") == 4:
                break
            assert time.monotonic() < deadline, f"SMG never read the busy instance's load: {loads}"
            time.sleep(0.5)
        assert loads[idle.url]["num_waiting_reqs"] == 0
    finally:
        stop.set()
        stream.join(30)
    time.sleep(2)  # two more health checks and load polls (1 s intervals)
    assert [refused(s) for s in keyed_instances] == before, "an instance refused some of SMG's calls"


def test_no_request_lost_after_an_instance_dies(instances, smg):
    # Last in this module: it kills the module's own instance.
    doomed, survivor = instances
    router = smg("round_robin")
    os.kill(doomed.proc.pid, signal.SIGKILL)  # the gateway; its workers exit with it
    doomed.proc.wait(10)
    before = served(survivor)
    statuses = [httpx2.post(f"{router.url}/v1/completions", json=SHORT, timeout=60).status_code for _ in range(10)]
    assert statuses == [200] * 10, f"{statuses}\n{router.log_tail()}"
    assert served(survivor) - before == 10
