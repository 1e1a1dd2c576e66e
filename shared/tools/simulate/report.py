"""Run a scenario and report it: the JSON of docs/reference/simulate.md, or a table a person
can read."""

from __future__ import annotations

import asyncio
import math
import sys
from typing import TYPE_CHECKING, Any, TextIO

import aiohttp

from shared.core import overcommit
from shared.tools.simulate.cluster import SimCluster
from shared.tools.simulate.driver import Driver, PodReport
from shared.tools.simulate.scenario import COMPARE_NRT, CreatePod, Scenario

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from prometheus_client import CollectorRegistry


PREDICTIONS = "numafit_scheduler_numa_predictions_total"


def collect_metrics(registries: Iterable[CollectorRegistry]) -> dict[str, float]:
    """Every sample as `name{labels}` -> value; the same series from several nodes' plugins
    is summed (a cluster-wide view, as a Prometheus `sum by` would give)."""
    values: dict[str, float] = {}
    for registry in registries:
        for family in registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                key = f"{sample.name}{{{labels}}}" if labels else sample.name
                value = float(sample.value)
                values[key] = values.get(key, 0.0) + (0.0 if math.isnan(value) else value)
    return dict(sorted(values.items()))


async def simulate(
    scenario: Scenario,
    progress: Callable[[str], None] = lambda _: None,
    keep: Callable[[SimCluster], Any] | None = None,
    ready: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Start everything, run every step in order, and return the report. A scenario with
    `compare: nodeResourceTopology` is run a second time with every node publishing
    NodeResourceTopology the other way; the report is the first run's, with `comparison`.
    `ready` gets the whole report as soon as it is known, before `keep` (which holds the last
    run's cluster up, e.g. until Ctrl-C) runs."""
    if scenario.compare is None:
        return await _run(scenario, progress, keep, ready)
    report = await _run(scenario, progress, None, None)
    other_scenario = scenario.with_node_resource_topology_flipped()
    other_with = any(n.node_resource_topology for n in other_scenario.nodes)
    progress(
        "the same pods again, "
        + ("with NodeResourceTopology" if other_with else "without NodeResourceTopology")
    )

    def combined(other: dict[str, Any]) -> dict[str, Any]:
        runs = {_nrt_label(scenario): report, _nrt_label(other_scenario): other}
        counts = {label: refit_counts(r) for label, r in runs.items()}
        report["comparison"] = {COMPARE_NRT: counts}
        report["_other"] = other
        return report

    both = None if ready is None else (lambda other: ready(combined(other)))
    return combined(await _run(other_scenario, progress, keep, both))


def _nrt_label(scenario: Scenario) -> str:
    return "with" if any(n.node_resource_topology for n in scenario.nodes) else "without"


def refit_counts(report: dict[str, Any]) -> dict[str, Any]:
    """One run's refits, over every pod it created (the deleted ones too): containers that ran
    on GPUs, needed a refit (any outcome but `none`, and `reused`: kubelet's reuse of an init
    container's GPUs is no NUMA refit), had it moved, refused, failed strict, run misaligned;
    and the scheduler's NUMA predictions."""
    pods = [*report["_table"]["deleted"], *report["pods"]]
    containers = [c for p in pods for c in p["containers"]]
    refits = [c["refit"] for c in containers if c["refit"] not in ("none", "reused")]
    metrics = report["metrics"]
    return {
        "ranOnGpus": sum(1 for c in containers if c["gpus"]),
        "refits": len(refits),
        "moved": refits.count("moved"),
        "refused": sum(1 for r in refits if r.startswith("refused:")),
        "strictFailed": refits.count("strict_failed"),
        "misaligned": sum(1 for c in containers if c["gpus"] and not c["aligned"]),
        "predictions": {
            result: int(metrics.get(f'{PREDICTIONS}{{result="{result}"}}', 0))
            for result in ("hit", "miss", "none")
        },
    }


async def _run(
    scenario: Scenario,
    progress: Callable[[str], None],
    keep: Callable[[SimCluster], Any] | None,
    ready: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    cluster = SimCluster(scenario)
    try:
        await cluster.start(progress)
        async with aiohttp.ClientSession() as session:
            driver = Driver(cluster, session)
            total = len(scenario.steps)
            for number, step in enumerate(scenario.steps, 1):
                what = (
                    step.key
                    if isinstance(step, CreatePod)
                    else f"delete {step.namespace}/{step.name}"
                )
                progress(f"[{number}/{total}] {what}")
                await driver.run(step)
            await cluster.predictions_settled()
            report = build_report(cluster, list(driver.reports.values()), driver.deleted)
        if ready is not None:
            ready(report)
        if keep is not None:
            await keep(cluster)
        return report
    finally:
        await cluster.stop()


def build_report(
    cluster: SimCluster, pods: list[PodReport], deleted: list[PodReport]
) -> dict[str, Any]:
    assert cluster.accounting is not None
    ledger = cluster.accounting.ledger
    devices = {name: ledger.node(name).usage_table() for name in sorted(cluster.nodes)}
    return {
        "pods": [p.to_json() for p in pods],
        "devices": devices,
        "metrics": collect_metrics(cluster.all_registries()),
        "_table": _table_data(cluster, pods, deleted),
    }


def _table_data(
    cluster: SimCluster, pods: list[PodReport], deleted: list[PodReport]
) -> dict[str, Any]:
    """Extra facts for the readable table only (kept out of the JSON contract)."""
    gpus = {
        name: [
            {
                "uuid": g.uuid,
                "numa": g.numa,
                "memory": g.memory_mib,
                "cores": g.cores,
                "count": g.replicas or 10,
            }
            for g in node.spec.gpus
        ]
        for name, node in cluster.nodes.items()
    }
    everyone = [*deleted, *pods]
    reserved = {p.key: {c.name: c.reserved_gpus for c in p.containers} for p in everyone}
    messages = {p.key: p.message for p in everyone}
    return {
        "gpus": gpus,
        "reserved": reserved,
        "messages": messages,
        "deleted": [p.to_json() for p in deleted],
    }


def public(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if not k.startswith("_")}


def render_table(report: dict[str, Any], out: TextIO = sys.stdout) -> None:
    comparison = report.get("comparison", {}).get(COMPARE_NRT)
    other = report.get("_other")
    if comparison is None or other is None:
        _render_run(report, out)
        return
    first, second = list(comparison)  # the scenario's own run first
    out.write(f"Run 1, {first} NodeResourceTopology:\n\n")
    _render_run(report, out)
    out.write(f"\nRun 2, the same pods {second} NodeResourceTopology:\n\n")
    _render_run(other, out)
    _render_comparison(comparison, out)


def _render_comparison(comparison: dict[str, Any], out: TextIO) -> None:
    """The two runs' refit counts side by side."""
    out.write("\nThe same pods without and with NodeResourceTopology:\n")
    rows = [("NODERESOURCETOPOLOGY", "REFITS", "MOVED", "REFUSED", "STRICT FAILED", "PREDICTED")]
    for label in ("without", "with"):
        counts = comparison.get(label)
        if counts is None:
            continue
        predictions = counts["predictions"]
        judged = predictions["hit"] + predictions["miss"]
        rows.append(
            (
                label,
                str(counts["refits"]),
                str(counts["moved"]),
                str(counts["refused"]),
                str(counts["strictFailed"]),
                f"{predictions['hit']}/{judged} hit" if judged else "-",
            )
        )
    _print_rows(rows, out)


def _render_run(report: dict[str, Any], out: TextIO) -> None:
    _print_rows(_container_rows(report), out)
    notes = _notes(report)
    if notes:
        out.write("\nWhat happened:\n" + "\n".join(notes) + "\n")
    out.write("\nGPU usage (phase-aware, as accounting counts it):\n")
    _print_rows(_usage_rows(report), out)


_NO_CONTAINER: dict[str, Any] = {
    "name": "-",
    "gpus": [],
    "gpuNuma": [],
    "cpuNuma": None,
    "aligned": True,
    "refit": "none",
}
"""The row of a pod without containers in the report."""


def _container_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per container; the pod's cells only on its first."""
    rows: list[tuple[str, ...]] = [
        ("POD", "NODE", "PHASE", "CONTAINER", "GPUS", "GPU NUMA", "CPU NUMA", "ALIGNED", "REFIT")
    ]
    for pod in report["pods"]:
        key = f"{pod['namespace']}/{pod['name']}"
        first = True
        for c in pod["containers"] or [_NO_CONTAINER]:
            rows.append(
                (
                    key if first else "",
                    pod["node"] if first else "",
                    pod["phase"] if first else "",
                    c["name"],
                    ",".join(c["gpus"]) or "-",
                    ",".join(str(n) for n in c["gpuNuma"]) or "-",
                    "-" if c["cpuNuma"] is None else str(c["cpuNuma"]),
                    ("yes" if c["aligned"] else "NO") if c["gpus"] else "-",
                    c["refit"],
                )
            )
            first = False
    return rows


def _notes(report: dict[str, Any]) -> list[str]:
    """What happened to each container and pod worth a sentence, deleted pods first."""
    table = report["_table"]
    notes: list[str] = []
    for pod in [*table["deleted"], *report["pods"]]:
        key = f"{pod['namespace']}/{pod['name']}"
        reserved = table["reserved"].get(key, {})
        for c in pod["containers"]:
            note = _container_note(report, pod, c, reserved.get(c["name"]) or [])
            if note is not None:
                notes.append(f"  {key} {c['name']}: {note}")
        if pod in table["deleted"]:
            notes.append(f"  {key}: deleted afterwards; its GPU share was released and reused")
        elif pod["phase"] != "Running" and pod["reason"]:
            message = table["messages"].get(key, "")
            notes.append(f"  {key}: {pod['phase']} ({pod['reason']}) {message}".rstrip())
    return notes


def _container_note(
    report: dict[str, Any], pod: dict[str, Any], c: dict[str, Any], before: list[str]
) -> str | None:
    """The story of one container's GPUs (None when there is nothing to tell)."""
    if c["refit"] == "moved":
        pinned = (
            f"pinned its CPUs to NUMA {c['cpuNuma']} and offered only that node's GPUs"
            if c["cpuNuma"] is not None
            else "pinned no CPUs (not a Guaranteed pod) and offered only NUMA "
            f"{_numa_text(c)}'s GPUs"
        )
        return (
            f"the scheduler reserved {','.join(before)}; kubelet "
            f"{pinned}, so the refit moved the reservation to {','.join(c['ledgerGpus'])}"
        )
    if c["refit"] == "reused" and c["gpus"]:
        moved = (
            f"; the reservation followed from {','.join(before)}"
            if before and set(before) != set(c["gpus"])
            else ""
        )
        return (
            f"kubelet gave it its init container's "
            f"{','.join(c['gpus'])} without asking the plugin (device reuse){moved}"
        )
    if _fell_back(c["refit"]) and c["gpus"]:
        return _fallback_note(report, pod, c)
    if _fell_back(c["refit"]):
        return f"refit {c['refit']}; the pod failed admission"
    if c["refit"] == "strict_failed":
        return "strict refit failed, the pod failed admission"
    if before and c["gpus"] and set(before) != set(c["gpus"]):
        return (
            f"no refit (not opted in); kubelet gave "
            f"{','.join(c['gpus'])} instead of {','.join(before)} and accounting followed "
            "what runs"
        )
    return None


def _fallback_note(report: dict[str, Any], pod: dict[str, Any], c: dict[str, Any]) -> str:
    """A best-effort container left on kubelet's GPUs: aligned or not, overcommitted or not."""
    numa = f"GPU NUMA {','.join(str(n) for n in c['gpuNuma'])}, CPU NUMA {c['cpuNuma']}"
    if pod in report["_table"]["deleted"]:  # the usage at the end is no longer its own
        result = "aligned" if c["aligned"] else f"NOT aligned ({numa})"
    else:
        result = overcommit.fallback_result(
            c["aligned"], _overcommits(report, pod["node"], c["gpus"]), numa
        )
    return (
        f"refit {c['refit']}; best-effort kept kubelet's choice "
        f"{','.join(c['gpus'])} and accounting followed it: {result}"
    )


def _usage_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """Each GPU's usage at the end, with the cause of any overcommit."""
    causes = _overcommit_causes(report)
    usage_rows: list[tuple[str, ...]] = [
        ("NODE", "GPU", "NUMA", "SLOTS", "MEMORY MiB", "CORES %", "")
    ]
    for node, gpus in report["_table"]["gpus"].items():
        used = report["devices"].get(node, {})
        for g in gpus:
            u = used.get(g["uuid"], {"used": 0, "usedmem": 0, "usedcores": 0})
            over = overcommit.is_overcommitted(
                u["usedmem"], g["memory"], u["usedcores"], g["cores"]
            )
            usage_rows.append(
                (
                    node,
                    g["uuid"],
                    str(g["numa"]),
                    f"{u['used']}/{g['count']}",
                    f"{u['usedmem']}/{g['memory']}",
                    f"{u['usedcores']}/{g['cores']}",
                    _overcommit_note(causes.get((node, g["uuid"]), {})) if over else "",
                )
            )
    return usage_rows


def _numa_text(container: dict[str, Any]) -> str:
    """The NUMA node(s) of the GPUs a container runs on, as the story names them."""
    nodes = sorted(set(container["gpuNuma"]))
    return ",".join(str(n) for n in nodes) or "-"


def _fell_back(refit: str) -> bool:
    """The refit outcome of a best-effort container left to kubelet's choice."""
    return refit.startswith("refused:") or refit in ("fallback", "timeout")


def _overcommits(report: dict[str, Any], node: str, uuids: Sequence[str]) -> list[str]:
    """`overcommit.overcommitted()` for each of `uuids` over-committed at the end of the run."""
    gpus = {g["uuid"]: g for g in report["_table"]["gpus"].get(node, [])}
    used = report["devices"].get(node, {})
    texts = []
    for uuid in uuids:
        g, u = gpus.get(uuid), used.get(uuid)
        if g is None or u is None:
            continue
        if overcommit.is_overcommitted(u["usedmem"], g["memory"], u["usedcores"], g["cores"]):
            texts.append(
                overcommit.overcommitted(
                    uuid, u["usedmem"], g["memory"], u["usedcores"], g["cores"]
                )
            )
    return texts


def _overcommit_causes(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, list[str]]]:
    """Per (node, GPU): the containers running there on kubelet's choice, by cause (a
    best-effort fallback, or a pod that did not opt in)."""
    reserved = report["_table"]["reserved"]
    causes: dict[tuple[str, str], dict[str, list[str]]] = {}
    for pod in report["pods"]:
        key = f"{pod['namespace']}/{pod['name']}"
        for c in pod["containers"]:
            before = reserved.get(key, {}).get(c["name"]) or []
            if _fell_back(c["refit"]):
                cause = overcommit.FALLBACK
            elif c["refit"] == "none" and before and set(before) != set(c["gpus"]):
                cause = overcommit.NOT_OPTED_IN
            else:
                continue
            for uuid in c["gpus"]:
                causes.setdefault((pod["node"], uuid), {}).setdefault(cause, []).append(
                    f"{key} {c['name']}"
                )
    return causes


def _overcommit_note(causes: dict[str, list[str]]) -> str:
    """The usage table's note for an over-committed GPU: why, and which containers."""
    for cause in (overcommit.FALLBACK, overcommit.NOT_OPTED_IN):
        if cause in causes:
            return f"over-committed by {cause} ({', '.join(causes[cause])})"
    return "over-committed"


def _print_rows(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )


def run_sync(scenario: Scenario, progress: Callable[[str], None]) -> dict[str, Any]:
    return asyncio.run(simulate(scenario, progress))
