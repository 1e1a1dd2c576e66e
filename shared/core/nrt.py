"""NodeResourceTopology objects (topology.node.k8s.io/v1alpha2), read and written as dicts.

One cluster-scoped object per node, named after it, as NFD's topology-updater and the
resource-topology-exporter publish them: `zones` (a zone of `type: Node` per NUMA node, named
`node-<id>`, with `resources` of `{name, capacity, allocatable, available}` quantities) and
`attributes` (`{name, value}`; `topologyManagerPolicy`, `topologyManagerScope`). Objects
without those attributes may still carry v1alpha2's deprecated `topologyPolicies`
(`SingleNUMANodeContainerLevel`, ...), which is read as a fallback.

numafit's publisher (the kubelet emulator) also writes the moment its figures were taken in
the annotation `numafit.io/sampled-at` (RFC 3339, UTC): the scheduler then knows exactly which
of the pods it placed the figures already include (those placed before that moment; see
svc_scheduler/topology.py). Other exporters do not write it.

`parse_nrt` refuses anything it cannot read completely with `ObjectError` (the caller then
schedules that node as if it had no NodeResourceTopology); `nrt_object` builds one.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.core.errors import CoreError, ObjectError
from shared.core.numa_prediction import TopologyPolicy, TopologyScope
from shared.core.quantity import parse_quantity

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "noderesourcetopologies"
KIND = "NodeResourceTopology"

POLICY_ATTRIBUTE = "topologyManagerPolicy"
SCOPE_ATTRIBUTE = "topologyManagerScope"
SAMPLED_AT = "numafit.io/sampled-at"
ZONE_NODE = "Node"
CPU = "cpu"

MAX_ZONES = 64
"""More NUMA zones than any machine has (kubelet refuses more than 8 by default)."""
_ZONE_NAME = re.compile(r"^node-(\d{1,3})$")

_LEGACY_POLICIES = {
    "None": TopologyPolicy.NONE,
    "BestEffort": TopologyPolicy.BEST_EFFORT,
    "Restricted": TopologyPolicy.RESTRICTED,
    "SingleNUMANode": TopologyPolicy.SINGLE_NUMA_NODE,
}
_LEGACY_SCOPES = {"ContainerLevel": TopologyScope.CONTAINER, "PodLevel": TopologyScope.POD}


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """What the scheduler reads from one node's NodeResourceTopology."""

    node: str
    policy: TopologyPolicy
    scope: TopologyScope
    free_cpus: Mapping[int, int]
    """`available` CPUs per NUMA node (whole CPUs; a fraction is rounded down)."""
    sampled_at: float | None
    """Seconds since the epoch the figures were taken at (`numafit.io/sampled-at`), if given."""
    resource_version: str = ""


