"""What the Helm charts render, for the real tier: the objects to apply on the real API server
and each service's command line, with only what a machine differs by substituted.

Rendered offline with helm-python-sdk (Helm's own SDK, as tests/ops/test_helm.py does), with
release `numafit` in namespace `numafit-system`. The scheduler chart is rendered with TLS and the
admission webhooks on (the API server calls webhooks over HTTPS only), its CA given as
`tls.caBundle`; the other charts with their defaults.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import helm_python
import yaml

HELM = Path(__file__).resolve().parents[2] / "helm"
RELEASE = "numafit"
NAMESPACE = "numafit-system"
SERVICE_CHARTS = ("svc-scheduler", "svc-accounting", "svc-refit")
APPLIED_KINDS = frozenset(
    {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
"""What the tier applies as rendered: identities and RBAC. Workloads are run as local processes
instead (no kubelet runs them), webhook configurations and the kube-scheduler configuration
with their addresses substituted."""
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")

Obj = dict[str, Any]


def render(chart: str, values: dict[str, Any]) -> list[Obj]:
    with helm_python.Chart.load(HELM / chart) as loaded:
        manifests = loaded.render(values, name=RELEASE, namespace=NAMESPACE)
    objects: list[Obj] = []
    for source, text in sorted(manifests.items()):
        if source.endswith("NOTES.txt"):
            continue
        objects.extend(d for d in yaml.safe_load_all(text) if d)
    return objects


def crds(chart: str) -> list[Obj]:
    """The chart's crds/ files (Helm installs them before anything else, never templated)."""
    found: list[Obj] = []
    for path in sorted((HELM / chart / "crds").glob("*.yaml")):
        found.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return found


class Rendered:
    """The three service charts, rendered once."""

    def __init__(self, ca_pem: bytes) -> None:
        ca_bundle = base64.b64encode(ca_pem).decode()
        self.values: dict[str, dict[str, Any]] = {
            "svc-scheduler": {
                "tls": {"enabled": True, "caBundle": ca_bundle},
                "webhooks": {"enabled": True},
            },
            "svc-accounting": {},
            "svc-refit": {},
        }
        self.objects = {chart: render(chart, v) for chart, v in self.values.items()}

    def all(self) -> list[Obj]:
        return [o for chart in SERVICE_CHARTS for o in self.objects[chart]]

    def of_kind(self, *kinds: str) -> list[Obj]:
        return [o for o in self.all() if o["kind"] in kinds]

    def identities_and_rbac(self) -> list[Obj]:
        # ServiceAccounts first: the bindings name them.
        ordered = sorted(self.of_kind(*APPLIED_KINDS), key=lambda o: o["kind"] != "ServiceAccount")
        return ordered

    def service_accounts(self) -> list[str]:
        return [o["metadata"]["name"] for o in self.of_kind("ServiceAccount")]

    def workload(self, chart: str, name: str | None = None) -> Obj:
        (found,) = [
            o
            for o in self.objects[chart]
            if o["kind"] == "Deployment" and (name is None or o["metadata"]["name"] == name)
        ]
        return found

    def service_args(self, chart: str) -> tuple[str, list[str]]:
        """(service account, the arguments after `numafit`: run <service> ...) of the chart's numafit Deployment."""
        deployment = next(
            o
            for o in self.objects[chart]
            if o["kind"] == "Deployment"
            and o["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["numafit", "run"]
        )
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        return spec["serviceAccountName"], [*container["command"][1:], *container.get("args", [])]

    def kube_scheduler(self) -> tuple[str, Obj]:
        """(service account, KubeSchedulerConfiguration) of the chart's kube-scheduler."""
        (configmap,) = [
            c for c in self.of_kind("ConfigMap") if "scheduler-config.yaml" in c.get("data", {})
        ]
        config: Obj = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
        deployment = next(
            d
            for d in self.of_kind("Deployment")
            if d["spec"]["template"]["spec"]["containers"][0]["command"][0] == "kube-scheduler"
        )
        return deployment["spec"]["template"]["spec"]["serviceAccountName"], config

    def webhooks(self, url: str) -> list[Obj]:
        """The webhook configurations with each `clientConfig.service` replaced by the
        extender's loopback URL (same path): nothing routes a Service to this machine."""
        found = copy.deepcopy(self.of_kind(*WEBHOOK_KINDS))
        for configuration in found:
            for hook in configuration["webhooks"]:
                client = hook["clientConfig"]
                service = client.pop("service")
                client["url"] = url.rstrip("/") + service["path"]
        return found


def scheduler_config(rendered: Obj, *, kubeconfig: Path, extender_url: str) -> Obj:
    """The chart's KubeSchedulerConfiguration with the two things a machine differs by: the
    kubeconfig it runs with (in a cluster: its ServiceAccount, in-cluster) and the extender's
    URL (in a cluster: the Service's DNS name)."""
    config = copy.deepcopy(rendered)
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    (extender,) = config["extenders"]
    extender["urlPrefix"] = extender_url
    return config
