"""Prometheus for real: Debian's prometheus scrapes `numafit up --load` with the configuration
`numafit up` writes, and every dashboard panel and alert expression is evaluated through its
HTTP API. Each panel must return data (a finite value), each alert rule must evaluate without
error (an alert may rightly be quiet). Skipped where prometheus is not installed (`.ci/run`
installs it)."""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.integration.processes import free_port
from tests.ops.test_up import UpProcess

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

PROMETHEUS = shutil.which("prometheus")
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm" / "numafit" / "files" / "dashboard.json"
ALERTS = ROOT / "helm" / "numafit" / "files" / "alerts.yaml"
COMPOSE_PROMETHEUS = ROOT / "deploy" / "compose" / "prometheus.yml"
WITHIN = 45.0
"""Seconds for the whole check: scrapes, rule evaluations and every panel's data."""

# Grafana's variables, as a dashboard user sees them by default: every node, and the ranges
# Grafana derives for a short time range at a 1 s scrape interval.
VARIABLES = {
    "node": ".*",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "5m",
}

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed")


def resolve(expr: str) -> str:
    """Grafana's `$name` and `${name}` replaced by VARIABLES; an unknown one fails."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in VARIABLES, f"dashboard variable ${name} has no test value"
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def panels() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (f"panel {p['id']} {p['title']!r} {t.get('refId', '')}", resolve(t["expr"]))
        for p in dashboard["panels"]
        for t in p.get("targets", [])
        if t.get("expr")
    ]


def alerts() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def test_dashboard_variables_resolve_and_cover_datasource_and_node() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    node = variables["node"]
    assert node["type"] == "query" and node["includeAll"] and node["allValue"] == ".*"
    assert "label_values(" in node["definition"] and ", node)" in node["definition"]
    exprs = [e for _, e in panels()]
    assert all("$" not in e for e in exprs)
    assert sum('node=~".*"' in e for e in exprs) >= 4  # the per-node panels follow $node


class Prometheus:
    def __init__(self, config: Path, data: Path, log: Path) -> None:
        assert PROMETHEUS is not None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        with log.open("wb") as handle:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        self.log = log

    def get(self, path: str, **query: str) -> Any:
        url = f"{self.url}/{path}?{urllib.parse.urlencode(query)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:  # a bad query: Prometheus's error body
            body = exc.read()
            if exc.code == 503 and not body.lstrip().startswith(b"{"):
                # Still starting: its API answers 503 with a plain-text body until it is ready.
                raise ConnectionError(f"prometheus not ready: {body[:80]!r}") from exc
            return json.loads(body)

    def pause(self) -> None:
        """Give Prometheus a moment (its next scrape or evaluation) while watching it runs."""
        try:
            code = self.process.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            return
        raise AssertionError(f"prometheus exited {code}: {self.log.read_text()[-2000:]}")

    def until(self, what: str, check: Callable[[], Any], deadline: float) -> Any:
        """Re-check `check` (None or False: not yet) until it holds or the deadline passes."""
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = check()
            except (urllib.error.URLError, ConnectionError):
                last = None  # not listening yet
            if last:
                return last
            self.pause()
        raise AssertionError(f"{what}: not within {WITHIN}s (last: {last!r})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(sample["value"][1])) for sample in result)


@pytest.fixture
def loaded_stack(tmp_path: Path) -> Iterator[UpProcess]:
    """`numafit up --load` at 5 pods/s, written for a 1 s scrape interval, on two nodes spread
    alike: one publishes NodeResourceTopology (NUMA predictions, hits), the other does not
    (refits)."""
    up = UpProcess(
        tmp_path,
        *("--nodes", "2", "--nrt-nodes", "1", "--node-scheduler-policy", "spread"),
        *("--load", "--load-rate", "5", "--load-max-pods", "10", "--scrape-interval", "1s"),
    )
    try:
        yield up
    finally:
        up.close()


def test_every_panel_and_alert_evaluates_on_a_live_stack(
    tmp_path: Path, loaded_stack: UpProcess
) -> None:
    up = loaded_stack
    stack = up.wait_ready()
    deadline = time.monotonic() + WITHIN

    config_path = Path(stack["prometheusConfig"])
    config = yaml.safe_load(config_path.read_text())
    compose = yaml.safe_load(COMPOSE_PROMETHEUS.read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == [
        j["job_name"] for j in compose["scrape_configs"] if j["job_name"] != "numafit-sim-node"
    ]
    assert config["rule_files"] == [str(ALERTS)]
    assert config["global"]["scrape_interval"] == "1s"

    prometheus = Prometheus(config_path, tmp_path / "prometheus", tmp_path / "prometheus.log")
    try:

        def targets_up() -> bool:
            active = prometheus.get("targets")["data"]["activeTargets"]
            return len(active) == 5 and all(t["health"] == "up" for t in active)

        prometheus.until("every metrics port scraped", targets_up, deadline)

        def answer(expr: str) -> list[dict[str, Any]] | None:
            body = prometheus.get("query", query=expr)
            assert body["status"] == "success", f"{expr}: {body.get('error')}"
            result: list[dict[str, Any]] = body["data"]["result"]
            return result if finite(result) else None

        for what, expr in panels():
            prometheus.until(f"{what}: {expr}", functools.partial(answer, expr), deadline)

        for name, expr in alerts():
            body = prometheus.get("query", query=expr)
            assert body["status"] == "success", f"alert {name}: {body.get('error')}"

        def rules_evaluated() -> list[dict[str, Any]] | None:
            groups = prometheus.get("rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            done = rules and all(r["lastEvaluation"][:4] != "0001" for r in rules)
            return rules if done else None

        rules = prometheus.until("every alert rule evaluated", rules_evaluated, deadline)
        assert {r["name"] for r in rules} == {name for name, _ in alerts()}
        assert [r["name"] for r in rules if r["health"] != "ok"] == []
    finally:
        prometheus.stop()
    assert up.stop(sig=signal.SIGINT) == 0, up.tail()  # Ctrl-C
