"""The plugin's decisions at admission: preferred replicas (with the NUMA refit) and Allocate.

kubelet calls GetPreferredAllocation with the replicas its Topology Manager allows. The ledger
(accounting's `pending`) says which GPUs the scheduler reserved for the container being
admitted; if one has no allowed replica (the *mismatch*) and the pod opted in with
`hami.io/numa-alignment`, one refit request goes to svc_refit with a 2 s budget. Modes
(reference (h)): best-effort falls back to kubelet's own choice on refusal, no responders or
timeout; strict fails the admission; a committed refit whose reply cannot be mapped to
kubelet's replicas fails in both modes (the move already happened).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.client import Client

from shared import subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.pods import Alignment, parse_alignment
from shared.core.refit import RefitRequest
from shared.core.replicas import ReplicaMismatch, SelectionError, physical_ids, select_replicas
from shared.wire import WireError, dumps, loads_object
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.environment import ContainerAllocation, container_allocation
from svc_deviceplugin.metrics import PluginMetrics

log = logging.getLogger("numafit.deviceplugin")


class AdmissionRefused(Exception):
    """Fail this kubelet call (kubelet reports UnexpectedAdmissionError)."""

    def __init__(self, message: str, *, invalid_argument: bool = False) -> None:
        super().__init__(message)
        self.invalid_argument = invalid_argument


@dataclass(frozen=True, slots=True)
class ContainerPreference:
    available: Sequence[str]
    required: Sequence[str]
    size: int


class Allocator:
    def __init__(
        self,
        config: PluginConfig,
        nc: Client,
        metrics: PluginMetrics,
        known_gpus: frozenset[str],
    ) -> None:
        self.config = config
        self.nc = nc
        self.accounting = AccountingClient(nc, config.accounting_timeout)
        self.metrics = metrics
        self.known = known_gpus
        self.fallbacks: set[tuple[str, int]] = set()
        """(pod UID, container index) admitted on kubelet's choice after a best-effort
        fallback; pending Allocate, then counted as misaligned."""
        self.misaligned: set[tuple[str, str]] = set()
        self.outcomes: dict[tuple[str, int], str] = {}
        """The refit outcome per (pod UID, container index), as `numafit simulate` reports it:
        none, moved, already_aligned, fallback, refused:<code>, timeout, strict_failed."""

    # --- GetPreferredAllocation -------------------------------------------------------------

    async def preferred(self, requests: Sequence[ContainerPreference]) -> list[list[str]]:
        """Preferred replica IDs per container request (empty = let kubelet choose)."""
        try:
            pending = await self.accounting.call("pending", self.config.node, {})
        except AccountingUnavailable as exc:
            log.warning("no preference: accounting unreachable", extra={"error": str(exc)})
            return [[] for _ in requests]
        pod = pending.get("pod")
        if not pending.get("ok") or not isinstance(pod, dict):
            return [[] for _ in requests]
        entries = pod.get("entries") or []
        answers = []
        for k, request in enumerate(requests):
            entry = entries[k] if k < len(entries) else None
            answers.append(await self._prefer_one(pod, entry, request) if entry else [])
        return answers

    async def _prefer_one(
        self, pod: dict[str, Any], entry: dict[str, Any], request: ContainerPreference
    ) -> list[str]:
        where = {"pod": f"{pod['namespace']}/{pod['name']}", "container": entry["index"]}
        try:
            desired = [d.uuid for d in codec.decode_container(entry["devices"])]
            selection = select_replicas(
                request.available, request.required, desired, request.size, self.known
            )
        except ReplicaMismatch as mismatch:
            return await self._mismatch(pod, entry, request, mismatch, where)
        except (SelectionError, CoreError) as exc:
            log.info("no preference", extra={**where, "error": str(exc)})
            return []
        self.metrics.refits.labels(_mode_label(pod), "no_mismatch").inc()
        self.outcomes[(pod["uid"], entry["index"])] = "none"
        return selection

    async def _mismatch(
        self,
        pod: dict[str, Any],
        entry: dict[str, Any],
        request: ContainerPreference,
        mismatch: ReplicaMismatch,
        where: dict[str, Any],
    ) -> list[str]:
        try:
            mode = parse_alignment(pod.get("numaAlignment"))
        except CoreError:
            log.warning(
                "ignoring invalid numa-alignment annotation",
                extra={**where, "value": pod.get("numaAlignment")},
            )
            mode = None
        if mode is None or not self.config.refit_enabled or self.config.mig_mode:
            log.info("mismatch, no refit", extra={**where, "error": str(mismatch)})
            self.metrics.refits.labels("none", "not_opted_in").inc()
            self.outcomes[(pod["uid"], entry["index"])] = "none"
            return []
        log.info("mismatch, asking for a refit", extra={**where, "mode": mode.value})
        refit = RefitRequest(
            pod_uid=pod["uid"],
            pod_namespace=pod["namespace"],
            pod_name=pod["name"],
            node_name=self.config.node,
            container_index=entry["index"],
            container_name=entry.get("containerName", ""),
            device_type=keys.NVIDIA,
            allowed_device_uuids=tuple(codec.unique_physical_ids(request.available, self.known)),
            mode=mode,
            timeout_ms=self.config.refit_timeout_ms,
        )
        started = time.perf_counter()
        reply, failure, timed_out = await self._ask(refit)
        self.metrics.refit_duration.observe(time.perf_counter() - started)
        if reply is not None and reply.get("succeeded") is True:
            return await self._map_committed(pod, entry, request, reply, mode, where)
        cause = failure or str(reply.get("failureReason", "refused") if reply else "refused")
        result = "timeout" if timed_out else None
        key = (pod["uid"], entry["index"])
        if mode is Alignment.STRICT:
            self.outcomes[key] = "strict_failed"
            self.metrics.refits.labels(mode.value, result or "strict_failed").inc()
            await self._fail_binding(pod)
            log.error("strict refit failed", extra={**where, "cause": cause})
            raise AdmissionRefused(f"numa-alignment strict: {cause}")
        self.metrics.refits.labels(mode.value, result or "fallback").inc()
        self.fallbacks.add(key)
        if timed_out:
            self.outcomes[key] = "timeout"
        elif reply is not None:
            self.outcomes[key] = f"refused:{reply.get('code', 'unknown')}"
        else:
            self.outcomes[key] = "fallback"
        log.info("refit fallback: kubelet picks", extra={**where, "cause": cause})
        return []

    async def _ask(self, refit: RefitRequest) -> tuple[dict[str, Any] | None, str, bool]:
        """One request, no retry: (reply, failure text, timed out)."""
        try:
            msg = await self.nc.request(
                subjects.refit(refit.node_name),
                dumps(refit.to_json()),
                timeout=refit.timeout_ms / 1000,
            )
        except nats.errors.NoRespondersError:
            return None, "no refit service answers", False
        except (nats.errors.TimeoutError, TimeoutError):
            return None, f"refit timed out after {refit.timeout_ms} ms", True
        except nats.errors.Error as exc:
            return None, f"refit transport error: {exc}", False
        try:
            return dict(loads_object(msg.data, "refit reply")), "", False
        except WireError as exc:
            return None, str(exc), False

    async def _map_committed(
        self,
        pod: dict[str, Any],
        entry: dict[str, Any],
        request: ContainerPreference,
        reply: dict[str, Any],
        mode: Alignment,
        where: dict[str, Any],
    ) -> list[str]:
        try:
            moved = [d.uuid for d in codec.decode_container(str(reply.get("containerDevices", "")))]
            if not moved:
                raise SelectionError("empty containerDevices")
            selection = select_replicas(
                request.available, request.required, moved, request.size, self.known
            )
        except (CoreError, SelectionError) as exc:
            # The move is committed: falling back would leave runtime and accounting apart.
            self.metrics.refits.labels(mode.value, "unmappable").inc()
            self.outcomes[(pod["uid"], entry["index"])] = (
                "strict_failed" if mode is Alignment.STRICT else "refused:unmappable"
            )
            await self._fail_binding(pod)
            log.error("refit committed but unmappable", extra={**where, "error": str(exc)})
            raise AdmissionRefused(
                f"numa refit committed but kubelet cannot honor the selection: {exc}"
            ) from exc
        result = str(reply.get("code", "moved"))
        self.metrics.refits.labels(mode.value, result).inc()
        self.outcomes[(pod["uid"], entry["index"])] = result
        log.info("NUMA refit succeeded", extra={**where, "replicas": selection, "code": result})
        return selection

    async def _fail_binding(self, pod: dict[str, Any]) -> None:
        try:
            await self.accounting.call(
                "bind-phase", self.config.node, {"podUID": pod["uid"], "phase": keys.PHASE_FAILED}
            )
        except AccountingUnavailable as exc:
            log.warning("bind-phase failed not recorded", extra={"error": str(exc)})

    # --- Allocate ---------------------------------------------------------------------------

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        if not device_ids:
            raise AdmissionRefused("Allocate named no devices", invalid_argument=True)
        gpus = physical_ids(device_ids, self.known)
        unknown = [d for d, g in zip(device_ids, gpus, strict=True) if g not in self.known]
        if unknown:
            self.metrics.allocations.labels("unknown_device").inc()
            raise AdmissionRefused(f"unknown device IDs {unknown}", invalid_argument=True)
        try:
            reply = await self.accounting.call("consume", self.config.node, {"devices": gpus})
        except AccountingUnavailable as exc:
            self.metrics.allocations.labels("accounting_unavailable").inc()
            raise AdmissionRefused(f"cannot record the allocation: {exc}") from exc
        if not reply.get("ok"):
            self.metrics.allocations.labels(str(reply.get("code", "refused"))).inc()
            raise AdmissionRefused(f"allocation refused by accounting: {reply.get('error')}")
        try:
            entry = codec.decode_container(str(reply["containerDevices"]))
        except (KeyError, CoreError) as exc:
            raise AdmissionRefused(f"accounting sent an unusable entry: {exc}") from exc
        uid, index = str(reply.get("podUID", "")), int(reply.get("containerIndex", -1))
        if (uid, index) in self.fallbacks:
            self.fallbacks.discard((uid, index))
            self.misaligned.add((uid, str(reply.get("containerName", index))))
            self.metrics.misaligned.set(len(self.misaligned))
        self.metrics.allocations.labels("ok").inc()
        return container_allocation(
            entry, uid, str(reply.get("containerName", "")), self.config.hami_core
        )

    def forget_pods(self, alive: set[str]) -> None:
        """Drop what is kept per pod (misaligned containers, refit outcomes) for pods
        accounting no longer tracks, so a long-running plugin does not grow."""
        self.misaligned = {m for m in self.misaligned if m[0] in alive}
        self.fallbacks = {f for f in self.fallbacks if f[0] in alive}
        self.outcomes = {k: v for k, v in self.outcomes.items() if k[0] in alive}
        self.metrics.misaligned.set(len(self.misaligned))


def _mode_label(pod: dict[str, Any]) -> str:
    try:
        mode = parse_alignment(pod.get("numaAlignment"))
    except CoreError:
        return "none"
    return mode.value if mode is not None else "none"
