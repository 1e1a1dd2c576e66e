"""Server-side printing: the meta.k8s.io Table kubectl asks for to print `get`'s columns.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io, ...` and prints the
columns it gets (priority 0 always, priority 1 with `-o wide`), so the columns and cells here
are what `kubectl get` shows: pods (NAME READY STATUS RESTARTS AGE, wide: IP NODE NOMINATED
NODE READINESS GATES), nodes, events, namespaces, resource quotas, and NAME AGE for the rest.
Each row carries the object as `includeObject` says: the whole object, its metadata only
(PartialObjectMetadata, the default, which kubectl needs for --show-labels and -A), or nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .objects import JSONDict, child, metadata

if TYPE_CHECKING:
    from .resources import ResourceKind

Include = Literal["None", "Metadata", "Object"]

Cell = str | int


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    description: str
    priority: int = 0
    type: str = "string"
    format: str = ""

    def to_json(self) -> JSONDict:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        }


Printer = Callable[[JSONDict, dt.datetime], list[Cell]]

_NAME = Column("Name", "The object's name, unique within its namespace.", format="name")
_AGE = Column("Age", "How long ago the object was created.")


# --- durations as kubectl shows them -------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """A duration in kubectl's short form: 45s, 3m20s, 25m, 5h10m, 20h, 3d4h, 40d, 2y30d."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        rest = whole % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        years = hours // 24 // 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


def _parse_time(value: object) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _since(value: object, now: dt.datetime) -> str:
    moment = _parse_time(value)
    if moment is None:
        return "<unknown>"
    return human_duration((now - moment).total_seconds())


def _age(obj: JSONDict, now: dt.datetime) -> str:
    return _since(metadata(obj).get("creationTimestamp"), now)


def _name(obj: JSONDict) -> str:
    return str(metadata(obj).get("name", ""))


def _or_none(value: object) -> str:
    return str(value) if value else "<none>"


# --- pods ----------------------------------------------------------------------------------------

_POD_COLUMNS = (
    _NAME,
    Column("Ready", "How many of the pod's containers are ready."),
    Column("Status", "The pod's aggregate state, as kubectl words it."),
    Column("Restarts", "How often the pod's containers restarted, and when last."),
    _AGE,
    Column("IP", "The pod's IP address.", 1),
    Column("Node", "The node the pod is bound to.", 1),
    Column("Nominated Node", "The node preemption made room on for the pod.", 1),
    Column("Readiness Gates", "How many of the pod's readiness gates are met.", 1),
)


def _statuses(status: JSONDict, key: str) -> list[JSONDict]:
    value = status.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _terminated_reason(terminated: JSONDict, prefix: str = "") -> str:
    if terminated.get("reason"):
        return prefix + str(terminated["reason"])
    if terminated.get("signal"):
        return f"{prefix}Signal:{terminated['signal']}"
    return f"{prefix}ExitCode:{terminated.get('exitCode', 0)}"


def _pod_status(pod: JSONDict) -> tuple[str, int, str | None]:
    """The STATUS cell, the restart count and the time of the last restart."""
    spec, status, meta = child(pod, "spec"), child(pod, "status"), metadata(pod)
    reason = str(status.get("reason") or status.get("phase") or "")
    if reason == "Pending" and spec.get("schedulingGates"):
        reason = "SchedulingGated"
    init_statuses = _statuses(status, "initContainerStatuses")
    init_reason, walked = _init_reason(spec, init_statuses)
    # kubectl counts restarts of the containers it walked: the init containers up to the one
    # still initializing, and the app containers only once every init container is done.
    counted = init_statuses[:walked]
    if init_reason is not None:
        reason = init_reason
    else:
        app_statuses = _statuses(status, "containerStatuses")
        counted += app_statuses
        reason = _app_reason(status, app_statuses, reason)
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    restarts, last_restart = _restart_totals(counted)
    return reason, restarts, last_restart


def _init_reason(spec: JSONDict, init_statuses: list[JSONDict]) -> tuple[str | None, int]:
    """The reason of the first init container not done (None when all are) and how many init
    containers were walked to find it."""
    for index, container in enumerate(init_statuses):
        state = child(container, "state")
        terminated, waiting = child(state, "terminated"), child(state, "waiting")
        if terminated and terminated.get("exitCode") == 0:
            continue
        if terminated:
            return _terminated_reason(terminated, "Init:"), index + 1
        if waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            return f"Init:{waiting['reason']}", index + 1
        return f"Init:{index}/{len(spec.get('initContainers') or [])}", index + 1
    return None, len(init_statuses)


