"""numafit's pod admission webhook, plugged into the emulator in process.

A real API server calls svc_scheduler's `/webhook` over HTTPS on every pod creation; the
emulator calls an AdmissionHook instead. This adapter runs the same decision (anything with
svc_scheduler's `PodWebhook.decide`), refuses with the same message (AdmissionDenied carries
it into the API's Status, as a webhook denial would) and applies the same JSON Patch, so
`numafit simulate` and tests admit pods exactly as a cluster with the webhook installed would.

The decider is taken by its shape (WebhookDecider) so that the emulator imports no service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .admission import AdmissionDenied, AdmissionHook, AdmissionRequest
from .patching import json_patch

if TYPE_CHECKING:
    from shared.core.webhook_rules import WebhookDecision

    from .objects import JSONDict

WEBHOOK_NAME = "pods.numafit-scheduler.numafit.io"
"""The webhook name the API server would quote ("admission webhook ... denied the request")."""
EXCLUDED_NAMESPACES = frozenset({"kube-system"})
"""Namespaces the API server never sends to the webhook: the svc-scheduler chart's default
`webhooks.excludeNamespaces` (its namespaceSelector; the release namespace is added there, and
numafit's own services run as no pods here). A pod in them is admitted untouched, as on a
cluster (seen on the real tier: an init container asking for a whole GPU runs there, while the
webhook elsewhere gives it gpucores)."""


class WebhookDecider(Protocol):
    """What the hook needs of svc_scheduler's PodWebhook."""

    async def decide(self, operation: str, namespace: str, pod: Any) -> WebhookDecision: ...


def emulator_admission_hook(
    admission: WebhookDecider,
    webhook: str = WEBHOOK_NAME,
    excluded_namespaces: frozenset[str] = EXCLUDED_NAMESPACES,
) -> AdmissionHook:
    """An emulator AdmissionHook running `admission` (mutation and validation in one pass) on
    pods outside `excluded_namespaces`."""

    async def hook(request: AdmissionRequest) -> JSONDict | None:
        if request.namespace in excluded_namespaces:
            return None  # the namespaceSelector leaves it out: the webhook is never called
        decision = await admission.decide(request.operation, request.namespace, request.object)
        if not decision.allowed:
            raise AdmissionDenied(
                decision.message,
                webhook=webhook,
                code=decision.code,
                reason="Forbidden" if decision.code == 403 else "BadRequest",
            )
        if not decision.patch:
            return None
        patched: JSONDict = json_patch(request.object, list(decision.patch))
        return patched

    return hook
