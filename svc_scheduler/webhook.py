"""The admission webhook: AdmissionReview v1 in and out, decisions from the core.

Every rule lives in `shared.core.webhook_rules`; this module adds what needs I/O (the namespace's
ResourceQuota limits, listed through the API server) and the wire shapes:

- `/webhook` (a MutatingWebhookConfiguration): refusals, or `allowed` with a base64 JSONPatch
  (`patchType: JSONPatch`) routing the pod to the numafit scheduler and normalising its GPU
  resources;
- `/validate` (a ValidatingWebhookConfiguration): the same refusals, never a patch (the API
  server rejects patches from validating webhooks). Running both catches annotations another
  mutating webhook adds after ours.

Only CREATE is judged; any other operation is allowed untouched (HAMi's rule for owned
annotations on update needs the caller's identity, which is the RBAC's job).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import orjson
from msgspec import field

from shared import subjects
from shared.core.config import CoreConfig
from shared.core.errors import CoreError
from shared.core.quota import QuotaLimit, limits_from_quotas
from shared.core.webhook_rules import (
    DEFAULT_SCHEDULER_NAME,
    WebhookDecision,
    asks_for_gpus,
    review_pod_creation,
)
from shared.service import kube_io
from svc_scheduler.extender_wire import NonEmpty, Wire, decode
from svc_scheduler.metrics import SchedulerMetrics

if TYPE_CHECKING:
    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.scheduler")

REVIEW_API_VERSION = "admission.k8s.io/v1"

QUOTA_LOOKUP_TIMEOUT = 2.0
"""Seconds the quota lookup may take: well under the API server's webhook timeout (10 s by
default), so a slow API answers the review (quota check skipped) instead of failing it."""

QuotaSource = Callable[[str], Awaitable[QuotaLimit | None]]
"""The explicit GPU quota limits of a namespace (None: no limits)."""


def kube_quota_source(kube: Kube, config: CoreConfig) -> QuotaSource:
    """Limits from the namespace's ResourceQuota objects. If they cannot be read the check is
    skipped (accounting still enforces quota when the pod is reserved)."""

    async def limits(namespace: str) -> QuotaLimit | None:
        if not subjects.valid_name(namespace):
            return None  # no such namespace can exist, so neither can its quota
        try:
            async with asyncio.timeout(QUOTA_LOOKUP_TIMEOUT):
                quotas = await kube.list_namespaced_resource_quotas(namespace)
            return limits_from_quotas(quotas, config).get(namespace)
        except (TimeoutError, kube_io.KubeError, CoreError) as exc:
            log.warning(
                "quota limits unavailable; admission quota check skipped",
                extra={"namespace": namespace, "error": str(exc)[:300] or "timed out"},
            )
            return None

    return limits


def parse_scheduler_names(values: Iterable[str]) -> tuple[str, ...]:
    """numafit's scheduler names from `values`, each one name or a comma-separated list, in
    order, without repeats; `ValueError` when there is none or one is no Kubernetes name (the
    API server refuses such a schedulerName, so no pod could ever carry it)."""
    names: dict[str, None] = {}
    for value in values:
        for part in value.split(","):
            name = part.strip()
            if not name:
                continue
            if not subjects.valid_name(name):
                raise ValueError(
                    f"scheduler name {subjects.shown(name)} is not a DNS-1123 subdomain"
                )
            names[name] = None
    if not names:
        raise ValueError("at least one scheduler name is needed")
    return tuple(names)


class PodWebhook:
    """Decides pod admissions; shared by the HTTP webhook and the emulator's hook."""

    def __init__(
        self,
        *,
        config: CoreConfig | None = None,
        scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER_NAME,),
        quota_source: QuotaSource | None = None,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.config = config or CoreConfig()
        self.scheduler_names = parse_scheduler_names(scheduler_names)
        """numafit's names: a GPU pod of the default scheduler gets the first."""
        self.quota_source = quota_source
        self.metrics = metrics or SchedulerMetrics()

    async def decide(self, operation: str, namespace: str, pod: Any) -> WebhookDecision:
        if operation != "CREATE":
            decision = WebhookDecision(True)
        else:
            limit = None
            source = self.quota_source
            if source is not None and isinstance(pod, Mapping) and asks_for_gpus(pod, self.config):
                limit = await source(namespace)
            decision = review_pod_creation(
                pod,
                namespace=namespace,
                config=self.config,
                scheduler_names=self.scheduler_names,
                quota=limit,
            )
        self._count(decision)
        if not decision.allowed:
            fields = {"namespace": namespace, "reason": decision.reason, "error": decision.message}
            log.info("pod refused", extra=fields)
        return decision

    def _count(self, decision: WebhookDecision) -> None:
        if not decision.allowed:
            self.metrics.webhook_total.labels("denied", decision.reason).inc()
        elif decision.patch:
            self.metrics.webhook_total.labels("mutated", decision.reason).inc()
        else:
            self.metrics.webhook_total.labels("allowed", decision.reason).inc()


class ReviewRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The parts of an AdmissionReview's `request` the webhook reads."""

    uid: NonEmpty
    operation: str
    namespace: str = ""
    object: Any = None
    """The Pod as sent (raw JSON), judged by the core."""


class Review(Wire, frozen=True, kw_only=True):
    """An AdmissionReview (its keys exactly as the API server writes them)."""

    WHAT: ClassVar[str] = "AdmissionReview"

    api_version: str = field(default=REVIEW_API_VERSION, name="apiVersion")
    request: ReviewRequest

    @property
    def uid(self) -> str:
        return self.request.uid

    @property
    def operation(self) -> str:
        return self.request.operation

    @property
    def object(self) -> Any:
        return self.request.object

    @property
    def namespace(self) -> str:
        """The request's namespace, else the Pod's, else `default`."""
        if self.request.namespace:
            return self.request.namespace
        pod = self.request.object
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
        return namespace if isinstance(namespace, str) and namespace else "default"


def parse_review(data: bytes) -> Review:
    """`BadInput` naming the field when `data` is no AdmissionReview."""
    return decode(data, Review, any_case=False)


def review_response(review: Review, decision: WebhookDecision, *, mutate: bool) -> dict[str, Any]:
    """The AdmissionReview answer; a patch only when `mutate` (mutating webhooks)."""
    response: dict[str, Any] = {"uid": review.uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "status": "Failure",
            "code": decision.code,
            "reason": "Forbidden" if decision.code == 403 else "BadRequest",
            "message": decision.message,
        }
    elif mutate and decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(decision.patch))).decode()
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}
