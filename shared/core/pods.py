"""A Pod, reduced to what the rules need, parsed from a Kubernetes Pod dict.

Container positions follow HAMi's layout: every `spec.initContainers` entry first (regular and
sidecar alike, in declaration order), then `spec.containers`. Classification uses the position
*and* the spec (reference e.1), never the position alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.core.errors import AnnotationError, ObjectError, shown
from shared.core.keys import NUMA_ALIGNMENT, VGPU_NODE
from shared.core.model import ContainerKind

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container's name, phase class and GPU-relevant resources."""

    name: str
    kind: ContainerKind
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a Pod the core reads."""

    uid: str
    namespace: str
    name: str
    resource_version: str
    node_name: str
    phase: str
    annotations: Mapping[str, str]
    containers: tuple[ContainerSpec, ...]
    init_exit_codes: Mapping[str, int]
    """Exit code per init container name that has terminated."""
    deleting: bool = False

    @property
    def kinds(self) -> tuple[ContainerKind, ...]:
        return tuple(c.kind for c in self.containers)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def scheduled_node(self) -> str:
        """The node the scheduler chose (`hami.io/vgpu-node`), else where the pod is bound."""
        return self.annotations.get(VGPU_NODE) or self.node_name

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def init_released(self) -> bool:
        """Reference e.4: every non-sidecar init container terminated with exit code 0.

        A pod with only sidecars passes at once; a pod with no init containers never does.
        """
        inits = [c for c in self.containers if c.kind is not ContainerKind.APP]
        if not inits:
            return False
        regular = [c for c in inits if c.kind is ContainerKind.INIT]
        return all(self.init_exit_codes.get(c.name) == 0 for c in regular)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{where} must be an object")
    return value


def _string(value: Any, where: str, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise ObjectError(f"{where} must be a string")
    return value


def _containers(spec: Mapping[str, Any], key: str, init: bool, pod: str) -> list[ContainerSpec]:
    items = spec.get(key) or []
    if not isinstance(items, list):
        raise ObjectError(f"pod {pod}: spec.{key} must be a list")
    result = []
    for i, item in enumerate(items):
        where = f"pod {pod}: spec.{key}[{i}]"
        if not isinstance(item, Mapping):
            raise ObjectError(f"{where} must be an object")
        name = _string(item.get("name"), f"{where}.name")
        resources = _mapping(item.get("resources"), f"{where}.resources")
        if not init:
            kind = ContainerKind.APP
        elif item.get("restartPolicy") == "Always":
            kind = ContainerKind.SIDECAR
        else:
            kind = ContainerKind.INIT
        result.append(
            ContainerSpec(
                name=name,
                kind=kind,
                limits=_mapping(resources.get("limits"), f"{where}.resources.limits"),
                requests=_mapping(resources.get("requests"), f"{where}.resources.requests"),
            )
        )
    return result


def pod_from_object(obj: Any) -> PodInfo:
    """Parse a Kubernetes Pod dict; raise ObjectError naming what is missing or mistyped."""
    if not isinstance(obj, Mapping):
        raise ObjectError("pod must be an object")
    meta = _mapping(obj.get("metadata"), "pod metadata")
    name = _string(meta.get("name"), "pod metadata.name")
    uid = _string(meta.get("uid"), f"pod {name or '?'}: metadata.uid")
    if not uid:
        raise ObjectError(f"pod {name or '?'} has no metadata.uid")
    namespace = _string(meta.get("namespace"), f"pod {name}: metadata.namespace", "default")
    annotations = _mapping(meta.get("annotations"), f"pod {name}: metadata.annotations")
    for key, value in annotations.items():
        if not isinstance(value, str):
            raise ObjectError(f"pod {name}: annotation {key!r} must be a string")
    spec = _mapping(obj.get("spec"), f"pod {name}: spec")
    status = _mapping(obj.get("status"), f"pod {name}: status")
    exit_codes: dict[str, int] = {}
    statuses = status.get("initContainerStatuses") or []
    if not isinstance(statuses, list):
        raise ObjectError(f"pod {name}: status.initContainerStatuses must be a list")
    for entry in statuses:
        if not isinstance(entry, Mapping):
            raise ObjectError(f"pod {name}: initContainerStatuses entries must be objects")
        state = _mapping(entry.get("state"), f"pod {name}: initContainerStatuses state")
        terminated = state.get("terminated")
        if isinstance(terminated, Mapping):
            code = terminated.get("exitCode")
            if isinstance(code, int) and not isinstance(code, bool):
                exit_codes[_string(entry.get("name"), "initContainerStatuses name")] = code
    return PodInfo(
        uid=uid,
        namespace=namespace,
        name=name,
        resource_version=_string(meta.get("resourceVersion"), f"pod {name}: resourceVersion"),
        node_name=_string(spec.get("nodeName"), f"pod {name}: spec.nodeName"),
        phase=_string(status.get("phase"), f"pod {name}: status.phase", "Pending"),
        annotations=dict(annotations),
        containers=tuple(
            _containers(spec, "initContainers", True, name)
            + _containers(spec, "containers", False, name)
        ),
        init_exit_codes=exit_codes,
        deleting=meta.get("deletionTimestamp") is not None,
    )


class Alignment(enum.Enum):
    """The refit opt-in of `hami.io/numa-alignment`."""

    BEST_EFFORT = "best-effort"
    STRICT = "strict"


def parse_alignment(value: str | None) -> Alignment | None:
    """Case-insensitive, surrounding whitespace ignored; absent means none; anything else is an
    error (an explicitly empty value and `true` included)."""
    if value is None:
        return None
    normalized = value.strip().lower()
    for mode in Alignment:
        if normalized == mode.value:
            return mode
    raise AnnotationError(
        f"{NUMA_ALIGNMENT} value {shown(value)} is invalid: use 'best-effort' or 'strict'"
    )
