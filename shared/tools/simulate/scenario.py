"""The simulate scenario: nodes (topology policy, CPUs, GPUs), scheduler config, pods.

    nodes:
      - name: node-1
        topologyPolicy: single-numa-node   # none | best-effort | restricted | single-numa-node
        cpus: {0: 32, 1: 32}               # allocatable exclusive CPUs per NUMA node
        gpus:
          - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 1}   # cores 100, count 10
        nodeResourceTopology: false        # true: the node publishes NodeResourceTopology
        kubeletVersion: v1.31.0            # the kubelet played (status.nodeInfo.kubeletVersion)
    config: {gpuSchedulerPolicy: spread, nodeSchedulerPolicy: binpack}
    pods: [<Pod manifests>, {delete: ns/name}, ...]
    compare: nodeResourceTopology          # optional: run the pods again with every node's
                                           # nodeResourceTopology the other way, report both

Unknown keys and wrong types are refused with a message naming the line. Pod manifests are
checked against the Kubernetes API emulator's own Pod schema (the one its field validation,
OpenAPI and kubectl use), so `resourcs:` or `anotations:` is refused here, naming the file, the
line, the pod and the key, instead of being dropped later by the API server.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from shared.core.config import CoreConfig, parse_config
from shared.core.errors import CoreError
from shared.core.kubelet_version import parse_kubelet_version
from shared.core.pods import pod_from_object
from shared.testing.kube_emulator.field_validation import inspect as inspect_fields
from shared.testing.kube_emulator.resources import PODS
from shared.testing.kube_emulator.schema import ListOf, MapOf, ObjectType, Ref, TypeExpr
from shared.testing.kube_emulator.schema_catalog import CATALOG
from shared.testing.kubelet_emulator import DEFAULT_KUBELET_VERSION, TopologyPolicy
from svc_deviceplugin.discovery import GpuInfo, TopologyError, parse_gpus


class ScenarioError(ValueError):
    """The scenario is malformed; the message names the line."""


class _LineLoader(yaml.SafeLoader):
    """A safe loader that remembers the line of every mapping and list it builds."""

    lines: dict[int, int]
    key_lines: dict[int, dict[Any, int]]
    """Per mapping: the line of each of its keys."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    value = loader.construct_mapping(node, deep=True)
    mapping = dict(value)
    loader.lines[id(mapping)] = node.start_mark.line + 1
    keys: dict[Any, int] = {}
    for key_node, _ in node.value:
        try:
            keys[loader.construct_object(key_node)] = key_node.start_mark.line + 1
        except TypeError:  # an unhashable key: refused with the mapping's own line later
            continue
    loader.key_lines[id(mapping)] = keys
    return mapping


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> list[Any]:
    items = loader.construct_sequence(node, deep=True)
    loader.lines[id(items)] = node.start_mark.line + 1
    return items


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    topology_policy: TopologyPolicy
    cpus: dict[int, int]
    gpus: list[GpuInfo]
    node_resource_topology: bool = False
    """The node publishes NodeResourceTopology after every admission and release."""
    kubelet_version: str = DEFAULT_KUBELET_VERSION
    """The kubelet version its emulator plays and its Node reports: before v1.31 a pod whose
    init containers ask for `nvidia.com/gpumem` or `gpucores` is rejected."""


@dataclass(frozen=True, slots=True)
class CreatePod:
    manifest: dict[str, Any]
    line: int

    @property
    def key(self) -> str:
        meta = self.manifest["metadata"]
        return f"{meta.get('namespace', 'default')}/{meta['name']}"


@dataclass(frozen=True, slots=True)
class DeletePod:
    namespace: str
    name: str
    line: int


Step = CreatePod | DeletePod


COMPARE_NRT = "nodeResourceTopology"
"""`compare` value: run again with every node's nodeResourceTopology the other way."""


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: list[NodeSpec]
    config: CoreConfig
    steps: list[Step]
    compare: str | None = None
    """A second run to report beside this one (`COMPARE_NRT`), or None."""

    def with_node_resource_topology_flipped(self) -> Scenario:
        """The same scenario with every node publishing NodeResourceTopology the other way."""
        nodes = [
            replace(n, node_resource_topology=not n.node_resource_topology) for n in self.nodes
        ]
        return replace(self, nodes=nodes, compare=None)


