"""The screen of a refit request before anything is asked of anyone: nothing from a request
becomes a subject, an API path, a log line or a reply text unchecked or unbounded, and a node
asks only on its own subject."""

from __future__ import annotations

from shared import subjects
from shared.codes import Code
from shared.core.refit import RefitDecision, RefitInput, refused

MAX_DEVICE_TYPE = 64


def screen(request: RefitInput, token: str) -> RefitDecision | None:
    """Refuse what must not go further: names that could not be subjects (or API paths), and
    anything the core would echo unbounded. Empty fields are left to the core ("incomplete")."""
    if not subjects.valid_token(token):
        return refused(
            Code.INVALID_REQUEST,
            f"subject token {subjects.shown(token)} is not a node name's token",
            event=False,
        )
    for value, what in (
        (request.node_name, "nodeName"),
        (request.pod_namespace, "podNamespace"),
        (request.pod_name, "podName"),
        (request.container_name, "containerName"),
    ):
        if value and not subjects.valid_name(value):
            return refused(
                Code.INVALID_REQUEST,
                f"{what} {subjects.shown(value)} is not a Kubernetes name",
                event=False,
            )
    if request.pod_uid and not subjects.valid_uid(request.pod_uid):
        return refused(
            Code.INVALID_REQUEST,
            f"podUID {subjects.shown(request.pod_uid)} is not a Kubernetes UID",
            event=False,
        )
    if len(request.device_type) > MAX_DEVICE_TYPE:
        return refused(
            Code.UNKNOWN_DEVICE_TYPE,
            f"unknown device type {subjects.shown(request.device_type)}",
            event=False,
        )
    if request.node_name and subjects.node_token(request.node_name) != token:
        # A node may only ask on its own subject (per-node NATS permissions rely on it).
        return refused(
            Code.UNAUTHORIZED,
            f"request for node {request.node_name} arrived on the subject of {token}",
            event=False,
        )
    return None
