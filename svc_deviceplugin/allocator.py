"""The plugin's decisions at admission: preferred replicas (with the NUMA refit) and Allocate.

kubelet calls GetPreferredAllocation with the replicas its Topology Manager allows. The ledger
(accounting's `pending`) says which GPUs the scheduler reserved for the container being
admitted; if one has no allowed replica (the *mismatch*) and the pod opted in with
`hami.io/numa-alignment`, one refit request goes to svc_refit. Modes (reference (h)):
best-effort falls back to kubelet's own choice on refusal, no responders or timeout; strict
fails the admission; a committed refit whose reply cannot be mapped to kubelet's replicas fails
in both modes (the move already happened).

Deadlines: each kubelet call has one :class:`Deadline` (`refit_timeout_ms` from its start) and
every hop takes what is left of it: the `pending` and `consume` requests to accounting (whose
`deadlineMs` follows), the refit (its `timeoutMs` is the remaining budget, not a fresh one) and
recording a failed binding. A failed binding that cannot be recorded within the call's budget
is recorded after kubelet has its answer, by a background task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import nats.errors
from nats.aio.client import Client

from shared import subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.pods import Alignment, parse_alignment
from shared.core.refit import RefitRequest
from shared.core.replicas import ReplicaMismatch, SelectionError, physical_ids, select_replicas
from shared.service.backoff import Backoff
from shared.service.lifecycle import Deadline
from shared.service.supervisor import Supervisor
from shared.subjects import shown
from shared.wire import WireError, dumps, loads_object
from svc_deviceplugin.config import PluginConfig
from svc_deviceplugin.environment import ContainerAllocation, container_allocation
from svc_deviceplugin.metrics import PluginMetrics, allocation_result

log = logging.getLogger("numafit.deviceplugin")

MIN_HOP_S = 0.02
"""Below this much of the call's budget no hop is started: it could only end after the call."""
CONSUME_ATTEMPTS = 3
"""consume answered `conflict` (accounting re-read the pod): asked again, this many in all."""
LATER_ATTEMPTS = 3
"""Attempts of recording a failed binding after the kubelet call has ended."""
TEXT_LIMIT = 200
"""Characters of outside text (accounting errors, refit reasons) kept in messages and logs."""
REFIT_SUCCESS = ("moved", "already_aligned")


