"""pods/binding's rules, apart from the registry's storage: what a Binding must say, which
pods refuse one, and what binding does to the pod (spec.nodeName, PodScheduled, the Binding's
annotations and labels). Pure functions over JSON; the registry reads and stores."""

from __future__ import annotations

from . import errors
from .errors import FieldError
from .objects import JSONDict, now_rfc3339


def check_preconditions(
    preconditions: JSONDict, meta: JSONDict, plural: str, name: str, group: str = ""
) -> None:
    """The uid/resourceVersion preconditions of a write (a delete's, a Binding's metadata):
    a conflict when one is given and the stored object's differs."""
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(field)
        if wanted and wanted != meta.get(field):
            raise errors.conflict(
                plural,
                name,
                f"Precondition failed: {label} in precondition: {wanted}, "
                f"{label} in object meta: {meta.get(field)}",
                group,
            )


def check_target(target: JSONDict, name: str) -> None:
    """A Binding's target must name a Node."""
    problems = []
    if target.get("kind", "") not in ("", "Node"):
        problems.append(
            FieldError(
                "target.kind",
                "not_supported",
                'supported values: "Node", "<empty>"',
                target["kind"],
            )
        )
    if not target.get("name"):
        problems.append(FieldError("target.name", "required"))
    if problems:
        raise errors.invalid("Binding", name, problems)


def check_bindable(pod_meta: JSONDict, spec: JSONDict, name: str) -> None:
    """A pod being deleted, already on a node or still gated refuses a Binding."""
    refusal = None
    if pod_meta.get("deletionTimestamp"):
        refusal = f"pod {name} is being deleted, cannot be assigned to a host"
    elif spec.get("nodeName"):
        refusal = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
    elif spec.get("schedulingGates"):
        refusal = f"pod {name} has non-empty .spec.schedulingGates"
    if refusal:
        raise errors.conflict("pods/binding", name, refusal)


def bind_pod(pod: JSONDict, pod_meta: JSONDict, binding_meta: JSONDict, node: str) -> None:
    """Place the pod on `node`: spec.nodeName, the Binding's annotations and labels merged over
    the pod's, PodScheduled true."""
    pod.setdefault("spec", {})["nodeName"] = node
    for section in ("annotations", "labels"):
        extra = binding_meta.get(section)
        if isinstance(extra, dict) and extra:
            existing = pod_meta.get(section)
            pod_meta[section] = {**(existing if isinstance(existing, dict) else {}), **extra}
    set_condition(pod.setdefault("status", {}), {"type": "PodScheduled", "status": "True"})


def set_condition(status: JSONDict, condition: JSONDict) -> None:
    """Set a condition by type, stamping lastTransitionTime when its status changes."""
    conditions = status.setdefault("conditions", [])
    for existing in conditions:
        if existing.get("type") == condition["type"]:
            if existing.get("status") != condition["status"]:
                existing["lastTransitionTime"] = now_rfc3339()
            existing.update(condition)
            return
    conditions.append({**condition, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()})