def _app_reason(status: JSONDict, app_statuses: list[JSONDict], reason: str) -> str:
    """The reason from the app containers, the last one listed first, as kubectl reads it."""
    running = False
    for container in reversed(app_statuses):
        state = child(container, "state")
        waiting, terminated = child(state, "waiting"), child(state, "terminated")
        if waiting.get("reason"):
            reason = str(waiting["reason"])
        elif terminated:
            reason = _terminated_reason(terminated)
        elif state.get("running") and container.get("ready"):
            running = True
    if reason == "Completed" and running:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in _statuses(status, "conditions")
        )
        reason = "Running" if ready else "NotReady"
    return reason


def _restart_totals(containers: list[JSONDict]) -> tuple[int, str | None]:
    """Restarts summed and the latest lastState.terminated.finishedAt."""
    restarts, last_restart = 0, None
    for container in containers:
        restarts += int(container.get("restartCount") or 0)
        finished = child(child(container, "lastState"), "terminated").get("finishedAt")
        if isinstance(finished, str) and (last_restart is None or finished > last_restart):
            last_restart = finished
    return restarts, last_restart


def _pod_row(pod: JSONDict, now: dt.datetime) -> list[Cell]:
    spec, status = child(pod, "spec"), child(pod, "status")
    containers = spec.get("containers") if isinstance(spec.get("containers"), list) else []
    ready = sum(1 for c in _statuses(status, "containerStatuses") if c.get("ready"))
    reason, restarts, last_restart = _pod_status(pod)
    restarts_cell = str(restarts)
    if restarts and last_restart:
        restarts_cell += f" ({_since(last_restart, now)} ago)"
    gates = spec.get("readinessGates") if isinstance(spec.get("readinessGates"), list) else []
    gates_cell = "<none>"
    if gates:
        true_conditions = {
            c.get("type") for c in _statuses(status, "conditions") if c.get("status") == "True"
        }
        met = sum(
            1 for g in gates if isinstance(g, dict) and g.get("conditionType") in true_conditions
        )
        gates_cell = f"{met}/{len(gates)}"
    return [
        _name(pod),
        f"{ready}/{len(containers or [])}",
        reason,
        restarts_cell,
        _age(pod, now),
        _or_none(status.get("podIP")),
        _or_none(spec.get("nodeName")),
        _or_none(status.get("nominatedNodeName")),
        gates_cell,
    ]


# --- nodes ---------------------------------------------------------------------------------------

_NODE_COLUMNS = (
    _NAME,
    Column("Status", "Whether the node is ready, and whether it takes new pods."),
    Column("Roles", "The node's roles, from its node-role.kubernetes.io/ labels."),
    _AGE,
    Column("Version", "The node's kubelet version."),
    Column("Internal-IP", "The node's internal address.", 1),
    Column("External-IP", "The node's external address.", 1),
    Column("OS-Image", "The node's operating system image.", 1),
    Column("Kernel-Version", "The node's kernel version.", 1),
    Column("Container-Runtime", "The node's container runtime and its version.", 1),
)


def _node_row(node: JSONDict, now: dt.datetime) -> list[Cell]:
    spec, status = child(node, "spec"), child(node, "status")
    ready = next((c for c in _statuses(status, "conditions") if c.get("type") == "Ready"), None)
    states = {"True": "Ready", "False": "NotReady"}
    cell = states.get(str(ready.get("status")), "Unknown") if ready else "Unknown"
    if spec.get("unschedulable"):
        cell += ",SchedulingDisabled"
    labels = child(metadata(node), "labels")
    roles = sorted(
        {
            key.removeprefix("node-role.kubernetes.io/")
            for key in labels
            if key.startswith("node-role.kubernetes.io/")
        }
        | ({str(labels["kubernetes.io/role"])} if labels.get("kubernetes.io/role") else set())
    )
    addresses = {a.get("type"): a.get("address") for a in _statuses(status, "addresses")}
    info = child(status, "nodeInfo")
    return [
        _name(node),
        cell,
        ",".join(role for role in roles if role) or "<none>",
        _age(node, now),
        str(info.get("kubeletVersion", "")),
        _or_none(addresses.get("InternalIP")),
        _or_none(addresses.get("ExternalIP")),
        str(info.get("osImage") or "<unknown>"),
        str(info.get("kernelVersion") or "<unknown>"),
        str(info.get("containerRuntimeVersion") or "<unknown>"),
    ]


# --- events --------------------------------------------------------------------------------------