class _Checker:
    def __init__(
        self, lines: dict[int, int], source: str, key_lines: dict[int, dict[Any, int]] | None = None
    ) -> None:
        self.lines = lines
        self.source = source
        self.key_lines = key_lines or {}

    def line(self, obj: object, key: object = None) -> int:
        """The line of `obj` (of its key `key` when given and known)."""
        found = self.key_lines.get(id(obj), {}).get(key) if key is not None else None
        return found or self.lines.get(id(obj), 0)

    def fail(self, obj: object, message: str, key: object = None) -> ScenarioError:
        line = self.line(obj, key)
        where = f"{self.source}:{line}" if line else self.source
        return ScenarioError(f"{where}: {message}")

    def mapping(self, obj: object, what: str, parent: object) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise self.fail(
                parent if not isinstance(obj, list) else obj, f"{what} must be a mapping"
            )
        return obj

    def keys(self, obj: dict[str, Any], allowed: set[str], what: str) -> None:
        unknown = sorted(str(k) for k in obj if k not in allowed)
        if unknown:
            known = ", ".join(sorted(allowed))
            raise self.fail(obj, f"unknown key(s) {', '.join(unknown)} in {what}; allowed: {known}")


_POLICIES = {p.value: p for p in TopologyPolicy}


def parse_scenario(text: str, source: str = "scenario") -> Scenario:
    loader = _LineLoader(text)
    loader.lines = {}
    loader.key_lines = {}
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from exc
    finally:
        loader.dispose()
    check = _Checker(loader.lines, source, loader.key_lines)
    if not isinstance(document, dict):
        raise ScenarioError(f"{source}: a scenario is a mapping with nodes, config and pods")
    check.keys(document, {"nodes", "config", "pods", "compare"}, "the scenario")
    nodes_obj = document.get("nodes")
    if not isinstance(nodes_obj, list) or not nodes_obj:
        raise check.fail(document, "nodes must be a non-empty list")
    nodes = [_node(check, item) for item in nodes_obj]
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise check.fail(nodes_obj, "node names must be unique")
    config_obj = document.get("config")
    try:
        config = parse_config(config_obj) if config_obj is not None else CoreConfig()
    except CoreError as exc:
        raise check.fail(config_obj, str(exc)) from exc
    pods_obj = document.get("pods", [])
    if not isinstance(pods_obj, list):
        raise check.fail(document, "pods must be a list")
    steps = [_step(check, item, pods_obj) for item in pods_obj]
    compare = document.get("compare")
    if compare is not None and compare != COMPARE_NRT:
        raise check.fail(document, f"compare must be {COMPARE_NRT} (or left out)")
    if compare is not None and len({n.node_resource_topology for n in nodes}) > 1:
        raise check.fail(
            document, "compare: every node must have the same nodeResourceTopology setting"
        )
    return Scenario(nodes, config, steps, compare)


def load_scenario(path: str | Path) -> Scenario:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_scenario(text, str(path))


def _node(check: _Checker, item: object) -> NodeSpec:
    node = check.mapping(item, "a node", item)
    check.keys(
        node,
        {"name", "topologyPolicy", "cpus", "gpus", "nodeResourceTopology", "kubeletVersion"},
        "a node",
    )
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise check.fail(node, "a node needs a name")
    policy_value = node.get("topologyPolicy", "single-numa-node")
    policy = _POLICIES.get(policy_value) if isinstance(policy_value, str) else None
    if policy is None:
        raise check.fail(node, f"node {name}: topologyPolicy must be one of {', '.join(_POLICIES)}")
    cpus_obj = node.get("cpus", {0: 64})
    if not isinstance(cpus_obj, dict) or not all(
        isinstance(k, int)
        and not isinstance(k, bool)
        and isinstance(v, int)
        and not isinstance(v, bool)
        and k >= 0
        and v >= 0
        for k, v in cpus_obj.items()
    ):
        raise check.fail(
            node if not isinstance(cpus_obj, dict) else cpus_obj,
            f"node {name}: cpus must map NUMA node numbers to CPU counts",
        )
    gpus_obj = node.get("gpus")
    try:
        gpus = parse_gpus(gpus_obj, where=f"node {name}: gpus")
    except TopologyError as exc:
        raise check.fail(gpus_obj if isinstance(gpus_obj, list) else node, str(exc)) from exc
    nrt = node.get("nodeResourceTopology", False)
    if not isinstance(nrt, bool):
        raise check.fail(node, f"node {name}: nodeResourceTopology must be true or false")
    version = node.get("kubeletVersion", DEFAULT_KUBELET_VERSION)
    if parse_kubelet_version(version) is None:
        raise check.fail(node, f"node {name}: kubeletVersion must be a version such as v1.28.7")
    return NodeSpec(name, policy, dict(cpus_obj), gpus, nrt, str(version).strip())


