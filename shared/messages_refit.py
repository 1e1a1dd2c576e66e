"""The refit contract (device plugin -> svc_refit) on `numafit.refit.v1.<node>`: HAMi's
request and reply fields plus numafit's `mode`, `timeoutMs`, `code` and `fitReasons`, with
converters to and from the core's `RefitInput` and `RefitDecision`."""

from __future__ import annotations

from typing import ClassVar

from msgspec import UNSET, UnsetType, field

from shared.core import codec, keys
from shared.core import refit as core_refit
from shared.core.errors import CoreError
from shared.core.pods import Alignment, parse_alignment
from shared.messages_base import Int, Message, NonNegative, TimeoutMs


class RefitRequest(Message, frozen=True, kw_only=True, omit_defaults=False):
    """`numafit.refit.v1.<node>`: HAMi's fields plus `mode` and `timeoutMs`
    (docs/reference/messages.md).

    Every field may be absent, as a Go decoder would leave it: strings empty (refused later by
    the core as incomplete), `containerIndex` 0, no allowed devices, `mode` best-effort,
    `timeoutMs` 2000. Today's encoder writes every field but an empty `containerName`, so
    `containerName` is `UNSET` unless sent (use `container`)."""

    WHAT: ClassVar[str] = "refit request"

    pod_uid: str = field(default="", name="podUID")
    pod_namespace: str = ""
    pod_name: str = ""
    node_name: str = ""
    container_index: Int = 0
    device_type: str = ""
    allowed_device_uuids: tuple[str, ...] = field(default=(), name="allowedDeviceUUIDs")
    mode: str = Alignment.BEST_EFFORT.value
    """As sent: case and surrounding spaces are ignored (`alignment` is the parsed value)."""
    timeout_ms: TimeoutMs = keys.DEFAULT_REFIT_TIMEOUT_MS
    container_name: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        try:
            parse_alignment(self.mode)
        except CoreError:
            raise ValueError("mode must be 'best-effort' or 'strict'") from None

    @property
    def alignment(self) -> Alignment:
        return parse_alignment(self.mode) or Alignment.BEST_EFFORT

    @property
    def container(self) -> str:
        """`containerName`, empty when not sent."""
        return "" if isinstance(self.container_name, UnsetType) else self.container_name

    @classmethod
    def from_core(cls, request: core_refit.RefitInput) -> RefitRequest:
        """What `core_refit.RefitInput.to_json()` writes."""
        return cls(
            pod_uid=request.pod_uid,
            pod_namespace=request.pod_namespace,
            pod_name=request.pod_name,
            node_name=request.node_name,
            container_index=request.container_index,
            device_type=request.device_type,
            allowed_device_uuids=tuple(request.allowed_device_uuids),
            mode=request.mode.value,
            timeout_ms=request.timeout_ms,
            container_name=request.container_name or UNSET,
        )

    def to_core(self) -> core_refit.RefitInput:
        return core_refit.RefitInput(
            pod_uid=self.pod_uid,
            pod_namespace=self.pod_namespace,
            pod_name=self.pod_name,
            node_name=self.node_name,
            container_index=self.container_index,
            container_name=self.container,
            device_type=self.device_type,
            allowed_device_uuids=self.allowed_device_uuids,
            mode=self.alignment,
            timeout_ms=self.timeout_ms,
        )


class RefitReply(Message, frozen=True, kw_only=True):
    """HAMi's `succeeded`, `containerDevices` (on success) and `failureReason` (on failure),
    plus `code` and, when there are any, `fitReasons`."""

    WHAT: ClassVar[str] = "refit reply"

    succeeded: bool
    code: str
    """A `shared.codes.Code` value (kept a string: a newer service may send a new one)."""
    container_devices: str | None = None
    failure_reason: str | None = None
    fit_reasons: dict[str, NonNegative] | None = None

    @classmethod
    def from_decision(cls, decision: core_refit.RefitDecision) -> RefitReply:
        """What `RefitDecision.reply()` writes."""
        return cls(
            succeeded=decision.succeeded,
            code=decision.code.value,
            container_devices=(
                codec.encode_container(decision.container_devices) if decision.succeeded else None
            ),
            failure_reason=None if decision.succeeded else decision.failure_reason,
            fit_reasons=dict(sorted(decision.fit_reasons.items())) or None,
        )
