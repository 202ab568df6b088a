"""Writes deploy/k8s/monitoring/prometheusrule.yaml from deploy/prometheus/rules/mili.rules.yml, so Kubernetes
and plain Prometheus load the same rules: python deploy/prometheus/sync_prometheusrule.py"""

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1]
RULES = DEPLOY / "prometheus" / "rules" / "mili.rules.yml"
TARGET = DEPLOY / "k8s" / "monitoring" / "prometheusrule.yaml"
HEADER = ("# Generated from deploy/prometheus/rules/mili.rules.yml by deploy/prometheus/sync_prometheusrule.py;\n"
          "# tests/deploy/test_static.py checks that the two carry the same groups.\n")


class _Indented(yaml.SafeDumper):
    def increase_indent(self, flow=False, indentless=False):  # lists indented under their key, as elsewhere
        return super().increase_indent(flow, False)


def _long_strings_folded(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=">" if len(text) > 90 else None)


_Indented.add_representer(str, _long_strings_folded)


def render() -> str:
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "mili", "labels": {"app.kubernetes.io/name": "mili"}},
           "spec": yaml.safe_load(RULES.read_text())}
    return HEADER + yaml.dump(doc, Dumper=_Indented, sort_keys=False, width=90)


if __name__ == "__main__":
    TARGET.write_text(render())
    print(TARGET)