def _step(check: _Checker, item: object, parent: object) -> Step:
    obj = check.mapping(item, "a pods entry", parent)
    if "delete" in obj:
        check.keys(obj, {"delete"}, "a delete step")
        target = obj["delete"]
        if not isinstance(target, str) or target.count("/") != 1 or not all(target.split("/")):
            raise check.fail(obj, "delete takes namespace/name")
        namespace, name = target.split("/")
        return DeletePod(namespace, name, check.line(obj))
    check.keys(obj, {"apiVersion", "kind", "metadata", "spec"}, "a Pod manifest")
    if obj.get("kind", "Pod") != "Pod":
        raise check.fail(obj, "pods entries are Pod manifests or {delete: ns/name}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise check.fail(obj, "a Pod needs metadata.name")
    manifest = dict(obj)
    manifest.setdefault("apiVersion", "v1")
    manifest.setdefault("kind", "Pod")
    _check_pod_fields(check, obj, manifest)
    try:  # the same checks the services apply (a uid is added only for this check)
        probe = {**manifest, "metadata": {**manifest["metadata"], "uid": "check"}}
        pod_from_object(probe)
    except CoreError as exc:
        raise check.fail(obj, str(exc)) from exc
    return CreatePod(manifest, check.line(obj))


_PATH_TOKEN = re.compile(r"\[([^\]]*)\]|\.?([^.\[]+)")
_ARTICLES = {"array": "a list", "object": "a mapping", "integer": "an integer"}


def _tokens(path: str) -> list[str]:
    """`spec.containers[0].resourcs` -> spec, containers, 0, resourcs."""
    return [name or index for index, name in _PATH_TOKEN.findall(path)]


def _parent(obj: Any, tokens: list[str]) -> Any:
    """The object holding the last of `tokens` (None when the path does not lead there)."""
    node = obj
    for token in tokens[:-1]:
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            return None
    return node


def _named(expr: TypeExpr | ObjectType | None) -> TypeExpr | ObjectType | None:
    """`expr` with references followed to the object they name (None: a scalar type)."""
    while isinstance(expr, Ref):
        named = CATALOG.get(expr.target)
        if not isinstance(named, ObjectType):
            return None
        expr = named
    return expr


def _fields_at(tokens: list[str]) -> list[str]:
    """The field names the Pod schema has where the last of `tokens` sits."""
    expr: TypeExpr | ObjectType | None = CATALOG.by_gvk(PODS.group, PODS.version, PODS.kind)
    for token in tokens[:-1]:
        expr = _named(expr)
        if isinstance(expr, ObjectType):
            spec = expr.fields.get(token)
            expr = spec.type if spec is not None else None
        elif isinstance(expr, ListOf):
            expr = expr.items
        elif isinstance(expr, MapOf):
            expr = expr.values
        else:
            return []
    expr = _named(expr)
    return sorted(expr.fields) if isinstance(expr, ObjectType) else []


def _check_pod_fields(check: _Checker, obj: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Refuse the first (by line) unknown key or wrongly typed value of a Pod manifest, as the
    API emulator's schema sees it: file, line, pod, key, and a close known key if any."""
    findings = inspect_fields(PODS, manifest, prune=False)
    meta = obj.get("metadata") or {}
    pod = f"pod {meta.get('namespace', 'default')}/{meta.get('name')}"
    problems: list[tuple[int, str]] = []
    for path in findings.unknown:
        tokens = _tokens(path)
        parent, key = _parent(obj, tokens), tokens[-1]
        where = path[: -len(key)].rstrip(".") or "the manifest"
        close = difflib.get_close_matches(key, _fields_at(tokens), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append((check.line(parent, key), f"{pod}: unknown key {key!r} in {where}{hint}"))
    for mismatch in findings.mismatches:
        tokens = _tokens(mismatch.path)
        parent = _parent(obj, tokens)
        expected = _ARTICLES.get(mismatch.expected, f"a {mismatch.expected}")
        if mismatch.go_type.endswith(".Quantity"):
            expected = "a quantity (a number, or a string such as 100m or 4Gi)"
        got = _ARTICLES.get(mismatch.json_type, f"a {mismatch.json_type}")
        problems.append(
            (
                check.line(parent, tokens[-1]),
                f"{pod}: {mismatch.path} must be {expected}, not {got}",
            )
        )
    if problems:
        line, message = min(problems, key=lambda p: p[0] or 1 << 30)
        where = f"{check.source}:{line}" if line else check.source
        raise ScenarioError(f"{where}: {message}")