def _cut(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _attributes(items: object, where: str) -> dict[str, str]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise ObjectError(f"{where} must be a list")
    found: dict[str, str] = {}
    for item in items:
        if not isinstance(item, Mapping):
            raise ObjectError(f"{where} entries must be objects")
        name, value = item.get("name"), item.get("value")
        if not isinstance(name, str) or not isinstance(value, str):
            raise ObjectError(f"{where} entries need a string name and value")
        found[name] = value
    return found


def _policy_and_scope(obj: Mapping[str, Any], name: str) -> tuple[TopologyPolicy, TopologyScope]:
    attributes = _attributes(obj.get("attributes"), f"NodeResourceTopology {name}: attributes")
    policy_text = attributes.get(POLICY_ATTRIBUTE)
    scope_text = attributes.get(SCOPE_ATTRIBUTE)
    if policy_text is not None:
        try:
            policy = TopologyPolicy(policy_text)
            scope = TopologyScope(scope_text) if scope_text is not None else TopologyScope.CONTAINER
        except ValueError as exc:
            raise ObjectError(
                f"NodeResourceTopology {name}: unknown topology manager policy or scope "
                f"{_cut(policy_text)}/{_cut(scope_text)}"
            ) from exc
        return policy, scope
    legacy = obj.get("topologyPolicies")
    if isinstance(legacy, list) and len(legacy) == 1 and isinstance(legacy[0], str):
        for prefix, policy in _LEGACY_POLICIES.items():
            rest = legacy[0][len(prefix) :] if legacy[0].startswith(prefix) else None
            if rest is None:
                continue
            if policy is TopologyPolicy.NONE and rest == "":
                return policy, TopologyScope.CONTAINER
            if rest in _LEGACY_SCOPES:
                return policy, _LEGACY_SCOPES[rest]
    raise ObjectError(f"NodeResourceTopology {name}: no {POLICY_ATTRIBUTE} attribute")


def _zone_cpus(zone: Mapping[str, Any], where: str) -> int:
    resources = zone.get("resources") or []
    if not isinstance(resources, list):
        raise ObjectError(f"{where}: resources must be a list")
    for resource in resources:
        if not isinstance(resource, Mapping):
            raise ObjectError(f"{where}: resources entries must be objects")
        if resource.get("name") != CPU:
            continue
        try:
            available = parse_quantity(resource.get("available"))
        except CoreError as exc:
            raise ObjectError(f"{where}: cpu available {_cut(resource.get('available'))}") from exc
        return max(math.floor(available), 0)
    return 0


def _sampled_at(annotations: Mapping[str, Any]) -> float | None:
    text = annotations.get(SAMPLED_AT)
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def parse_nrt(obj: object) -> NodeTopology:
    """One NodeResourceTopology object; `ObjectError` (message bounded) when it cannot be read."""
    if not isinstance(obj, Mapping):
        raise ObjectError("NodeResourceTopology must be an object")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ObjectError("NodeResourceTopology has no metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("NodeResourceTopology has no metadata.name")
    if len(name) > 253:
        raise ObjectError(f"NodeResourceTopology name {_cut(name)} is too long")
    policy, scope = _policy_and_scope(obj, name)
    zones = obj.get("zones")
    if not isinstance(zones, list) or len(zones) > MAX_ZONES:
        raise ObjectError(f"NodeResourceTopology {name}: zones must be a list of NUMA zones")
    free: dict[int, int] = {}
    for i, zone in enumerate(zones):
        if not isinstance(zone, Mapping):
            raise ObjectError(f"NodeResourceTopology {name}: zones[{i}] must be an object")
        if zone.get("type") != ZONE_NODE:
            continue  # sockets, caches, ...: not what kubelet aligns to
        match = _ZONE_NAME.match(str(zone.get("name")))
        if match is None:
            raise ObjectError(
                f"NodeResourceTopology {name}: zone name {_cut(zone.get('name'))} is not node-<id>"
            )
        numa = int(match.group(1))
        if numa in free:
            raise ObjectError(f"NodeResourceTopology {name}: zone node-{numa} given twice")
        free[numa] = _zone_cpus(zone, f"NodeResourceTopology {name}: zone node-{numa}")
    annotations = meta.get("annotations")
    version = meta.get("resourceVersion")
    return NodeTopology(
        node=name,
        policy=policy,
        scope=scope,
        free_cpus=dict(sorted(free.items())),
        sampled_at=_sampled_at(annotations) if isinstance(annotations, Mapping) else None,
        resource_version=version if isinstance(version, str) else "",
    )


@dataclass(frozen=True, slots=True)
class ZoneResource:
    name: str
    capacity: int
    allocatable: int
    available: int


def nrt_object(
    node: str,
    policy: TopologyPolicy,
    scope: TopologyScope,
    zones: Mapping[int, list[ZoneResource]],
    sampled_at: float,
) -> dict[str, Any]:
    """The NodeResourceTopology object a topology-updater would publish for `node`."""
    moment = datetime.datetime.fromtimestamp(sampled_at, datetime.UTC)
    ids = sorted(zones)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": node,
            "annotations": {SAMPLED_AT: moment.isoformat(timespec="microseconds")},
        },
        "attributes": [
            {"name": POLICY_ATTRIBUTE, "value": policy.value},
            {"name": SCOPE_ATTRIBUTE, "value": scope.value},
        ],
        "zones": [
            {
                "name": f"node-{numa}",
                "type": ZONE_NODE,
                # kubelet's defaults for a two-socket machine: 10 local, 20 remote.
                "costs": [
                    {"name": f"node-{other}", "value": 10 if other == numa else 20} for other in ids
                ],
                "resources": [
                    {
                        "name": r.name,
                        "capacity": str(r.capacity),
                        "allocatable": str(r.allocatable),
                        "available": str(r.available),
                    }
                    for r in zones[numa]
                ],
            }
            for numa in ids
        ],
    }
