"""The webhook, plugged into the Kubernetes API emulator in process.

A real API server calls `/webhook` over HTTPS on every pod creation; the emulator calls an
AdmissionHook instead. This adapter runs the same PodAdmission decision, refuses with the same
message (AdmissionDenied carries it into the API's Status, as a webhook denial would) and
applies the same JSON Patch, so `numafit simulate` and tests admit pods exactly as a cluster
with the webhook installed would.
"""

from __future__ import annotations

from shared.kube_emulator import AdmissionDenied, AdmissionHook, AdmissionRequest
from shared.kube_emulator.objects import JSONDict
from shared.kube_emulator.patching import json_patch
from svc_scheduler.webhook import PodAdmission

WEBHOOK_NAME = "pods.numafit-scheduler.numafit.io"
"""The webhook name the API server would quote ("admission webhook ... denied the request")."""


def emulator_admission_hook(admission: PodAdmission, webhook: str = WEBHOOK_NAME) -> AdmissionHook:
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
