"""A Prometheus configuration for the stack: `prometheus --config.file=<state dir>/prometheus.yml`.

The job names are compose's (deploy/compose/prometheus.yml), so the dashboard and the alert
rules read the same series from either; every device plugin target carries its node as the
`node` label (as a Kubernetes pod monitor would relabel it from the pod's node). The alert rules
are loaded from the chart's helm/numafit/files/alerts.yaml when this is a source checkout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ALERTS = Path(__file__).resolve().parents[3] / "helm" / "numafit" / "files" / "alerts.yaml"
DASHBOARD = ALERTS.with_name("dashboard.json")


@dataclass(frozen=True, slots=True)
class Target:
    job: str
    address: str
    """host:port"""
    labels: dict[str, str] = field(default_factory=dict)


def render(
    targets: list[Target], scrape_interval: str = "5s", rule_files: list[Path] | None = None
) -> str:
    jobs: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        static: dict[str, Any] = {"targets": [target.address]}
        if target.labels:
            static["labels"] = dict(target.labels)
        jobs.setdefault(target.job, []).append(static)
    document: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
    }
    rules = rule_files if rule_files is not None else ([ALERTS] if ALERTS.is_file() else [])
    if rules:
        document["rule_files"] = [str(path) for path in rules]
    document["scrape_configs"] = [
        {"job_name": job, "static_configs": configs} for job, configs in jobs.items()
    ]
    header = "# Written by `numafit up`: scrapes the stack's services and loads numafit's alerts.\n"
    return header + yaml.safe_dump(document, sort_keys=False)
