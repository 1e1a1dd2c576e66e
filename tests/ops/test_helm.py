"""The Helm charts (helm/): lint, values schemas, rendering and Kubernetes validation, offline.

No helm binary and no cluster: helm-python-sdk embeds Helm's SDK (lint, render, schema checks)
and kubernetes-validate ships the Kubernetes API's JSON schemas. The umbrella chart's
`file://../svc-*` dependencies are resolved with the SDK's `helm dependency update` in a
temporary copy of helm/, so nothing is packaged into the working tree.

Every chart is rendered with its defaults and with ci/full-values.yaml (every optional feature
on); the scheduler also with the other TLS/CA combinations.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from shared.tools.cli import RUN_TARGETS

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterator

HELM = Path(__file__).resolve().parents[2] / "helm"
SERVICE_CHARTS = ("svc-scheduler", "svc-refit", "svc-accounting", "svc-deviceplugin")
CHARTS = (*SERVICE_CHARTS, "numafit")
RELEASE = "numafit"
NAMESPACE = "numafit-system"
KUBERNETES = kubernetes_validate.latest_version()
# Custom resources (prometheus-operator, cert-manager): no schema shipped, checked by shape.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
}
DEFAULT_NATS_URL = "nats://nats.nats.svc:4222"
GPU_RESOURCES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
]
CA_BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="

# Scheduler TLS set-ups beyond the defaults (plain HTTP) and full (cert-manager, self-signed CA).
SCHEDULER_VARIANTS: dict[str, dict[str, Any]] = {
    "existing-secret": {
        "tls": {"enabled": True, "secretName": "my-tls", "caBundle": CA_BUNDLE},
        "webhooks": {"enabled": True},
    },
    "cluster-issuer": {
        "tls": {"enabled": True},
        "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}},
        "webhooks": {"enabled": True},
    },
    "insecure-extender": {
        "tls": {"enabled": True, "secretName": "my-tls"},
        "kubeScheduler": {"extender": {"insecureSkipVerify": True}},
    },
    "no-kube-scheduler": {"kubeScheduler": {"enabled": False}, "rbac": {"create": False}},
}
CASES = [(chart, variant) for chart in CHARTS for variant in ("default", "full")]
CASES += [("svc-scheduler", variant) for variant in SCHEDULER_VARIANTS]
CASE_IDS = [f"{chart}:{variant}" for chart, variant in CASES]

Obj = dict[str, Any]


def service_parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from svc_accounting.__main__ import build_parser as accounting
    from svc_deviceplugin.__main__ import build_parser as deviceplugin
    from svc_refit.__main__ import build_parser as refit
    from svc_scheduler.__main__ import build_parser as scheduler

    return {
        "accounting": accounting,
        "refit": refit,
        "scheduler": scheduler,
        "deviceplugin": deviceplugin,
    }


class Charts:
    """A temporary copy of helm/ with the umbrella's dependencies built; renders cached."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._rendered: dict[tuple[str, str], list[Obj]] = {}

    def path(self, chart: str) -> Path:
        return self.root / chart

    def values(self, chart: str, variant: str) -> dict[str, Any]:
        if variant == "default":
            return {}
        if variant == "full":
            loaded: dict[str, Any] = yaml.safe_load(
                (HELM / chart / "ci" / "full-values.yaml").read_text()
            )
            return loaded
        assert chart == "svc-scheduler"
        return SCHEDULER_VARIANTS[variant]

    def merged(self, chart: str, variant: str) -> dict[str, Any]:
        with helm_python.Chart.load(self.path(chart)) as loaded:
            return loaded.merge_values(self.values(chart, variant))

    def render(self, chart: str, values: dict[str, Any]) -> list[Obj]:
        with helm_python.Chart.load(self.path(chart)) as loaded:
            manifests = loaded.render(values, name=RELEASE, namespace=NAMESPACE)
        objects: list[Obj] = []
        for source, text in sorted(manifests.items()):
            if source.endswith("NOTES.txt"):
                continue
            for document in yaml.safe_load_all(text):
                if document is not None:
                    document.setdefault("metadata", {})
                    objects.append(document)
        return objects

    def objects(self, chart: str, variant: str) -> list[Obj]:
        key = (chart, variant)
        if key not in self._rendered:
            self._rendered[key] = self.render(chart, self.values(chart, variant))
        return self._rendered[key]