def bounded(text: str, limit: int = TEXT_LIMIT) -> str:
    """Outside text for a message or log line: as is when short and printable, else cut (and
    quoted) by `subjects.shown`, so unbounded input never comes back whole."""
    return text if len(text) <= limit and text.isprintable() else shown(text, limit)


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
        tasks: Supervisor,
    ) -> None:
        self.config = config
        self.nc = nc
        self.accounting = AccountingClient(nc, config.accounting_timeout)
        self.metrics = metrics
        self.known = known_gpus
        self.tasks = tasks
        """Owns the background work that outlives a kubelet call (late bind-phase records)."""
        self.fallbacks: set[tuple[str, int]] = set()
        """(pod UID, container index) admitted on kubelet's choice after a best-effort
        fallback; pending Allocate, then counted as misaligned."""
        self.misaligned: set[tuple[str, str]] = set()
        self.outcomes: dict[tuple[str, int], str] = {}
        """The refit outcome per (pod UID, container index), as `numafit simulate` reports it:
        none, moved, already_aligned, fallback, refused:<code>, timeout, strict_failed."""

    # --- GetPreferredAllocation -------------------------------------------------------------

    def deadline(self) -> Deadline:
        """The deadline of a kubelet call starting now."""
        return Deadline.after_ms(self.config.refit_timeout_ms)

    def _budget(self, deadline: Deadline) -> float:
        """Seconds the next accounting request may take: what is left of the call."""
        return min(self.config.accounting_timeout, deadline.remaining())

    async def preferred(
        self, requests: Sequence[ContainerPreference], deadline: Deadline | None = None
    ) -> list[list[str]]:
        """Preferred replica IDs per container request (empty = let kubelet choose)."""
        deadline = deadline or self.deadline()
        nothing: list[list[str]] = [[] for _ in requests]
        budget = self._budget(deadline)
        if budget < MIN_HOP_S:
            log.warning("no preference: the call's budget is spent")
            return nothing
        try:
            pending = await self.accounting.call("pending", self.config.node, {}, budget)
        except AccountingUnavailable as exc:
            log.warning("no preference: accounting unreachable", extra={"error": bounded(str(exc))})
            return nothing
        pod = pending.get("pod")
        if not pending.get("ok") or not isinstance(pod, dict):
            return nothing
        if not _pending_pod_shape(pod):
            log.warning("no preference: accounting sent a pending pod without its identity")
            return nothing
        entries = pod.get("entries") or []
        answers = []
        for k, request in enumerate(requests):
            entry = entries[k] if k < len(entries) else None
            answers.append(
                await self._prefer_one(pod, entry, request, deadline) if _entry_shape(entry) else []
            )
        return answers

    async def _prefer_one(
        self,
        pod: dict[str, Any],
        entry: dict[str, Any],
        request: ContainerPreference,
        deadline: Deadline,
    ) -> list[str]:
        where = {"pod": f"{pod['namespace']}/{pod['name']}", "container": entry["index"]}
        try:
            desired = [d.uuid for d in codec.decode_container(entry["devices"])]
            selection = select_replicas(
                request.available, request.required, desired, request.size, self.known
            )
        except ReplicaMismatch as mismatch:
            return await self._mismatch(pod, entry, request, mismatch, where, deadline)
        except (SelectionError, CoreError, KeyError, TypeError) as exc:
            log.info("no preference", extra={**where, "error": bounded(str(exc))})
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
        deadline: Deadline,
    ) -> list[str]:
        try:
            mode = parse_alignment(pod.get("numaAlignment"))
        except CoreError:
            log.warning(
                "ignoring invalid numa-alignment annotation",
                extra={**where, "value": shown(str(pod.get("numaAlignment")))},
            )
            mode = None
        if mode is None or not self.config.refit_enabled or self.config.mig_mode:
            log.info(
                "mismatch, no refit",
                extra={**where, "error": bounded(str(mismatch))},
            )
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
            # What is left of this kubelet call, not a fresh budget: the refit service and
            # accounting derive their own deadlines from it.
            timeout_ms=max(deadline.remaining_ms(), 1),
        )
        started = time.perf_counter()
        if deadline.remaining() < MIN_HOP_S:
            reply, failure, timed_out = None, "no time left for a refit", True
        else:
            reply, failure, timed_out = await self._ask(refit)
        self.metrics.refit_duration.observe(time.perf_counter() - started)
        if reply is not None and reply.get("succeeded") is True:
            return await self._map_committed(pod, entry, request, reply, mode, where, deadline)
        cause = failure or bounded(
            str(reply.get("failureReason", "refused") if reply else "refused")
        )
        result = "timeout" if timed_out else None
        key = (pod["uid"], entry["index"])
        if mode is Alignment.STRICT:
            self.outcomes[key] = "strict_failed"
            self.metrics.refits.labels(mode.value, result or "strict_failed").inc()
            await self._fail_binding(pod, deadline)
            log.error("strict refit failed", extra={**where, "cause": cause})
            raise AdmissionRefused(f"numa-alignment strict: {cause}")
        self.metrics.refits.labels(mode.value, result or "fallback").inc()
        self.fallbacks.add(key)
        if timed_out:
            self.outcomes[key] = "timeout"
        elif reply is not None:
            self.outcomes[key] = f"refused:{_code(reply)}"
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
            return (
                None,
                f"refit timed out: no answer within this call's {self.config.refit_timeout_ms} "
                f"ms budget ({refit.timeout_ms} ms of it left for the refit)",
                True,
            )
        except nats.errors.Error as exc:
            return None, f"refit transport error: {bounded(str(exc))}", False
        try:
            return dict(loads_object(msg.data, "refit reply")), "", False
        except WireError as exc:
            return None, bounded(str(exc)), False

    async def _map_committed(
        self,
        pod: dict[str, Any],
        entry: dict[str, Any],
        request: ContainerPreference,
        reply: dict[str, Any],
        mode: Alignment,
        where: dict[str, Any],
        deadline: Deadline,
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
            await self._fail_binding(pod, deadline)
            text = bounded(str(exc))
            log.error("refit committed but unmappable", extra={**where, "error": text})
            raise AdmissionRefused(
                f"numa refit committed but kubelet cannot honor the selection: {text}"
            ) from exc
        code = reply.get("code", "moved")
        result = code if code in REFIT_SUCCESS else "moved"
        self.metrics.refits.labels(mode.value, result).inc()
        self.outcomes[(pod["uid"], entry["index"])] = result
        log.info("NUMA refit succeeded", extra={**where, "replicas": selection, "code": result})
        return selection

    async def _fail_binding(self, pod: dict[str, Any], deadline: Deadline) -> None:
        """Record bind-phase `failed` (the scheduler's node lock is released) within what is
        left of the call; when that is not enough, after the call, in the background."""
        uid = str(pod["uid"])
        budget = self._budget(deadline)
        if budget >= MIN_HOP_S and await self._record_failed(uid, budget):
            return
        log.info("bind-phase failed recorded after the call", extra={"pod_uid": uid})
        self.tasks.spawn(self._record_failed_later(uid), f"bind-phase-failed:{uid}")

    async def _record_failed(self, uid: str, budget: float) -> bool:
        """One attempt; True when accounting recorded it (or can never record it)."""
        body = {"podUID": uid, "phase": keys.PHASE_FAILED}
        try:
            reply = await self.accounting.call("bind-phase", self.config.node, body, budget)
        except AccountingUnavailable as exc:
            log.warning("bind-phase failed not recorded", extra={"error": bounded(str(exc))})
            return False
        if reply.get("ok"):
            return True
        code = _code(reply)
        log.warning(
            "bind-phase failed refused",
            extra={"code": code, "error": bounded(str(reply.get("error", "")))},
        )
        return code not in ("deadline_exceeded", "conflict", "api_error")

    async def _record_failed_later(self, uid: str) -> None:
        backoff = Backoff()
        for _ in range(LATER_ATTEMPTS):
            if await self._record_failed(uid, self.config.accounting_timeout):
                return
            await backoff.wait()
        log.error("bind-phase failed never recorded", extra={"pod_uid": uid})

    # --- Allocate ---------------------------------------------------------------------------

    async def allocate(
        self, device_ids: Sequence[str], deadline: Deadline | None = None
    ) -> ContainerAllocation:
        deadline = deadline or self.deadline()
        if not device_ids:
            raise AdmissionRefused("Allocate named no devices", invalid_argument=True)
        gpus = physical_ids(device_ids, self.known)
        unknown = [d for d, g in zip(device_ids, gpus, strict=True) if g not in self.known]
        if unknown:
            self.metrics.allocations.labels("unknown_device").inc()
            raise AdmissionRefused(
                f"{len(unknown)} unknown device ID(s): {bounded(', '.join(unknown))}",
                invalid_argument=True,
            )
        reply = await self._consume(gpus, deadline)
        try:
            entry = codec.decode_container(str(reply["containerDevices"]))
            uid, index = str(reply.get("podUID", "")), int(reply.get("containerIndex", -1))
        except (KeyError, TypeError, ValueError, CoreError) as exc:
            self.metrics.allocations.labels("unusable_reply").inc()
            raise AdmissionRefused(
                f"accounting sent an unusable entry: {bounded(str(exc))}"
            ) from exc
        if (uid, index) in self.fallbacks:
            self.fallbacks.discard((uid, index))
            self.misaligned.add((uid, str(reply.get("containerName", index))))
            self.metrics.misaligned.set(len(self.misaligned))
        self.metrics.allocations.labels("ok").inc()
        return container_allocation(
            entry, uid, str(reply.get("containerName", "")), self.config.hami_core
        )

    async def _consume(self, gpus: Sequence[str], deadline: Deadline) -> dict[str, Any]:
        """Ask accounting to consume the pending entry on `gpus`. A `conflict` means the pod
        changed under accounting, which re-read it: asked again while the budget allows.
        Every other refusal fails the Allocate with accounting's code and (cut) reason."""
        for attempt in range(1, CONSUME_ATTEMPTS + 1):
            budget = self._budget(deadline)
            if budget < MIN_HOP_S:
                self.metrics.allocations.labels("deadline_exceeded").inc()
                raise AdmissionRefused(
                    "cannot record the allocation: the call's "
                    f"{self.config.refit_timeout_ms} ms budget is spent"
                )
            try:
                reply = await self.accounting.call(
                    "consume", self.config.node, {"devices": list(gpus)}, budget
                )
            except AccountingUnavailable as exc:
                self.metrics.allocations.labels("accounting_unavailable").inc()
                raise AdmissionRefused(
                    f"cannot record the allocation: {bounded(str(exc))}"
                ) from exc
            if reply.get("ok"):
                return reply
            code = _code(reply)
            error = bounded(str(reply.get("error", "")))
            if code == "conflict" and attempt < CONSUME_ATTEMPTS:
                log.info("consume conflict; asking again", extra={"attempt": attempt})
                continue
            self.metrics.allocations.labels(allocation_result(code)).inc()
            log.warning("allocation refused by accounting", extra={"code": code, "error": error})
            raise AdmissionRefused(f"allocation refused by accounting ({code}): {error}")
        raise AssertionError("unreachable")  # pragma: no cover

    def forget_pods(self, alive: set[str]) -> None:
        """Drop what is kept per pod (misaligned containers, refit outcomes) for pods
        accounting no longer tracks, so a long-running plugin does not grow."""
        self.misaligned = {m for m in self.misaligned if m[0] in alive}
        self.fallbacks = {f for f in self.fallbacks if f[0] in alive}
        self.outcomes = {k: v for k, v in self.outcomes.items() if k[0] in alive}
        self.metrics.misaligned.set(len(self.misaligned))


def _pending_pod_shape(pod: dict[str, Any]) -> bool:
    return all(isinstance(pod.get(key), str) for key in ("uid", "namespace", "name"))


def _entry_shape(entry: object) -> TypeGuard[dict[str, Any]]:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("index"), int)
        and isinstance(entry.get("devices"), str)
    )


def _code(reply: dict[str, Any]) -> str:
    """A reply's `code`, bounded (it ends up in messages, logs and outcomes)."""
    code = reply.get("code")
    if isinstance(code, str) and code and len(code) <= 64:
        return code
    return "unknown"


def _mode_label(pod: dict[str, Any]) -> str:
    try:
        mode = parse_alignment(pod.get("numaAlignment"))
    except CoreError:
        return "none"
    return mode.value if mode is not None else "none"
