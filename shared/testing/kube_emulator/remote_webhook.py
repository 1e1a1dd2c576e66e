"""An admission hook that calls a webhook over HTTP(S), as the API server calls one.

`numafit run kube-emulator --admission-webhook URL` sends each pod CREATE/UPDATE as an
AdmissionReview v1 to URL, applies the returned JSONPatch and refuses the request when the
webhook answers `allowed: false`, with the webhook's message. A webhook that cannot be reached
fails the request (failurePolicy: Fail) unless the policy is Ignore.
"""

from __future__ import annotations

import base64
import uuid
from typing import TYPE_CHECKING

import aiohttp
import orjson

from .admission import AdmissionDenied, AdmissionHook, AdmissionRequest
from .patching import json_patch

if TYPE_CHECKING:
    from .objects import JSONDict


def remote_webhook(
    url: str,
    *,
    name: str = "remote.kube-emulator",
    timeout: float = 10.0,
    ignore_failure: bool = False,
) -> AdmissionHook:
    async def hook(request: AdmissionRequest) -> JSONDict | None:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": request.kind},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": request.namespace,
                "name": request.name,
                "operation": request.operation,
                "object": request.object,
                "oldObject": request.old_object,
                "dryRun": request.dry_run,
            },
        }
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.post(
                    url, data=orjson.dumps(review), headers={"Content-Type": "application/json"}
                ) as response,
            ):
                if response.status != 200:
                    raise RuntimeError(f"webhook {url} answered {response.status}")
                answer = orjson.loads(await response.read())
        except (aiohttp.ClientError, TimeoutError, RuntimeError, orjson.JSONDecodeError) as exc:
            if ignore_failure:
                return None
            raise RuntimeError(f"failed calling webhook {name!r}: {exc}") from exc
        result = answer.get("response") or {}
        if not result.get("allowed"):
            status = result.get("status") or {}
            raise AdmissionDenied(
                str(status.get("message", "denied")),
                webhook=name,
                code=int(status.get("code", 400)),
                reason=str(status.get("reason", "")),
            )
        patch = result.get("patch")
        if not patch or result.get("patchType") != "JSONPatch":
            return None
        operations = orjson.loads(base64.b64decode(patch))
        patched: JSONDict = json_patch(request.object, operations)
        return patched

    return hook
