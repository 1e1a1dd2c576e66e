"""numafit's pod admission webhook, plugged into the emulator in process.

A real API server calls svc_scheduler's `/webhook` over HTTPS on every pod creation; the
emulator calls an AdmissionHook instead. This adapter runs the same decision (anything with
svc_scheduler's `PodAdmission.decide`), refuses with the same message (AdmissionDenied carries
it into the API's Status, as a webhook denial would) and applies the same JSON Patch, so
`numafit simulate` and tests admit pods exactly as a cluster with the webhook installed would.

The decider is taken by its shape (AdmissionDecider) so that the emulator imports no service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .admission import AdmissionDenied, AdmissionHook, AdmissionRequest
from .patching import json_patch

if TYPE_CHECKING:
    from shared.core.admission import AdmissionDecision

    from .objects import JSONDict

WEBHOOK_NAME = "pods.numafit-scheduler.numafit.io"
"""The webhook name the API server would quote ("admission webhook ... denied the request")."""


class AdmissionDecider(Protocol):
    """What the hook needs of svc_scheduler's PodAdmission."""

    async def decide(self, operation: str, namespace: str, pod: Any) -> AdmissionDecision: ...


def emulator_admission_hook(
    admission: AdmissionDecider, webhook: str = WEBHOOK_NAME
) -> AdmissionHook:
    """An emulator AdmissionHook running `admission` (mutation and validation in one pass)."""

    async def hook(request: AdmissionRequest) -> JSONDict | None:
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
