"""compose.yaml, the Grafana dashboard and the alert rules against what numafit really runs
and exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from shared.tools import cli
from shared.tools.simulate.report import public, simulate
from shared.tools.simulate.scenario import load_scenario

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DASHBOARD = ROOT / "helm" / "numafit" / "files" / "dashboard.json"
ALERTS = ROOT / "helm" / "numafit" / "files" / "alerts.yaml"
PROMETHEUS = ROOT / "deploy" / "compose" / "prometheus.yml"


def parsers() -> dict[str, Callable[[], argparse.ArgumentParser]]:
    from shared.testing.kube_emulator.cli import build_parser as kube_emulator
    from shared.testing.kubelet_emulator.cli import build_parser as kubelet_emulator
    from shared.tools.simulate.sim_node import build_parser as sim_node
    from svc_accounting.__main__ import build_parser as accounting
    from svc_deviceplugin.__main__ import build_parser as deviceplugin
    from svc_refit.__main__ import build_parser as refit
    from svc_scheduler.__main__ import build_parser as scheduler

    return {
        "accounting": accounting,
        "refit": refit,
        "scheduler": scheduler,
        "deviceplugin": deviceplugin,
        "kube-emulator": kube_emulator,
        "kubelet-emulator": kubelet_emulator,
        "sim-node": sim_node,
    }


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return document


def numafit_services(compose: dict[str, Any]) -> dict[str, list[str]]:
    return {
        name: service["command"]
        for name, service in compose["services"].items()
        if str(service.get("image", "")).startswith("numafit/")
    }


ACCOUNTING_REPLICAS = ("accounting-1", "accounting-2")


def test_compose_has_every_part(compose: dict[str, Any]) -> None:
    services = set(compose["services"])
    assert {"nats", "kube-emulator", "refit", "scheduler", "deviceplugin"} <= services
    assert set(ACCOUNTING_REPLICAS) <= services
    assert {"sim-node", "prometheus", "grafana"} <= services


def test_compose_runs_two_accounting_replicas_on_jetstream(compose: dict[str, Any]) -> None:
    services = compose["services"]
    accounting = {n: s for n, s in services.items() if s.get("command", [""])[0] == "accounting"}
    assert set(accounting) == set(ACCOUNTING_REPLICAS)
    ids = set()
    for name, service in accounting.items():
        environment = service["environment"]
        # The shared settings are kept beside the replica's own id.
        assert environment["NUMAFIT_NATS_URL"] == "nats://nats:4222", name
        assert environment["KUBECONFIG"] == "/kube/kubeconfig", name
        ids.add(environment["NUMAFIT_REPLICA_ID"])
        parsed = parsers()["accounting"]().parse_args(service["command"][1:])
        assert parsed.partitions > 0, f"{name}: replicas need partition leases"
    assert ids == set(ACCOUNTING_REPLICAS)
    ports = {name: metrics_port(accounting[name]["command"]) for name in ACCOUNTING_REPLICAS}
    assert ports == {"accounting-1": 9102, "accounting-2": 9112}
    # The other services keep compose's ports.
    others = {name: metrics_port(services[name]["command"]) for name in ("scheduler", "refit")}
    assert others == {"scheduler": 9101, "refit": 9103}
    assert metrics_port(services["deviceplugin"]["command"]) == 9104

    # NATS runs JetStream (the lease bucket) with its store on a volume.
    nats = services["nats"]["command"]
    assert "-js" in nats
    store = nats[nats.index("-sd") + 1]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["nats"]["volumes"]}
    assert any(store.startswith(path) for path in mounts)
    assert all(name in compose["volumes"] for name in mounts.values())

    # Prometheus scrapes both replicas in one job.
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "numafit-accounting"]
    targets = {t for c in job["static_configs"] for t in c["targets"]}
    assert targets == {"accounting-1:9102", "accounting-2:9112"}


def test_every_command_is_a_real_target_with_valid_flags(compose: dict[str, Any]) -> None:
    known = parsers()
    assert set(known) == set(cli.RUN_TARGETS)
    for name, command in numafit_services(compose).items():
        target, *flags = command
        assert target in cli.RUN_TARGETS, f"{name}: numafit run {target} does not exist"
        known[target]().parse_args(flags)  # exits (fails the test) on an unknown flag


def metrics_port(command: list[str]) -> int:
    target, *flags = command
    parsed = parsers()[target]().parse_args(flags)
    port: int = parsed.metrics_port
    return port


def test_every_scraped_port_is_one_a_service_listens_on(compose: dict[str, Any]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    listening = {
        name: metrics_port(command)
        for name, command in numafit_services(compose).items()
        if name != "kube-emulator"
    }
    scraped = [
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    ]
    assert scraped
    for target in scraped:
        host, port = target.rsplit(":", 1)
        assert host in listening, f"{target}: no such compose service"
        assert listening[host] == int(port), f"{target}: {host} listens on {listening[host]}"
    assert set(listening) <= {t.rsplit(":", 1)[0] for t in scraped}, "a service is not scraped"


def test_compose_mounts_exist_and_rules_are_loaded(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    prometheus = yaml.safe_load(PROMETHEUS.read_text())
    assert prometheus["rule_files"] == ["/etc/prometheus/rules/numafit.yaml"]


@pytest.fixture(scope="module")
def samples() -> dict[str, float]:
    """Every sample the running system exports (the demo scenario exercises every path)."""
    import asyncio

    scenario = load_scenario(ROOT / "shared" / "data" / "demo-scenario.yaml")
    metrics: dict[str, float] = public(asyncio.run(simulate(scenario)))["metrics"]
    return metrics


@pytest.fixture(scope="module")
def exported(samples: dict[str, float]) -> set[str]:
    names = {key.split("{", 1)[0] for key in samples}
    names.add("numafit_simnode_pods_total")  # the compose-only simulated node
    return names


DESIGN_METRICS = {
    "numafit_refit_requests_total": {"code", "mode"},
    "numafit_refit_duration_seconds_bucket": {"le"},
    "numafit_deviceplugin_refits_total": {"mode", "result"},
    "numafit_deviceplugin_misaligned_containers": set(),
    "numafit_accounting_commits_total": {"op", "result"},
    "numafit_accounting_device_memory_reserved_mib": {"node", "uuid"},
    "numafit_accounting_device_cores_reserved": {"node", "uuid"},
    "numafit_accounting_ledger_revision": {"node"},
    "numafit_scheduler_filter_duration_seconds_bucket": {"le"},
    "numafit_scheduler_filter_total": {"result"},
}
RESULTS = {
    "moved",
    "already_aligned",
    "fallback",
    "fallback_refused",
    "strict_failed",
    "timeout",
    "no_mismatch",
    "unmappable",
    "not_opted_in",
}


def test_every_design_metric_is_exported_with_its_labels(samples: dict[str, float]) -> None:
    seen: dict[str, set[str]] = {}
    for key in samples:
        name, _, label_text = key.partition("{")
        seen.setdefault(name, set()).update(
            item.split("=", 1)[0] for item in label_text.rstrip("}").split(",") if item
        )
    for name, labels in DESIGN_METRICS.items():
        assert name in seen, f"{name} is not exported"
        assert seen[name] == labels, f"{name} has labels {seen[name]}, expected {labels}"
    results = {
        k.split('result="')[1].split('"')[0]
        for k in samples
        if k.startswith("numafit_deviceplugin_refits_total")
    }
    assert results <= RESULTS
    assert {"moved", "strict_failed", "no_mismatch"} <= results


@pytest.mark.parametrize(
    "histogram", ["numafit_refit_duration_seconds", "numafit_scheduler_filter_duration_seconds"]
)
def test_histograms_resolve_1ms_to_2s(samples: dict[str, float], histogram: str) -> None:
    bounds = {
        float(k.split('le="')[1].split('"')[0])
        for k in samples
        if k.startswith(f"{histogram}_bucket") and 'le="+Inf"' not in k
    }
    assert min(bounds) <= 0.001 and 2.0 in bounds
    assert len([b for b in bounds if 0.001 <= b <= 2.0]) >= 8


METRIC = re.compile(r"\bnumafit_[a-z0-9_]+")


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_promql_names_only_exported_metrics(source: str, exported: set[str]) -> None:
    expressions = dashboard_expressions() if source == "dashboard" else alert_expressions()
    assert expressions
    for expr in expressions:
        for name in METRIC.findall(expr):
            assert name in exported, f"{name} (in {expr!r}) is not exported"


def test_dashboard_covers_what_operators_watch() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["templating"]["list"][0]["type"] == "datasource"
    text = " ".join(dashboard_expressions())
    for name in (
        "numafit_refit_requests_total",
        "numafit_refit_duration_seconds_bucket",
        "numafit_deviceplugin_refits_total",
        "numafit_deviceplugin_fallback_containers",
        "numafit_accounting_device_memory_reserved_mib",
        "numafit_accounting_device_memory_overcommitted_mib",
        "numafit_accounting_device_cores_reserved",
        "numafit_accounting_commits_total",
        "numafit_scheduler_filter_duration_seconds_bucket",
    ):
        assert name in text
    assert {p["id"] for p in dashboard["panels"]} == set(range(1, len(dashboard["panels"]) + 1))


def test_dashboard_shows_the_accounting_partitions() -> None:
    text = " ".join(dashboard_expressions())
    for name in (
        "numafit_accounting_partitions_owned",
        "numafit_accounting_partitions_total",
        "numafit_accounting_ownership_changes_total",
        "numafit_accounting_takeover_duration_seconds_bucket",
        "numafit_accounting_unowned_requests_total",
    ):
        assert name in text, name
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Accounting partitions owned per replica", "Partitions without an owner"} <= titles


def test_alert_rules_cover_the_four_risks() -> None:
    text = " ".join(alert_expressions())
    assert "numafit_refit_requests_total" in text  # failure ratio
    assert "numafit_refit_duration_seconds_bucket" in text  # p99 near the budget
    assert 'result="conflict"' in text  # accounting conflicts
    assert "numafit_deviceplugin_fallback_containers" in text  # best-effort fallbacks
    assert "numafit_accounting_device_memory_overcommitted_mib" in text  # their harm


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


UNOWNED_ALERT_TEST = """
rule_files: [{rules}]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - {{series: 'numafit_accounting_partitions_total{{instance="a"}}', values: '16x20'}}
      - {{series: 'numafit_accounting_partitions_total{{instance="b"}}', values: '16x20'}}
      - {{series: 'numafit_accounting_partitions_owned{{instance="a"}}', values: '8x20'}}
      # b's 8 partitions: without an owner for 30 s from 30 s (a takeover), then for good
      # from 1m30s.
      - {{series: 'numafit_accounting_partitions_owned{{instance="b"}}', values: '8 8 0 0 8 8 0x14'}}
    alert_rule_test:
      - {{eval_time: 45s, alertname: NumafitAccountingPartitionsUnowned, exp_alerts: []}}
      - {{eval_time: 1m15s, alertname: NumafitAccountingPartitionsUnowned, exp_alerts: []}}
      - {{eval_time: 2m15s, alertname: NumafitAccountingPartitionsUnowned, exp_alerts: []}}
