"""The resources the emulator serves and, per resource, what the API server's strategy does.

A ResourceKind says where a resource lives (group/version, plural, namespaced, the store bucket),
which field selectors it supports, and the parts of its upstream "strategy" that clients can
observe: defaulting, what create resets, validation, and how it is stored. Core Events and
events.k8s.io/v1 Events share one bucket, as upstream stores both versions as one object; the
latter is converted on the way in and out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.core.errors import RequestError
from shared.core.quantity import parse_quantity

from .errors import FieldError
from .objects import JSONDict, child, metadata

if TYPE_CHECKING:
    from fractions import Fraction

FieldGetter = Callable[[JSONDict], str]
Validator = Callable[[JSONDict], list[FieldError]]


def _no_errors(_: JSONDict) -> list[FieldError]:
    return []


def _no_update_errors(_new: JSONDict, _old: JSONDict) -> list[FieldError]:
    return []


def _unchanged(obj: JSONDict) -> JSONDict:
    return obj


def _nothing(_: JSONDict) -> None:
    return None


@dataclass(frozen=True)
class ResourceKind:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    bucket: str
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    """Discovery categories (`kubectl get all` lists the kinds in "all")."""
    subresources: frozenset[str] = frozenset()
    fields: Mapping[str, FieldGetter] = field(default_factory=dict)
    apply_defaults: Callable[[JSONDict], None] = _nothing
    """Defaulting, applied before admission as upstream's decoder does."""
    prepare_for_create: Callable[[JSONDict], None] = _nothing
    """What create resets after admission (upstream PrepareForCreate), e.g. a pod's status."""
    validate_create: Validator = _no_errors
    validate_update: Callable[[JSONDict, JSONDict], list[FieldError]] = _no_update_errors
    to_storage: Callable[[JSONDict], JSONDict] = _unchanged
    from_storage: Callable[[JSONDict], JSONDict] = _unchanged
    custom: bool = False
    """A CustomResourceDefinition upstream: its OpenAPI schema is its validation (types and
    required fields, checked by field_validation.py), and it has no other."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        """Whether .status is written only through the status subresource."""
        return "status" in self.subresources

    def field_values(self, stored: JSONDict) -> dict[str, str]:
        """The selectable fields of a stored object, as strings."""
        meta = metadata(stored)
        values = {
            "metadata.name": str(meta.get("name", "")),
            "metadata.namespace": str(meta.get("namespace", "")),
        }
        for name, getter in self.fields.items():
            values[name] = getter(stored)
        return values

    def supported_fields(self) -> Mapping[str, object]:
        return {"metadata.name": None, "metadata.namespace": None, **self.fields}


def _path(*keys: str) -> FieldGetter:
    def get(obj: JSONDict) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


def _bool_path(*keys: str) -> FieldGetter:
    getter = _path(*keys)
    return lambda obj: getter(obj) or "false"


# --- pods --------------------------------------------------------------------------------------


def _default_pod(pod: JSONDict) -> None:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for section in ("initContainers", "containers"):
        for container in spec.get(section) or []:
            if isinstance(container, dict):
                _default_requests_from_limits(container)
                for port in container.get("ports") or []:
                    if isinstance(port, dict):
                        port.setdefault("protocol", "TCP")


def _default_requests_from_limits(container: JSONDict) -> None:
    # Upstream SetDefaults_Pod: a resource with a limit and no request requests its limit.
    # Device plugins and schedulers read requests, so this is visible to GPU sharing.
    resources = container.get("resources")
    if not isinstance(resources, dict) or not isinstance(resources.get("limits"), dict):
        return
    requests = resources.setdefault("requests", {})
    if isinstance(requests, dict):
        for name, quantity in resources["limits"].items():
            requests.setdefault(name, quantity)


def _reset_pod_status(pod: JSONDict) -> None:
    # Upstream PrepareForCreate discards any status a client sends: status is the kubelet's.
    pod["status"] = {"phase": "Pending"}


def _validate_pod_create(pod: JSONDict) -> list[FieldError]:
    errors = []
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [FieldError("spec", "required")]
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append(FieldError("spec.containers", "required"))
    seen: set[str] = set()
    for section in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(section) or []):
            where = f"spec.{section}[{index}]"
            name = container.get("name") if isinstance(container, dict) else None
            if not name:
                errors.append(FieldError(f"{where}.name", "required"))
            elif name in seen:
                errors.append(FieldError(f"{where}.name", "invalid", "Duplicate value", name))
            else:
                seen.add(name)
            if isinstance(container, dict) and not container.get("image"):
                errors.append(FieldError(f"{where}.image", "required"))
            if isinstance(container, dict) and isinstance(container.get("resources"), dict):
                errors.extend(_resource_errors(container["resources"], f"{where}.resources"))
    return errors


_NEGATIVE_RULE = "must be greater than or equal to 0"
_LIMIT_RULE = "Limit must be set for non overcommitable resources"


def _resource_errors(resources: JSONDict, where: str) -> list[FieldError]:
    """Upstream ValidateResourceRequirements, the parts about quantities: none negative, a
    request at most its limit, and for a resource that cannot be overcommitted (an extended
    one such as nvidia.com/gpu, or hugepages) a request equal to its limit, which must exist.
    It runs after defaulting, so a limit given alone has already become the request too."""
    limits, requests = resources.get("limits"), resources.get("requests")
    limits = limits if isinstance(limits, dict) else {}
    requests = requests if isinstance(requests, dict) else {}
    errors = []
    for name, raw in limits.items():
        value = _quantity(raw)
        if value is not None and value < 0:
            errors.append(
                FieldError(f"{where}.limits[{name}]", "invalid", _NEGATIVE_RULE, _text(raw))
            )
    for name, raw in requests.items():
        value = _quantity(raw)
        if value is not None and value < 0:
            errors.append(
                FieldError(f"{where}.requests[{name}]", "invalid", _NEGATIVE_RULE, _text(raw))
            )
        if name not in limits:
            if not _overcommit_allowed(name):
                errors.append(FieldError(f"{where}.limits", "required", _LIMIT_RULE))
            continue
        limit = _quantity(limits[name])
        if value is None or limit is None:
            continue
        # Upstream reports these on the requests field itself, not on the resource's key.
        shown_limit = _text(limits[name])
        if value != limit and not _overcommit_allowed(name):
            rule = f"must be equal to {name} limit of {shown_limit}"
            errors.append(FieldError(f"{where}.requests", "invalid", rule, _text(raw)))
        elif value > limit:
            rule = f"must be less than or equal to {name} limit of {shown_limit}"
            errors.append(FieldError(f"{where}.requests", "invalid", rule, _text(raw)))
    return errors


def _quantity(raw: object) -> Fraction | None:
    """The quantity's exact value; None for one that does not parse (upstream refuses those
    while decoding, before validation: not emulated)."""
    try:
        return parse_quantity(raw)
    except RequestError:
        return None


def _text(raw: object) -> str:
    # Upstream prints the canonical form (Quantity.String()); the value as written is the
    # same for the plain integers GPU resources use.
    return raw.strip() if isinstance(raw, str) else str(raw)


def _overcommit_allowed(name: str) -> bool:
    """Upstream IsOvercommitAllowed: a native resource (no domain, or a kubernetes.io one)
    other than hugepages."""
    native = "/" not in name or "kubernetes.io/" in name
    return native and not name.startswith("hugepages-")


_POD_SPEC_UPDATE_RULE = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
    "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
    "(allow it to be set to 1 if it was previously negative)"
)


def _validate_pod_update(new: JSONDict, old: JSONDict) -> list[FieldError]:
    # Upstream ValidatePodUpdate: a pod's spec is immutable apart from a few fields, and
    # spec.nodeName in particular is set only by the binding subresource.
    if _mutable_spec_stripped(child(new, "spec")) != _mutable_spec_stripped(child(old, "spec")):
        return [FieldError("spec", "forbidden", _POD_SPEC_UPDATE_RULE)]
    return []


def _mutable_spec_stripped(spec: JSONDict) -> JSONDict:
    stripped = {
        key: value
        for key, value in spec.items()
        if key
        not in (
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
            "schedulingGates",
        )
    }
    for section in ("initContainers", "containers"):
        if isinstance(stripped.get(section), list):
            stripped[section] = [
                {k: v for k, v in container.items() if k != "image"}
                if isinstance(container, dict)
                else container
                for container in stripped[section]
            ]
    return stripped


PODS = ResourceKind(
    group="",
    version="v1",
    plural="pods",
    singular="pod",
    kind="Pod",
    namespaced=True,
    bucket="pods",
    short_names=("po",),
    categories=("all",),
    subresources=frozenset({"status", "binding"}),
    fields={
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": _bool_path("spec", "hostNetwork"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    apply_defaults=_default_pod,
    prepare_for_create=_reset_pod_status,
    validate_create=_validate_pod_create,
    validate_update=_validate_pod_update,
)

# --- nodes, namespaces, resource quotas ----------------------------------------------------------

NODES = ResourceKind(
    group="",
    version="v1",
    plural="nodes",
    singular="node",
    kind="Node",
    namespaced=False,
    bucket="nodes",
    short_names=("no",),
    subresources=frozenset({"status"}),
    fields={"spec.unschedulable": _bool_path("spec", "unschedulable")},
)


def _prepare_namespace(namespace: JSONDict) -> None:
    meta = metadata(namespace)
    labels = meta.setdefault("labels", {})
    if isinstance(labels, dict):
        labels["kubernetes.io/metadata.name"] = meta.get("name", "")
    spec = namespace.setdefault("spec", {})
    if isinstance(spec, dict):
        spec.setdefault("finalizers", ["kubernetes"])
    namespace["status"] = {"phase": "Active"}


NAMESPACES = ResourceKind(
    group="",
    version="v1",
    plural="namespaces",
    singular="namespace",
    kind="Namespace",
    namespaced=False,
    bucket="namespaces",
    short_names=("ns",),
    subresources=frozenset({"status"}),
    fields={"status.phase": _path("status", "phase")},
    prepare_for_create=_prepare_namespace,
)

# No quota controller runs here, so a ResourceQuota's status is whatever its writer sets
# (upstream would reset it on create and let the controller fill hard/used).
RESOURCE_QUOTAS = ResourceKind(
    group="",
    version="v1",
    plural="resourcequotas",
    singular="resourcequota",
    kind="ResourceQuota",
    namespaced=True,
    bucket="resourcequotas",
    short_names=("quota",),
    subresources=frozenset({"status"}),
)

# --- events (core/v1 and events.k8s.io/v1, one stored object) ----------------------------------


def _validate_core_event(event: JSONDict) -> list[FieldError]:
    errors = _event_namespace_errors(event, "involvedObject")
    if event.get("eventTime"):
        # Upstream: an event with eventTime is a "new" event and needs the new fields.
        for key in ("reportingComponent", "reportingInstance", "action", "reason"):
            if not event.get(key):
                errors.append(FieldError(_V1_NAMES.get(key, key), "required"))
    return errors


def _validate_events_v1(event: JSONDict) -> list[FieldError]:
    errors = _event_namespace_errors(event, "regarding")
    for key in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
        if not event.get(key):
            errors.append(FieldError(key, "required"))
    if event.get("type") not in ("Normal", "Warning"):
        errors.append(
            FieldError(
                "type",
                "not_supported",
                'supported values: "Normal", "Warning"',
                event.get("type", ""),
            )
        )
    return errors


def _event_namespace_errors(event: JSONDict, reference: str) -> list[FieldError]:
    namespace = metadata(event).get("namespace", "")
    regarding_namespace = child(event, reference).get("namespace", "")
    if regarding_namespace and regarding_namespace != namespace:
        return [
            FieldError(
                f"{reference}.namespace",
                "invalid",
                "does not match event.namespace",
                regarding_namespace,
            )
        ]
    return []


# core/v1 Event field -> events.k8s.io/v1 Event field, where the names differ.
_V1_NAMES = {
    "involvedObject": "regarding",
    "message": "note",
    "reportingComponent": "reportingController",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
}
_CORE_NAMES = {v1: core for core, v1 in _V1_NAMES.items()}


def _events_v1_to_core(event: JSONDict) -> JSONDict:
    converted = {_CORE_NAMES.get(key, key): value for key, value in event.items()}
    converted.update(apiVersion="v1", kind="Event")
    return converted


def _core_to_events_v1(event: JSONDict) -> JSONDict:
    converted = {_V1_NAMES.get(key, key): value for key, value in event.items()}
    converted.update(apiVersion="events.k8s.io/v1", kind="Event")
    return converted


_EVENT_FIELDS: dict[str, FieldGetter] = {
    f"involvedObject.{name}": _path("involvedObject", name)
    for name in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
} | {
    "reason": _path("reason"),
    "reportingComponent": _path("reportingComponent"),
    "source": _path("source", "component"),
    "type": _path("type"),
}

EVENTS = ResourceKind(
    group="",
    version="v1",
    plural="events",
    singular="event",
    kind="Event",
    namespaced=True,
    bucket="events",
    short_names=("ev",),
    fields=_EVENT_FIELDS,
    validate_create=_validate_core_event,
)

EVENTS_V1 = ResourceKind(
    group="events.k8s.io",
    version="v1",
    plural="events",
    singular="event",
    kind="Event",
    namespaced=True,
    bucket="events",
    short_names=("ev",),
    fields=_EVENT_FIELDS,
    validate_create=_validate_events_v1,
    to_storage=_events_v1_to_core,
    from_storage=_core_to_events_v1,
)

# --- config maps -------------------------------------------------------------------------------

_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_CONFIG_KEY_RULE = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is "
    "'[-._a-zA-Z0-9]+')"
)


def _validate_config_map(config_map: JSONDict) -> list[FieldError]:
    errors = []
    seen: set[str] = set()
    for section in ("data", "binaryData"):
        for key in child(config_map, section):
            where = f"{section}[{key}]"
            if len(key) > 253 or not _CONFIG_KEY.match(key):
                errors.append(FieldError(where, "invalid", _CONFIG_KEY_RULE, key))
            elif key in seen:
                errors.append(FieldError(where, "invalid", "duplicate of key present in data", key))
            seen.add(key)
    return errors


def _validate_config_map_update(new: JSONDict, old: JSONDict) -> list[FieldError]:
    errors = _validate_config_map(new)
    if old.get("immutable") is True:
        for section in ("data", "binaryData", "immutable"):
            if new.get(section) != old.get(section):
                errors.append(
                    FieldError(section, "forbidden", "field is immutable when `immutable` is set")
                )
    return errors


CONFIG_MAPS = ResourceKind(
    group="",
    version="v1",
    plural="configmaps",
    singular="configmap",
    kind="ConfigMap",
    namespaced=True,
    bucket="configmaps",
    short_names=("cm",),
    validate_create=_validate_config_map,
    validate_update=_validate_config_map_update,
)

# --- NodeResourceTopology (topology.node.k8s.io/v1alpha2, a CRD upstream) ----------------------

NODE_RESOURCE_TOPOLOGIES = ResourceKind(
    group="topology.node.k8s.io",
    version="v1alpha2",
    plural="noderesourcetopologies",
    singular="noderesourcetopology",
    kind="NodeResourceTopology",
    namespaced=False,
    bucket="noderesourcetopologies",
    short_names=("node-res-topo",),
    custom=True,
)

ALL: tuple[ResourceKind, ...] = (
    PODS,
    NODES,
    NAMESPACES,
    RESOURCE_QUOTAS,
    CONFIG_MAPS,
    EVENTS,
    EVENTS_V1,
    NODE_RESOURCE_TOPOLOGIES,
)

BY_PATH: dict[tuple[str, str], ResourceKind] = {
    (kind.api_version, kind.plural): kind for kind in ALL
}
"""(group/version, plural) -> kind: how a request path finds its resource."""
