"""kube-scheduler's extender wire shapes (k8s.io/kube-scheduler extender/v1).

The Go types carry no json tags, so keys are the Go field names: `Pod`, `Nodes`, `NodeNames`,
`FailedNodes`, `FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`, `PodName`, ... Nested
Kubernetes objects (the Pod, the NodeList) are ordinary camelCase API JSON. Go decodes keys
case-insensitively, so requests are read the same way; answers use the exact names.

`nodeCacheCapable: true` sends `NodeNames` (and expects names back); false sends the full
`Nodes` NodeList (and expects the kept Node objects back). Returned nodes are always a subset of
the ones sent, or kube-scheduler refuses the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.wire import WireError


def _get(obj: Mapping[str, Any], key: str) -> Any:
    """`obj[key]`, matching the key case-insensitively as Go's decoder does."""
    if key in obj:
        return obj[key]
    lowered = key.lower()
    for name, value in obj.items():
        if name.lower() == lowered:
            return value
    return None


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """`ExtenderArgs` of /filter and /prioritize."""

    pod: Any
    """The v1 Pod as sent; parsed by the core (a bad one is answered with `Error`)."""
    names: tuple[str, ...]
    nodes: tuple[Mapping[str, Any], ...] | None
    """The Node objects in non-cache mode (`Nodes`), None in cache mode (`NodeNames`)."""

    @property
    def cache_mode(self) -> bool:
        return self.nodes is None


def parse_extender_args(obj: Mapping[str, Any]) -> ExtenderArgs:
    pod = _get(obj, "Pod")
    names = _get(obj, "NodeNames")
    node_list = _get(obj, "Nodes")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise WireError("ExtenderArgs: NodeNames must be a list of strings")
        return ExtenderArgs(pod, tuple(names), None)
    if node_list is None:
        raise WireError("ExtenderArgs carries neither NodeNames nor Nodes")
    if not isinstance(node_list, Mapping):
        raise WireError("ExtenderArgs: Nodes must be a NodeList object")
    items = node_list.get("items") or []
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise WireError("ExtenderArgs: Nodes.items must be a list of Node objects")
    found = []
    for i, item in enumerate(items):
        meta = item.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise WireError(f"ExtenderArgs: Nodes.items[{i}] has no metadata.name")
        found.append(name)
    return ExtenderArgs(pod, tuple(found), tuple(items))


def filter_result(
    args: ExtenderArgs,
    kept: list[str],
    failed: Mapping[str, str] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """`ExtenderFilterResult` in the form the request used."""
    result: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed or {}),
        "FailedAndUnresolvableNodes": {},
        "Error": error,
    }
    if args.nodes is None:
        result["NodeNames"] = list(kept)
    else:
        wanted = set(kept)
        result["Nodes"] = {
            "apiVersion": "v1",
            "kind": "NodeList",
            "metadata": {},
            "items": [n for n, name in zip(args.nodes, args.names, strict=True) if name in wanted],
        }
    return result


def error_filter_result(args: ExtenderArgs | None, error: str) -> dict[str, Any]:
    """An answer that fails the scheduling attempt with `error` (no node kept)."""
    if args is None:
        return {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": error,
        }
    return filter_result(args, [], None, error)


def host_priority_list(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    """`HostPriorityList`: one `{"Host", "Score"}` per node, in the order given."""
    return [{"Host": host, "Score": score} for host, score in scores.items()]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """`ExtenderBindingArgs` of /bind."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding_args(obj: Mapping[str, Any]) -> BindingArgs:
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = _get(obj, key)
        if not isinstance(value, str) or not value:
            raise WireError(f"ExtenderBindingArgs: {key} must be a non-empty string")
        values[key] = value
    return BindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


def binding_result(error: str = "") -> dict[str, Any]:
    """`ExtenderBindingResult`."""
    return {"Error": error}