"""


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_unowned_partitions_alert_after_a_minute(tmp_path: Path) -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    (rule,) = [
        r
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "NumafitAccountingPartitionsUnowned"
    ]
    assert rule["for"] == "1m" and rule["labels"]["severity"] == "critical"
    cases = yaml.safe_load(UNOWNED_ALERT_TEST.format(rules=json.dumps(str(ALERTS))))
    (case,) = cases["tests"]
    # 2m15s: unowned for 45 s, not yet; 2m45s: for 75 s, firing with the count.
    case["alert_rule_test"].append(
        {
            "eval_time": "2m45s",
            "alertname": "NumafitAccountingPartitionsUnowned",
            "exp_alerts": [
                {
                    "exp_labels": {"severity": "critical"},
                    "exp_annotations": {
                        "summary": rule["annotations"]["summary"],
                        "description": rule["annotations"]["description"].replace(
                            "{{ $value }}", "8"
                        ),
                    },
                }
            ],
        }
    )
    path = tmp_path / "unowned.yaml"
    path.write_text(yaml.safe_dump(cases))
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_is_multistage_non_root_with_the_run_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert text.count("FROM ") >= 2 and "AS build" in text
    assert re.search(r"^USER 10001$", text, re.M)
    assert 'ENTRYPOINT ["numafit", "run"]' in text
    for copied in (
        "shared",
        "svc_scheduler",
        "svc_refit",
        "svc_accounting",
        "svc_deviceplugin",
        "proto",
    ):
        assert f"COPY {copied} " in text
