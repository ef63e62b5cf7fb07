"""The Kubernetes objects that install the monitoring: a PrometheusRule from alerts.yaml, a ConfigMap holding
the dashboards for the Grafana sidecar (label ``grafana_dashboard: "1"``), and PodMonitors that scrape the
operator and the webhook under the job names the dashboards and alerts use.

alerts.yaml and dashboards/*.json are the one source; monitoring/manifests/ is rendered from them
(``python -m monitoring``) for clusters installed with kustomize, and a test keeps it current.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from monitoring.dashboards import fleet

HERE = Path(__file__).resolve().parent
NAMESPACE = "deviceshare-system"
LABELS = {"app.kubernetes.io/name": "deviceshare", "app.kubernetes.io/component": "monitoring",
          "app.kubernetes.io/part-of": "deviceshare"}  # fmt: skip
DASHBOARDS = {"deviceshare-fleet.json": fleet.render}
WEBHOOK_SERVICE = "deviceshare-webhook"


def metadata(name: str, **labels: str) -> dict[str, Any]:
    return {"name": name, "namespace": NAMESPACE, "labels": {**LABELS, **labels}}


def prometheus_rule() -> dict[str, Any]:
    rules = yaml.safe_load((HERE / "alerts.yaml").read_text())
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": metadata("deviceshare"),
            "spec": {"groups": rules["groups"]}}  # fmt: skip


def dashboards_config_map() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata("deviceshare-dashboards", grafana_dashboard="1"),
            "data": {name: render() for name, render in DASHBOARDS.items()}}  # fmt: skip


def pod_monitors() -> list[dict[str, Any]]:
    """Operator on its ``http`` port; webhook on ``https``, verified against the CA in its TLS Secret."""

    def monitor(component: str, port: str, **tls: Any) -> dict[str, Any]:
        relabel = [{"targetLabel": "job", "replacement": f"deviceshare-{component}"}]
        return {
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": metadata(f"deviceshare-{component}"),
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "deviceshare",
                                             "app.kubernetes.io/component": component}},
                "podMetricsEndpoints": [{"port": port, "path": "/metrics", "interval": "30s", **tls,
                                         "relabelings": relabel}],
            },
        }  # fmt: skip

    verified = {"ca": {"secret": {"name": "deviceshare-webhook-tls", "key": "ca.crt"}},
                "serverName": f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"}  # fmt: skip
    return [monitor("operator", "http"), monitor("webhook", "https", scheme="https", tlsConfig=verified)]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (a dashboard's JSON) as literal blocks, so the file diffs line by line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def dump(*objects: dict[str, Any], header: str) -> str:
    body = yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    return f"# {header}\n# Rendered by `python -m monitoring` from monitoring/; do not edit by hand.\n{body}"


def rendered() -> dict[Path, str]:
    """Every generated file, by path: the dashboards' JSON and the manifests."""
    out = {HERE / "dashboards" / "fleet.json": fleet.render()}
    manifests = HERE / "manifests"
    out[manifests / "prometheusrule.yaml"] = dump(prometheus_rule(), header="deviceshare alert rules (alerts.yaml)")
    out[manifests / "grafana-dashboards.yaml"] = dump(
        dashboards_config_map(), header='deviceshare dashboards for the Grafana sidecar (label grafana_dashboard: "1")'
    )
    out[manifests / "podmonitors.yaml"] = dump(*pod_monitors(), header="scrape the operator and the webhook")
    out[manifests / "kustomization.yaml"] = dump(
        {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
         "resources": ["prometheusrule.yaml", "grafana-dashboards.yaml", "podmonitors.yaml"]},
        header="kubectl apply -k monitoring/manifests (needs the Prometheus Operator's CRDs)",
    )  # fmt: skip
    return out
