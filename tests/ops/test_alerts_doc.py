"""docs/reference/alerts.md documents every alert of every rule file numafit ships: a section per alert
with its severity (the rule's), when it fires, what it means and what the operator does."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reference" / "alerts.md"
COMPOSE = ROOT / "compose.yaml"
FIELDS = ("Severity", "Fires when", "Meaning", "Action")


def rule_files() -> list[Path]:
    """The chart's rule files and every rule file compose's Prometheus mounts."""
    files = {
        p
        for p in (ROOT / "helm").glob("*/files/*.yaml")
        if "groups" in yaml.safe_load(p.read_text())
    }
    compose: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    for volume in compose["services"]["prometheus"]["volumes"]:
        source, target = volume.split(":")[:2]
        if target.startswith("/etc/prometheus/rules/"):
            files.add((ROOT / source).resolve())
    return sorted(files)


def alerts() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    found[rule["alert"]] = rule
    return found


def sections() -> dict[str, dict[str, str]]:
    """`## Name` sections of the doc, each with its `**Field**: text` paragraphs."""
    parts = re.split(r"^## (\S+)\s*$", DOC.read_text(), flags=re.M)
    found: dict[str, dict[str, str]] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        fields = re.findall(r"^\*\*([^*]+)\*\*: (.+?)(?=\n\n|\Z)", body, flags=re.M | re.S)
        found[name] = {field: " ".join(text.split()) for field, text in fields}
    return found


def test_the_rule_files_are_found() -> None:
    paths = [p.relative_to(ROOT).as_posix() for p in rule_files()]
    assert paths == ["helm/numafit/files/alerts.yaml"]
    assert len(alerts()) >= 7


def test_every_alert_is_documented_with_meaning_and_action() -> None:
    documented = sections()
    rules = alerts()
    assert sorted(documented) == sorted(rules), (
        "docs/reference/alerts.md and the rules name other alerts"
    )
    for name, rule in rules.items():
        fields = documented[name]
        assert set(FIELDS) <= set(fields), f"{name}: missing {set(FIELDS) - set(fields)}"
        assert fields["Severity"] == rule["labels"]["severity"], name
        minutes = int(rule["for"].removesuffix("m"))
        pending = f"for {minutes} minute{'s' if minutes > 1 else ''},"
        assert fields["Fires when"].startswith(pending), f"{name}: fires after {rule['for']}"
        for field in ("Meaning", "Action"):
            assert len(fields[field]) > 80, f"{name}: {field} says too little"


def test_each_section_names_the_metrics_its_rule_reads() -> None:
    """The doc's "fires when" follows the expression: a rule changed to read other series is
    a doc to update."""
    documented = sections()
    for name, rule in alerts().items():
        metrics = set(re.findall(r"\bnumafit_[a-z0-9_]+", rule["expr"]))
        text = documented[name]["Fires when"]
        missing = {m.removesuffix("_bucket") for m in metrics} - set(
            re.findall(r"\bnumafit_[a-z0-9_]+", text)
        )
        assert not missing, f"{name}: 'Fires when' does not name {missing}"