@pytest.fixture(scope="module")
def charts(tmp_path_factory: pytest.TempPathFactory) -> Charts:
    root = tmp_path_factory.mktemp("charts") / "helm"
    shutil.copytree(HELM, root, ignore=shutil.ignore_patterns("charts", "Chart.lock", "*.tgz"))
    helm_python.dependency_update(root / "numafit", skip_refresh=True)
    return Charts(root)


# ---------------------------------------------------------------------------------------------
# helpers over rendered objects


def of_kind(objects: list[Obj], *kinds: str) -> list[Obj]:
    return [obj for obj in objects if obj.get("kind") in kinds]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_specs(objects: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for workload in of_kind(objects, *WORKLOAD_KINDS):
        yield workload, workload["spec"]["template"]["spec"]


def containers(objects: list[Obj]) -> Iterator[tuple[Obj, Obj, Obj]]:
    """(workload, pod spec, container) for every container and init container."""
    for workload, spec in pod_specs(objects):
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            yield workload, spec, container


def is_kube_scheduler(container: Obj) -> bool:
    return "kube-scheduler" in container["image"].split("/")[-1]


def numafit_containers(objects: list[Obj]) -> list[tuple[Obj, Obj, Obj]]:
    return [entry for entry in containers(objects) if not is_kube_scheduler(entry[2])]


def command_line(container: Obj) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def target_of(container: Obj) -> str:
    return command_line(container)[2]


def env_of(container: Obj) -> dict[str, Obj]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def flag(container: Obj, name: str) -> str | None:
    for arg in command_line(container):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def port_number(container: Obj, port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"container {container['name']} has no port named {port}"
    return int(named[port])


def rules_of(role: Obj) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role/ClusterRole grants."""
    return {
        (group, resource, verb)
        for rule in role.get("rules", [])
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def chart_of(target: str) -> str:
    return f"svc-{target}"


# ---------------------------------------------------------------------------------------------
# every chart, every value set


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_lint_strict(charts: Charts, chart: str, variant: str) -> None:
    report = helm_python.lint(charts.path(chart), charts.values(chart, variant), strict=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_values_schema_accepts(charts: Charts, chart: str, variant: str) -> None:
    with helm_python.Chart.load(charts.path(chart)) as loaded:
        assert loaded.schema is not None
        assert loaded.schema["$schema"] == "http://json-schema.org/draft-07/schema#"
        loaded.validate_schema(loaded.merge_values(charts.values(chart, variant)))


@pytest.mark.parametrize(
    ("chart", "values"),
    [
        *[(chart, {"imagee": {"tag": "x"}}) for chart in SERVICE_CHARTS],
        *[(chart, {"image": {"repositry": "x"}}) for chart in SERVICE_CHARTS],
        *[(chart, {"metrics": {"port": "9100"}}) for chart in SERVICE_CHARTS],
        *[(chart, {"nats": {"auth": {"existingSecet": "x"}}}) for chart in SERVICE_CHARTS],
        *[(chart, {"probes": {"liveness": {"periodSecond": 3}}}) for chart in SERVICE_CHARTS],
        ("svc-scheduler", {"webhooks": {"enable": True}}),
        ("svc-scheduler", {"kubeScheduler": {"extender": {"timeout": "5s"}}}),
        ("svc-scheduler", {"nodeSchedulerPolicy": "fill"}),
        ("svc-accounting", {"replicaCount": "2"}),
        ("svc-accounting", {"partitions": -1}),
        ("svc-accounting", {"leaseTtl": 0}),
        ("svc-accounting", {"leaseBucket": "numafit.accounting"}),
        ("svc-accounting", {"podDisruptionBudget": {"minAvaliable": 1}}),
        ("svc-accounting", {"podDisruptionBudget": {"minAvailable": "half"}}),
        ("svc-accounting", {"podAntiAffinity": "soft"}),
        ("svc-accounting", {"strategy": {"type": "BlueGreen"}}),
        ("svc-accounting", {"nats": {"inboxPrefix": "_INBOX.>"}}),
        ("svc-deviceplugin", {"operatingMode": "timeslice"}),
        ("svc-deviceplugin", {"simulatedGpus": [{"uuid": "GPU-a", "model": "m", "memory": 1}]}),
        ("svc-deviceplugin", {"metrics": {"serviceMonitor": {"enabled": True}}}),
        ("numafit", {"monitoring": {"dashbord": {"enabled": True}}}),
        ("numafit", {"global": {"nats": {"ulr": "nats://x:4222"}}}),
        ("numafit", {"svc-refit": {"replicaCont": 2}}),
        ("numafit", {"svc-deviceplugin": {"enabled": "yes"}}),
    ],
    ids=lambda value: value if isinstance(value, str) else json.dumps(value)[:60],
)
def test_values_schema_refuses(charts: Charts, chart: str, values: dict[str, Any]) -> None:
    with helm_python.Chart.load(charts.path(chart)) as loaded:
        with pytest.raises(helm_python.HelmValuesError):
            loaded.validate_schema(loaded.merge_values(values))
        with pytest.raises(helm_python.HelmValuesError):
            loaded.render(values, name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_objects_are_valid_kubernetes(charts: Charts, chart: str, variant: str) -> None:
    objects = charts.objects(chart, variant)
    assert objects
    seen: set[tuple[str, str, str]] = set()
    invalid: list[str] = []
    for obj in objects:
        kind, name = obj.get("kind"), obj["metadata"].get("name")
        where = f"{kind} {name}"
        key = (str(kind), str(obj["metadata"].get("namespace")), str(name))
        assert key not in seen, f"duplicate {where}"
        seen.add(key)
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "numafit", where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        if kind in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"].get("namespace"), f"{where} has no namespace"
        if kind in CRD_KINDS:
            assert obj["apiVersion"].split("/")[0] in {"monitoring.coreos.com", "cert-manager.io"}
            assert name and isinstance(obj.get("spec"), dict) and obj["spec"], where
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(part) for part in exc.absolute_path)
            invalid.append(f"{where}: {path}: {exc.message}")
    assert not invalid, f"invalid for Kubernetes {KUBERNETES}:\n" + "\n".join(invalid)


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_workloads_select_their_pods(charts: Charts, chart: str, variant: str) -> None:
    workloads = of_kind(charts.objects(chart, variant), *WORKLOAD_KINDS)
    assert workloads
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]
        others = [w for w in workloads if w is not workload]
        for other in others:
            other_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= other_labels.items(), "overlapping selectors"


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_containers_run_numafit_targets(charts: Charts, chart: str, variant: str) -> None:
    parsers = service_parsers()
    found = set()
    for _, _, container in containers(charts.objects(chart, variant)):
        line = command_line(container)
        if is_kube_scheduler(container):
            assert line[0] == "kube-scheduler", line
            continue
        assert line[:2] == ["numafit", "run"], line
        target = line[2]
        assert target in RUN_TARGETS, f"{target} is not a `numafit run` target"
        found.add(target)
        # Every flag the chart passes exists and parses as the service reads it.
        parsers[target]().parse_args(line[3:])
    if chart == "numafit":
        assert found == {"scheduler", "refit", "accounting", "deviceplugin"}
    else:
        assert found == {chart.removeprefix("svc-")}


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_probes_on_the_metrics_port(charts: Charts, chart: str, variant: str) -> None:
    merged = charts.merged(chart, variant)
    for workload, spec, container in numafit_containers(charts.objects(chart, variant)):
        target = target_of(container)
        values = merged if chart != "numafit" else merged[chart_of(target)]
        port = int(values["metrics"]["port"])
        assert flag(container, "metrics-port") == str(port)
        assert port_number(container, "metrics") == port
        probes = {
            "livenessProbe": "/healthz",
            "readinessProbe": "/readyz",
            "startupProbe": "/healthz",
        }
        for probe, path in probes.items():
            if probe == "startupProbe" and probe not in container:
                continue
            get = container[probe]["httpGet"]
            assert get["path"] == path, (probe, get)
            assert port_number(container, get["port"]) == port, (probe, get)
        grace = float(flag(container, "grace-seconds") or 0)
        assert spec["terminationGracePeriodSeconds"] > grace, workload["metadata"]["name"]


@pytest.mark.parametrize(("chart", "variant"), CASES, ids=CASE_IDS)
def test_rbac_subjects_are_the_workloads_accounts(charts: Charts, chart: str, variant: str) -> None:
    objects = charts.objects(chart, variant)
    accounts = {spec.get("serviceAccountName") for _, spec in pod_specs(objects)}
    created = {sa["metadata"]["name"] for sa in of_kind(objects, "ServiceAccount")}
    for binding in of_kind(objects, "RoleBinding", "ClusterRoleBinding"):
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == NAMESPACE
            assert subject["name"] in accounts & created, binding["metadata"]["name"]


# ---------------------------------------------------------------------------------------------
# per service


@pytest.mark.parametrize("variant", ["default", "full"])
def test_deviceplugin_daemonset(charts: Charts, variant: str) -> None:
    objects = charts.objects("svc-deviceplugin", variant)
    assert not of_kind(objects, *RBAC_KINDS), "the device plugin must have no Kubernetes role"
    daemonset = one(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    account = one(objects, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["priorityClassName"] == "system-node-critical"

    (container,) = spec["containers"]
    kubelet_dir = "/var/lib/kubelet/device-plugins"
    host_volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    (name,) = [n for n, host in host_volumes.items() if host["path"] == kubelet_dir]
    assert host_volumes[name]["type"] == "Directory"
    assert mounts[name]["mountPath"] == kubelet_dir and "subPath" not in mounts[name]
    assert flag(container, "device-plugin-dir") == kubelet_dir
    # From the host: kubelet's device-plugin directory, and the plugin's own state directory
    # (the consume journal must outlive the pod), nothing else.
    state = flag(container, "state-dir")
    (journal,) = [n for n, host in host_volumes.items() if host["path"] == state]
    assert host_volumes[journal]["type"] == "DirectoryOrCreate"
    assert mounts[journal]["mountPath"] == state
    assert set(host_volumes) == {name, journal}, "only the plugin's two directories from the host"

    node_name = env_of(container)["NUMAFIT_NODE"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}

    security = container["securityContext"]
    if variant == "default":
        assert security["runAsUser"] == 0
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert "privileged" not in security
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert not of_kind(objects, "PodMonitor", "ConfigMap")
    else:
        assert security == {"privileged": True}
        assert spec["runtimeClassName"] == "nvidia"
        assert "--no-refit" in command_line(container)
        assert flag(container, "operating-mode") == "mig"
        assert flag(container, "replicas") == "4"
        assert flag(container, "refit-timeout-ms") == "1500"
        monitor = one(objects, "PodMonitor")
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= (
            daemonset["spec"]["template"]["metadata"]["labels"].items()
        )
        topology = one(objects, "ConfigMap")
        gpus = json.loads(topology["data"]["topology.json"])["gpus"]
        assert [gpu["uuid"] for gpu in gpus] == ["GPU-a", "GPU-b"]
        assert flag(container, "topology") == "/etc/numafit/topology/topology.json"
        from svc_deviceplugin.discovery.simulated import SimulatedBackend

        simulated = SimulatedBackend.from_text(topology["data"]["topology.json"], fmt="json")
        assert len(simulated.list_gpus()) == 2


@pytest.mark.parametrize("variant", ["default", "full"])
def test_accounting_replicas_roll_and_keep_one_available(charts: Charts, variant: str) -> None:
    objects = charts.objects("svc-accounting", variant)
    values = charts.merged("svc-accounting", variant)
    deployment = one(objects, "Deployment")
    replicas = deployment["spec"]["replicas"]
    assert replicas == (2 if variant == "default" else 3) == values["replicaCount"]
    # A new replica is ready (and has taken its share) before an old one goes.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    budget = one(objects, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["minAvailable"] == (1 if variant == "default" else 2) < replicas
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()

    pod = deployment["spec"]["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]
    if variant == "default":
        (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        term = preferred["podAffinityTerm"]
        assert preferred["weight"] == 100
    else:
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        # The values' own affinity is kept beside it.
        assert pod["affinity"]["nodeAffinity"] == values["affinity"]["nodeAffinity"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    (container,) = pod["containers"]
    assert flag(container, "partitions") == str(values["partitions"])
    assert flag(container, "lease-ttl") == str(values["leaseTtl"])
    assert flag(container, "lease-bucket") == values["leaseBucket"]
    assert flag(container, "nats-inbox-prefix") == values["nats"]["inboxPrefix"]
    assert (flag(container, "partitions"), flag(container, "lease-bucket")) == (
        ("16", "numafit-accounting") if variant == "default" else ("32", "numafit-accounting-prod")
    )
    # Each replica is named in the lease bucket by its pod name (the downward API).
    env = env_of(container)
    names = list(env)
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["NUMAFIT_REPLICA_ID"]["value"] == "$(POD_NAME)"
    assert names.index("POD_NAME") < names.index("NUMAFIT_REPLICA_ID")
    from svc_accounting.__main__ import build_parser

    parsed = build_parser().parse_args(command_line(container)[3:])
    assert (parsed.partitions, parsed.lease_ttl) == (values["partitions"], values["leaseTtl"])
    assert parsed.lease_bucket == values["leaseBucket"]


@pytest.mark.parametrize(
    ("values", "replicas", "strategy", "budget", "anti_affinity"),
    [
        # One replica owning every node, without leases: never two at once, and no budget
        # (with one replica it would block every drain).
        ({"partitions": 0, "replicaCount": 1}, 1, "Recreate", False, False),
        ({"replicaCount": 1}, 1, "RollingUpdate", False, True),
        ({"podDisruptionBudget": {"enabled": False}}, 2, "RollingUpdate", False, True),
        ({"podAntiAffinity": "none"}, 2, "RollingUpdate", True, False),
        (
            {
                "affinity": {
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}
                }
            },
            2,
            "RollingUpdate",
            True,
            False,
        ),
        (
            {"replicaCount": 4, "podDisruptionBudget": {"minAvailable": "50%"}},
            4,
            "RollingUpdate",
            True,
            True,
        ),
    ],
)
def test_accounting_replica_variants(
    charts: Charts,
    values: dict[str, Any],
    replicas: int,
    strategy: str,
    budget: bool,
    anti_affinity: bool,
) -> None:
    objects = charts.render("svc-accounting", values)
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    assert deployment["spec"]["strategy"]["type"] == strategy
    assert bool(of_kind(objects, "PodDisruptionBudget")) is budget
    affinity = deployment["spec"]["template"]["spec"].get("affinity", {})
    generated = affinity.get("podAntiAffinity", {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    )
    assert bool(generated) is anti_affinity
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"partitions": 0}, "needs replicaCount: 1"),
        ({"replicaCount": 2, "podDisruptionBudget": {"minAvailable": 2}}, "minAvailable"),
        ({"graceSeconds": 30, "terminationGracePeriodSeconds": 30}, "terminationGracePeriod"),
    ],
)
def test_accounting_refuses_unworkable_values(
    charts: Charts, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        charts.render("svc-accounting", values)


@pytest.mark.parametrize("variant", ["default", "full"])
def test_accounting_rbac(charts: Charts, variant: str) -> None:
    """The leases live in NATS (JetStream KV), not in Kubernetes: no Lease objects, no new
    grants; the lease permissions are NATS permissions (deploy/nats/nats-server.conf)."""
    objects = charts.objects("svc-accounting", variant)
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert flag(container, "write-timeout") is not None
    assert flag(container, "quota-resync-seconds") is not None
    grants = rules_of(one(objects, "ClusterRole"))
    for resource in ("pods", "nodes"):
        assert {("", resource, verb) for verb in ("get", "list", "watch", "patch")} <= grants
    assert {("", "resourcequotas", verb) for verb in ("get", "list", "watch")} <= grants
    assert {("", "events", "create"), ("", "events", "patch")} <= grants
    assert not [g for g in grants if g[2] in {"delete", "deletecollection", "*"}]
    assert not [g for g in grants if g[1] == "leases"]


@pytest.mark.parametrize("variant", ["default", "full"])
def test_refit_may_only_record_events(charts: Charts, variant: str) -> None:
    objects = charts.objects("svc-refit", variant)
    (role,) = of_kind(objects, "Role", "ClusterRole")
    assert rules_of(role) == {("", "events", "create"), ("", "events", "patch")}
    assert not any(("", "pods", "patch") in rules_of(r) for r in of_kind(objects, "Role"))
    replicas = one(objects, "Deployment")["spec"]["replicas"]
    assert replicas == (2 if variant == "default" else 3)  # two by default: one may go


def kube_scheduler_config(objects: list[Obj]) -> dict[str, Any]:
    (configmap,) = [
        c for c in of_kind(objects, "ConfigMap") if "scheduler-config.yaml" in c["data"]
    ]
    config: dict[str, Any] = yaml.safe_load(configmap["data"]["scheduler-config.yaml"])
    return config


@pytest.mark.parametrize("variant", ["default", "full", *SCHEDULER_VARIANTS])
def test_scheduler_extender_wiring(charts: Charts, variant: str) -> None:
    objects = charts.objects("svc-scheduler", variant)
    values = charts.merged("svc-scheduler", variant)
    (extender,) = [
        d
        for d in of_kind(objects, "Deployment")
        if not is_kube_scheduler(d["spec"]["template"]["spec"]["containers"][0])
    ]
    (container,) = extender["spec"]["template"]["spec"]["containers"]
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= (
        extender["spec"]["template"]["metadata"]["labels"].items()
    )
    listener = next(p for p in service["spec"]["ports"] if p["targetPort"] == "extender")
    assert port_number(container, "extender") == values["listenPort"]
    assert flag(container, "listen-port") == str(values["listenPort"])
    tls = values["tls"]["enabled"]
    assert (flag(container, "tls-cert-file") is not None) is tls
    if tls:
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        assert str(Path(flag(container, "tls-cert-file") or "").parent) in mounted
    if values["rbac"]["create"]:
        extender_role = rules_of(one(objects, "ClusterRole"))
        expected = {("", "pods", v) for v in ("get", "list", "watch")}
        # No pod write of any kind: the Binding is accounting's (it carries the reservation).
        expected |= {("", "events", "create")}
        expected |= {("", "events", "patch"), ("", "resourcequotas", "get")}
        expected |= {("", "resourcequotas", "list")}
        # Nodes: each kubelet's version (what kubelet itself would reject).
        expected |= {("", "nodes", v) for v in ("get", "list", "watch")}
        # NodeResourceTopology: the NUMA figures the filter predicts kubelet's choice from.
        topology = ("topology.node.k8s.io", "noderesourcetopologies")
        expected |= {(*topology, v) for v in ("get", "list", "watch")}
        assert extender_role == expected
    else:
        assert not of_kind(objects, *RBAC_KINDS)

    if not values["kubeScheduler"]["enabled"]:
        assert not [c for _, _, c in containers(objects) if is_kube_scheduler(c)]
        return
    config = kube_scheduler_config(objects)
    sample = yaml.safe_load(
        (HELM.parent / "svc_scheduler/deploy/scheduler-config.yaml").read_text()
    )
    assert config["apiVersion"] == sample["apiVersion"]
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["profiles"] == [{"schedulerName": flag(container, "scheduler-name")}]
    (stanza,) = config["extenders"]
    (sample_stanza,) = sample["extenders"]
    for key in ("filterVerb", "prioritizeVerb", "bindVerb", "managedResources"):
        assert stanza[key] == sample_stanza[key], key
    assert [r["name"] for r in stanza["managedResources"]] == GPU_RESOURCES
    scheme = "https" if tls else "http"
    name = service["metadata"]["name"]
    port = listener["port"]
    assert stanza["urlPrefix"] == f"{scheme}://{name}.{NAMESPACE}.svc:{port}"
    assert stanza["enableHTTPS"] is tls
    http_timeout = stanza["httpTimeout"]
    assert http_timeout.endswith(("s", "ms"))
    seconds = (
        float(http_timeout[:-2]) / 1000 if http_timeout.endswith("ms") else float(http_timeout[:-1])
    )
    assert seconds > float(flag(container, "request-timeout") or 0)

    (kube_scheduler,) = [d for d in of_kind(objects, "Deployment") if d is not extender]
    pod = kube_scheduler["spec"]["template"]["spec"]
    (ks,) = pod["containers"]
    config_arg = next(a for a in ks["command"] if a.startswith("--config="))
    config_path = Path(config_arg.split("=", 1)[1])
    mounts = {m["mountPath"]: m["name"] for m in ks["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_volume = volumes[mounts[str(config_path.parent)]]
    assert config_path.name == "scheduler-config.yaml" and "configMap" in config_volume
    if tls:
        tls_config = stanza["tlsConfig"]
        if values["kubeScheduler"]["extender"]["insecureSkipVerify"]:
            assert tls_config == {"insecure": True}
        elif values["tls"]["caBundle"]:
            assert tls_config == {"caData": values["tls"]["caBundle"]}
        else:
            ca_path = Path(tls_config["caFile"])
            ca_volume = volumes[mounts[str(ca_path.parent)]]
            # kube-scheduler gets the CA certificate only, never the extender's private key.
            assert ca_volume["secret"]["items"] == [{"key": "ca.crt", "path": ca_path.name}]
    # kube-scheduler's own account: the standard roles, its lease, the auth reader.
    account = pod["serviceAccountName"]
    assert account != extender["spec"]["template"]["spec"]["serviceAccountName"]
    if values["rbac"]["create"]:
        bound = {
            (b["roleRef"]["kind"], b["roleRef"]["name"])
            for b in of_kind(objects, "RoleBinding", "ClusterRoleBinding")
            if b["subjects"][0]["name"] == account
        }
        assert ("ClusterRole", "system:kube-scheduler") in bound
        assert ("ClusterRole", "system:volume-scheduler") in bound
        assert ("Role", "extension-apiserver-authentication-reader") in bound
        lease_role = one(objects, "Role")
        assert ("coordination.k8s.io", "leases", "update") in rules_of(lease_role)
        assert config["leaderElection"]["resourceName"] in lease_role["rules"][1]["resourceNames"]
        assert config["leaderElection"]["resourceNamespace"] == NAMESPACE


@pytest.mark.parametrize("variant", ["default", "full", *SCHEDULER_VARIANTS])
def test_scheduler_webhooks_and_certificates(charts: Charts, variant: str) -> None:
    objects = charts.objects("svc-scheduler", variant)
    values = charts.merged("svc-scheduler", variant)
    service = one(objects, "Service")
    service_name = service["metadata"]["name"]
    webhooks = of_kind(objects, "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    if not values["webhooks"]["enabled"]:
        assert not webhooks
    else:
        paths = {}
        for configuration in webhooks:
            (hook,) = configuration["webhooks"]
            client = hook["clientConfig"]
            paths[configuration["kind"]] = client["service"]["path"]
            assert client["service"]["name"] == service_name
            assert client["service"]["namespace"] == NAMESPACE
            assert client["service"]["port"] == service["spec"]["ports"][0]["port"]
            assert hook["rules"][0]["resources"] == ["pods"]
            assert hook["rules"][0]["operations"] == ["CREATE"]
            excluded = hook["namespaceSelector"]["matchExpressions"][0]["values"]
            assert NAMESPACE in excluded and "kube-system" in excluded
            annotations = configuration["metadata"].get("annotations", {})
            if values["certManager"]["enabled"]:
                injected = annotations["cert-manager.io/inject-ca-from"]
                assert injected == f"{NAMESPACE}/{service_name}"
                assert "caBundle" not in client
            else:
                assert client["caBundle"] == values["tls"]["caBundle"]
        assert paths == {
            "MutatingWebhookConfiguration": "/webhook",
            "ValidatingWebhookConfiguration": "/validate",
        }
    certificates = of_kind(objects, "Certificate")
    if not values["certManager"]["enabled"]:
        assert not certificates and not of_kind(objects, "Issuer")
        return
    serving = one(objects, "Certificate", service_name)
    assert f"{service_name}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    volumes = [
        v for _, spec in pod_specs(objects) for v in spec.get("volumes", []) if "secret" in v
    ]
    assert volumes and all(
        v["secret"]["secretName"] == serving["spec"]["secretName"] for v in volumes
    )
    issuer = values["certManager"]["issuerRef"]
    if issuer["name"]:
        assert serving["spec"]["issuerRef"]["name"] == issuer["name"]
        assert not of_kind(objects, "Issuer")
    else:
        issuers = {i["metadata"]["name"]: i["spec"] for i in of_kind(objects, "Issuer")}
        assert issuers[serving["spec"]["issuerRef"]["name"]] == {
            "ca": {
                "secretName": one(objects, "Certificate", f"{service_name}-ca")["spec"][
                    "secretName"
                ]
            }
        }


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhooks": {"enabled": True}}, "needs tls.enabled"),
        ({"webhooks": {"enabled": True}, "tls": {"enabled": True}}, "tls.caBundle or certManager"),
        ({"certManager": {"enabled": True}}, "certManager.enabled needs tls.enabled"),
        ({"kubeScheduler": {"replicaCount": 2, "leaderElect": False}}, "leaderElect"),
        (
            {"graceSeconds": 30, "terminationGracePeriodSeconds": 30},
            "terminationGracePeriodSeconds",
        ),
    ],
)
def test_scheduler_refuses_unworkable_values(
    charts: Charts, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        charts.render("svc-scheduler", values)


@pytest.mark.parametrize("chart", ["svc-refit", "svc-accounting", "svc-scheduler"])
def test_service_monitors_scrape_the_metrics_service(charts: Charts, chart: str) -> None:
    assert not of_kind(charts.objects(chart, "default"), "ServiceMonitor", "PodMonitor")
    objects = charts.objects(chart, "full")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    selected = [
        s
        for s in of_kind(objects, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert len(selected) == 1
    assert "metrics" in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


# ---------------------------------------------------------------------------------------------
# NATS settings


@pytest.mark.parametrize("chart", SERVICE_CHARTS)
def test_nats_url_standalone_and_global(charts: Charts, chart: str) -> None:
    def urls(values: dict[str, Any]) -> set[str]:
        return {
            env_of(c)["NUMAFIT_NATS_URL"]["value"]
            for _, _, c in numafit_containers(charts.render(chart, values))
        }

    assert urls({}) == {DEFAULT_NATS_URL}
    assert urls({"global": {"nats": {"url": "nats://global:4222"}}}) == {"nats://global:4222"}
    both = {"global": {"nats": {"url": "nats://global:4222"}}, "nats": {"url": "nats://own:4222"}}
    assert urls(both) == {"nats://own:4222"}


@pytest.mark.parametrize("chart", SERVICE_CHARTS)
def test_nats_credentials_come_from_the_secret(charts: Charts, chart: str) -> None:
    for _, _, container in numafit_containers(charts.objects(chart, "full")):
        env = env_of(container)
        names = list(env)
        assert names.index("NATS_USER") < names.index("NUMAFIT_NATS_URL")
        assert names.index("NATS_PASSWORD") < names.index("NUMAFIT_NATS_URL")
        user = env["NATS_USER"]["valueFrom"]["secretKeyRef"]
        password = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert user == {"name": "numafit-nats", "key": "username"}
        assert password == {"name": "numafit-nats", "key": "password"}
        creds = "$(NATS_USER):$(NATS_PASSWORD)@"
        assert env["NUMAFIT_NATS_URL"]["value"] == (
            f"nats://{creds}nats-0.nats.nats.svc:4222,nats://{creds}nats-1.nats.nats.svc:4222"
        )


# ---------------------------------------------------------------------------------------------
# the umbrella chart


def test_umbrella_dependencies_point_at_the_charts() -> None:
    metadata = yaml.safe_load((HELM / "numafit" / "Chart.yaml").read_text())
    assert metadata["apiVersion"] == "v2" and metadata["type"] == "application"
    for dependency in metadata["dependencies"]:
        name = dependency["name"]
        assert dependency["repository"] == f"file://../{name}"
        assert dependency["condition"] == f"{name}.enabled"
        sub = yaml.safe_load((HELM / name / "Chart.yaml").read_text())
        assert dependency["version"] == sub["version"]
        assert sub["appVersion"] == metadata["appVersion"]
    assert {d["name"] for d in metadata["dependencies"]} == set(SERVICE_CHARTS)


@pytest.mark.parametrize("variant", ["default", "full"])
def test_umbrella_one_nats_url_everywhere(charts: Charts, variant: str) -> None:
    values = charts.merged("numafit", variant)
    url = values["global"]["nats"]["url"]
    targets = set()
    seen = set()
    for _, _, container in numafit_containers(charts.objects("numafit", variant)):
        targets.add(target_of(container))
        env = env_of(container)
        seen.add(env["NUMAFIT_NATS_URL"]["value"])
        if variant == "full":
            secret = values["global"]["nats"]["auth"]["existingSecret"]
            assert env["NATS_USER"]["valueFrom"]["secretKeyRef"]["name"] == secret
    assert targets == {"scheduler", "refit", "accounting", "deviceplugin"}
    if variant == "default":
        assert seen == {url} == {DEFAULT_NATS_URL}
    else:
        (spliced,) = seen
        assert spliced.replace("$(NATS_USER):$(NATS_PASSWORD)@", "") == url


def test_umbrella_conditions_disable_subcharts(charts: Charts) -> None:
    values = {"svc-deviceplugin": {"enabled": False}, "svc-scheduler": {"enabled": False}}
    objects = charts.render("numafit", values)
    assert {target_of(c) for _, _, c in numafit_containers(objects)} == {"refit", "accounting"}
    assert not of_kind(objects, "DaemonSet")


def test_umbrella_monitoring_objects(charts: Charts) -> None:
    assert not of_kind(charts.objects("numafit", "default"), "PrometheusRule")
    default_maps = of_kind(charts.objects("numafit", "default"), "ConfigMap")
    assert not [c for c in default_maps if "grafana_dashboard" in c["metadata"]["labels"]]

    objects = charts.objects("numafit", "full")
    rule = one(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = yaml.safe_load((HELM / "numafit" / "files" / "alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]

    (dashboard,) = [
        c for c in of_kind(objects, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "numafit"}
    text = (HELM / "numafit" / "files" / "dashboard.json").read_text()
    assert dashboard["data"] == {"dashboard.json": text}
    assert json.loads(dashboard["data"]["dashboard.json"])["uid"] == json.loads(text)["uid"]