_EVENT_COLUMNS = (
    Column("Last Seen", "When the event was last seen."),
    Column("Type", "Normal or Warning."),
    Column("Reason", "Why the event happened."),
    Column("Object", "The object the event is about."),
    Column("Subobject", "The part of the object the event is about.", 1),
    Column("Source", "The component that reported the event.", 1),
    Column("Message", "What happened."),
    Column("First Seen", "When the event was first seen.", 1),
    Column("Count", "How often the event happened.", 1, "integer"),
    Column("Name", "The event's name.", 1, format="name"),
)


def _event_row(event: JSONDict, now: dt.datetime) -> list[Cell]:
    """A core/v1 Event's row (events.k8s.io/v1 ones are converted to core/v1 first)."""
    series = child(event, "series")
    last = series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
    first = event.get("firstTimestamp") or event.get("eventTime")
    regarding = child(event, "involvedObject")
    source = child(event, "source")
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    count = series.get("count") or event.get("count") or 1
    return [
        _since(last, now),
        str(event.get("type", "")),
        str(event.get("reason", "")),
        f"{str(regarding.get('kind', '')).lower()}/{regarding.get('name', '')}",
        str(regarding.get("fieldPath", "")),
        f"{component}, {host}" if host else str(component),
        str(event.get("message", "")).strip(),
        _since(first, now),
        int(count) if isinstance(count, int) else 1,
        _name(event),
    ]


# --- namespaces, quotas, the rest ----------------------------------------------------------------

_NAMESPACE_COLUMNS = (_NAME, Column("Status", "The namespace's lifecycle phase."), _AGE)


def _namespace_row(namespace: JSONDict, now: dt.datetime) -> list[Cell]:
    return [
        _name(namespace),
        str(child(namespace, "status").get("phase", "")),
        _age(namespace, now),
    ]


_QUOTA_COLUMNS = (
    _NAME,
    _AGE,
    Column("Request", "Used and hard amounts of the requests the quota counts."),
    Column("Limit", "Used and hard amounts of the limits the quota counts."),
)


def _quota_row(quota: JSONDict, now: dt.datetime) -> list[Cell]:
    status = child(quota, "status")
    hard, used = child(status, "hard"), child(status, "used")
    requests: list[str] = []
    limits: list[str] = []
    for resource in sorted(hard):
        text = f"{resource}: {used.get(resource, 0)}/{hard[resource]}"
        (limits if resource.startswith("limits.") else requests).append(text)
    return [_name(quota), _age(quota, now), ", ".join(requests), ", ".join(limits)]


_CONFIG_MAP_COLUMNS = (
    _NAME,
    Column("Data", "How many keys the config map holds.", type="integer"),
    _AGE,
)


def _config_map_row(config_map: JSONDict, now: dt.datetime) -> list[Cell]:
    keys = len(child(config_map, "data")) + len(child(config_map, "binaryData"))
    return [_name(config_map), keys, _age(config_map, now)]


def _default_row(obj: JSONDict, now: dt.datetime) -> list[Cell]:
    return [_name(obj), _age(obj, now)]


_PRINTERS: dict[str, tuple[tuple[Column, ...], Printer]] = {
    "pods": (_POD_COLUMNS, _pod_row),
    "nodes": (_NODE_COLUMNS, _node_row),
    "events": (_EVENT_COLUMNS, _event_row),
    "namespaces": (_NAMESPACE_COLUMNS, _namespace_row),
    "resourcequotas": (_QUOTA_COLUMNS, _quota_row),
    "configmaps": (_CONFIG_MAP_COLUMNS, _config_map_row),
}
_DEFAULT = ((_NAME, _AGE), _default_row)


def _row_object(kind: ResourceKind, obj: JSONDict, include: Include) -> JSONDict | None:
    if include == "None":
        return None
    if include == "Object":
        return {"kind": kind.kind, "apiVersion": kind.api_version, **obj}
    return partial_metadata(obj)


def partial_metadata(obj: JSONDict, version: str = "v1") -> JSONDict:
    """An object's PartialObjectMetadata: its metadata alone."""
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": metadata(obj),
    }


def table(
    kind: ResourceKind,
    objects: list[JSONDict],
    resource_version: str,
    include: Include,
    version: str = "v1",
    *,
    now: dt.datetime | None = None,
) -> JSONDict:
    """A Table of `objects` (as the client sees them). Printers read the stored form, so
    events.k8s.io/v1 Events print from their core/v1 fields."""
    columns, printer = _PRINTERS.get(kind.bucket, _DEFAULT)
    moment = now or dt.datetime.now(dt.UTC)
    rows = []
    for obj in objects:
        row: JSONDict = {"cells": printer(kind.to_storage(obj), moment)}
        embedded = _row_object(kind, obj, include)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [column.to_json() for column in columns],
        "rows": rows,
    }
