"""The plugin's decisions at admission: preferred replicas (with the NUMA refit) and Allocate.

kubelet calls GetPreferredAllocation with the replicas its Topology Manager allows. The ledger
(accounting's `pending`) says which GPUs the scheduler reserved for the container being
admitted; if one has no allowed replica (the *mismatch*) and the pod opted in with
`hami.io/numa-alignment`, one refit request goes to svc_refit. Modes (reference (h)):
best-effort falls back to kubelet's own choice on refusal, no responders or timeout; strict
fails the admission; a committed refit whose reply cannot be mapped to kubelet's replicas fails
in both modes (the move already happened).
What each outcome leads to (metric, recorded outcome, log line, answer) is one table,
`svc_deviceplugin.outcome.EFFECTS`, keyed by the pure `decide()`'s `PreferredOutcome`.

Deadlines: each kubelet call has one :class:`Deadline` (`refit_timeout_ms` from its start) and
every hop takes what is left of it: the `pending` and `consume` requests to accounting (whose
`deadlineMs` follows), the refit (its `timeoutMs` is the remaining budget, not a fresh one) and
recording a failed binding. A failed binding that cannot be recorded within the call's budget
is recorded after kubelet has its answer, by a background task.

Allocate when accounting does not answer: the container's devices were decided before kubelet
called (the entry GetPreferredAllocation fetched, or the refit's move), so Allocate does not fail
for want of accounting's acknowledgement. When the `consume` gets no answer in time,
`node_unavailable` (a takeover under way) or `deadline_exceeded`, and GetPreferredAllocation
fetched this container's entry just before, kubelet is answered from that entry (with the GPUs
kubelet gave, amounts kept as accounting's consume keeps them) and the consumption goes to the
journal, which `svc_deviceplugin.deferred` sends again until accounting acknowledges it. The
consume then leaves a little of the call's budget (`DEFER_RESERVE_S`) for writing the journal.
Without such an entry (kubelet skips GetPreferredAllocation when it has no choice to make) the
Allocate fails as before: the plugin cannot tell what the container was reserved.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import nats.errors

from shared import messages, subjects
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.codes import Code
from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.fallback import fallback_choice
from shared.core.model import ContainerDevice
from shared.core.pods import Alignment, parse_alignment
from shared.core.replicas import (
    ReplicaMismatch,
    SelectionError,
    distinct_selection,
    physical_ids,
    select_replicas,
)
from shared.messages import PendingEntry, PendingPod, RefitReply
from shared.service import natsconn
from shared.service.backoff import Backoff
from shared.service.lifecycle import Deadline
from shared.subjects import shown
from svc_deviceplugin.deferred import DeferredConsumes
from svc_deviceplugin.environment import ContainerAllocation, container_allocation
from svc_deviceplugin.journal import ConsumeJournal, DeferredConsume, JournalFull
from svc_deviceplugin.metrics import PluginMetrics, allocation_result
from svc_deviceplugin.outcome import EFFECTS, PreferredOutcome, Then, decide, judged, mode_label

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nats.aio.client import Client

    from shared.core.model import ContainerEntry
    from shared.service.supervisor import Supervisor
    from svc_deviceplugin.config import PluginConfig

log = logging.getLogger("numafit.deviceplugin")

MIN_HOP_S = 0.02
"""Below this much of the call's budget no hop is started: it could only end after the call."""
CONSUME_ATTEMPTS = 3
"""consume answered `conflict` (accounting re-read the pod): asked again, this many in all."""
LATER_ATTEMPTS = 3
"""Attempts of recording a failed binding after the kubelet call has ended."""
TEXT_LIMIT = 200
"""Characters of outside text (accounting errors, refit reasons) kept in messages and logs."""
RETRIED_BIND_PHASE = frozenset({Code.DEADLINE_EXCEEDED, Code.CONFLICT, Code.API_ERROR})
"""A bind-phase `failed` refused with one of these may be recorded by asking again."""
DEFERRED_CODES = frozenset({Code.NODE_UNAVAILABLE, Code.DEADLINE_EXCEEDED})
"""consume refusals that say accounting is away or late, not that the allocation is wrong: with
the entry known, Allocate is answered and the consumption journalled."""
DEFER_RESERVE_S = 0.25
"""Seconds of an Allocate's budget kept back from its consume, when the entry is known, for
writing the journal should the consume not be answered."""
KNOWN_FOR_S = 10.0
"""How long after GetPreferredAllocation its entries may answer an Allocate: kubelet calls
Allocate right after it, so an older one belongs to an admission that went no further."""
FALLBACK_RESERVE_S = 0.25
"""Seconds of a best-effort container's budget kept back from its refit, so that kubelet's GPUs
can still be judged (the fallback rule, on a snapshot of accounting's usage) should the refit
not move the reservation (a quarter of a shorter budget)."""


def outside_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """Outside text for a message or log line: as is when short and printable, else cut (and
    quoted) by `subjects.shown`, so unbounded input never comes back whole."""
    return text if len(text) <= limit and text.isprintable() else shown(text, limit)


class _Unrecorded(Exception):
    """accounting did not record the consumption, for a reason that says nothing against it
    (no answer, a takeover, out of budget): deferred when the entry is known, else refused
    with `message`."""

    def __init__(self, message: str, result: str, reason: str) -> None:
        super().__init__(message)
        self.result = result
        """The `allocations_total` label when the Allocate fails."""
        self.reason = reason
        """The `consume_deferred_total` label when it is deferred."""


@dataclass(frozen=True, slots=True)
class Admitting:
    """A container entry GetPreferredAllocation fetched (the refit's move applied): what an
    Allocate needs to be answered without accounting."""

    uid: str
    namespace: str
    name: str
    index: int
    container_name: str
    devices: str
    """The reserved entry, HAMi's per-container encoding."""


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


@dataclass(frozen=True, slots=True)
class Judged:
    """The fallback rule's answer for kubelet's offered replicas: the preferred ones, or why
    none satisfies the pod (`refusal`), or neither when it could not be judged."""

    selection: list[str] | None = None
    refusal: str = ""
    source: str = "fallback"


@dataclass(frozen=True, slots=True)
class RefitAnswer:
    """What one refit request came to: the reply (None: none usable), why there is none,
    whether the budget ran out first."""

    reply: RefitReply | None
    failure: str = ""
    timed_out: bool = False


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
        fallback; pending Allocate, then counted in `fallback_containers`."""
        self.fallback_containers: set[tuple[str, str]] = set()
        """(pod UID, container name) running on kubelet's choice after a best-effort fallback
        (`numafit_deviceplugin_fallback_containers`)."""
        self.outcomes: dict[tuple[str, int], str] = {}
        """The refit outcome per (pod UID, container index), as `numafit simulate` reports it:
        none, moved, already_aligned, fallback, refused:<code>, timeout, strict_failed."""
        self.deferred = DeferredConsumes(
            ConsumeJournal(config.journal_path, config.node),
            self.accounting,
            metrics,
            config.node,
            config.accounting_timeout,
        )
        """Consumptions kubelet was answered for that accounting has not acknowledged."""
        self._admitting: list[Admitting] = []
        """The entries the last GetPreferredAllocation fetched, in its containers' order; each
        answers at most one Allocate."""
        self._admitting_at = 0.0
        self._moved: dict[tuple[str, int], str] = {}
        """Within one GetPreferredAllocation: the entry a refit moved (pod UID, index)."""
        self._handed: tuple[str, set[str]] = ("", set())
        """The pod last allocated and the replica IDs its containers were handed: kubelet
        gives an app container its init container's replicas again (device reuse)."""

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
        self._admitting, self._moved = [], {}
        # Without the pending pod there is nothing to prefer but distinct GPUs: kubelet's own
        # pick could hand a container two replicas of one GPU.
        nothing = [self._distinct(r) for r in requests]
        budget = self._budget(deadline)
        if budget < MIN_HOP_S:
            log.warning("no preference: the call's budget is spent")
            return nothing
        request = messages.PendingRequest(node=self.config.node)
        try:
            pending = await self.accounting.ask(request, messages.PendingReply, budget)
        except AccountingUnavailable as exc:
            what = "an unusable pending reply" if _unreadable(exc) else "accounting unreachable"
            log.warning(f"no preference: {what}", extra={"error": outside_text(str(exc))})
            return nothing
        pod = pending.pod
        if pending.ok and len(self.deferred):
            self.deferred.kick()  # accounting answers again: replay what it has not recorded
        if not pending.ok or not isinstance(pod, PendingPod):
            return nothing
        # Entries whose consumption is journalled are consumed as far as kubelet knows; until
        # accounting records them they are still pending there, and must not be admitted again.
        unrecorded = self.deferred.journal.indices(pod.uid)
        entries = [e for e in pod.entries if e.index not in unrecorded]
        answers = []
        admitting = []
        for k, container in enumerate(requests):
            entry = entries[k] if k < len(entries) else None
            answers.append(
                await self._prefer_one(pod, entry, container, deadline)
                if entry
                else self._distinct(container)
            )
            if entry is not None:
                devices = self._moved.pop((pod.uid, entry.index), entry.devices)
                admitting.append(
                    Admitting(
                        pod.uid,
                        pod.namespace,
                        pod.name,
                        entry.index,
                        entry.container_name,
                        devices,
                    )
                )
        # Only once every container's preference is settled: a failed admission leaves none.
        self._admitting, self._admitting_at = admitting, time.monotonic()
        return answers

    async def _prefer_one(
        self,
        pod: PendingPod,
        entry: PendingEntry,
        request: ContainerPreference,
        deadline: Deadline,
    ) -> list[str]:
        where: dict[str, object] = {"pod": f"{pod.namespace}/{pod.name}", "container": entry.index}
        try:
            mode = parse_alignment(pod.numa_alignment)
        except CoreError:
            mode, invalid = None, True
        else:
            invalid = False
        try:
            desired = [d.uuid for d in codec.decode_container(entry.devices)]
            selection = select_replicas(
                request.available, request.required, desired, request.size, self.known
            )
        except ReplicaMismatch as mismatch:
            if invalid:
                log.warning(
                    "ignoring invalid numa-alignment annotation",
                    extra={**where, "value": shown(str(pod.numa_alignment))},
                )
            return await self._mismatch(pod, entry, request, mismatch, mode, where, deadline)
        except (SelectionError, CoreError) as exc:
            log.info(
                "no preference from the reservation",
                extra={**where, "error": outside_text(str(exc))},
            )
            return self._distinct(request)
        self.metrics.preferences.labels("reservation").inc()
        return await self._settle(
            decide(mismatch=False, mode=mode), mode, pod, entry, where, deadline, selection
        )

    async def _mismatch(
        self,
        pod: PendingPod,
        entry: PendingEntry,
        request: ContainerPreference,
        mismatch: ReplicaMismatch,
        mode: Alignment | None,
        where: dict[str, object],
        deadline: Deadline,
    ) -> list[str]:
        allowed = self.config.refit_enabled and not self.config.mig_mode
        if mode is None or not allowed:
            outcome = decide(mismatch=True, mode=mode, refit_allowed=allowed)
            return await self._kubelets_gpus(
                outcome, mode, pod, entry, request, where, deadline, outside_text(str(mismatch))
            )
        log.info("mismatch, asking for a refit", extra={**where, "mode": mode.value})
        refit = messages.RefitRequest(
            pod_uid=pod.uid,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            node_name=self.config.node,
            container_index=entry.index,
            container_name=entry.container_name or msgspec.UNSET,
            device_type=keys.NVIDIA,
            allowed_device_uuids=tuple(codec.unique_physical_ids(request.available, self.known)),
            mode=mode.value,
            # What is left of this kubelet call, not a fresh budget: the refit service and
            # accounting derive their own deadlines from it. A best-effort pod keeps a little
            # back for judging kubelet's GPUs should the refit not move it.
            timeout_ms=max(deadline.remaining_ms() - self._fallback_reserve_ms(mode, deadline), 1),
        )
        started = time.perf_counter()
        if deadline.remaining() < MIN_HOP_S:
            answer = RefitAnswer(None, "no time left for a refit", timed_out=True)
        else:
            answer = await self._ask(refit)
        self.metrics.refit_duration.observe(time.perf_counter() - started)
        reply, selection, detail = answer.reply, None, answer.failure
        if reply is not None and reply.succeeded:
            try:
                selection = self._map_committed(reply, request)
            except (CoreError, SelectionError) as exc:
                detail = outside_text(str(exc))  # the move is committed: no falling back
            else:
                # What the container is reserved now, should Allocate answer without accounting.
                self._moved[(pod.uid, entry.index)] = reply.container_devices or entry.devices
        elif reply is not None:
            detail = outside_text(reply.failure_reason or "refused")
        outcome = decide(
            mismatch=True,
            mode=mode,
            reply=reply,
            timed_out=answer.timed_out,
            mappable=selection is not None,
        )
        code = _code_text(reply.code) if reply is not None else "unknown"
        if EFFECTS[outcome].then is Then.FALLBACK:
            return await self._kubelets_gpus(
                outcome, mode, pod, entry, request, where, deadline, detail, code
            )
        if selection is not None:
            self.metrics.preferences.labels("refit").inc()
        return await self._settle(
            outcome, mode, pod, entry, where, deadline, selection, detail=detail, code=code
        )

    def _fallback_reserve_ms(self, mode: Alignment, deadline: Deadline) -> int:
        if mode is not Alignment.BEST_EFFORT:
            return 0
        return int(min(FALLBACK_RESERVE_S, deadline.remaining() / 4) * 1000)

    async def _kubelets_gpus(
        self,
        outcome: PreferredOutcome,
        mode: Alignment | None,
        pod: PendingPod,
        entry: PendingEntry,
        request: ContainerPreference,
        where: dict[str, object],
        deadline: Deadline,
        detail: str,
        code: str = "unknown",
    ) -> list[str]:
        """The container is left to kubelet's offered replicas (a pod that did not opt in, or a
        best-effort refit that did not move it): prefer those the fallback rule picks
        (`shared.core.fallback`: the pod's own constraints, its GPU policy's order, distinct
        GPUs), and refuse an opted-in pod none of them satisfies."""
        found = await self._judge(pod, entry, request, deadline)
        settled = judged(outcome, mode, satisfied=found.refusal == "")
        if settled is not outcome:
            prior = EFFECTS[outcome].record.format(code=code)
            return await self._settle(
                settled, mode, pod, entry, where, deadline, detail=found.refusal, prior=prior
            )
        if found.selection is None and found.refusal:
            # A pod that did not opt in: kubelet's choice runs as in HAMi; it still gets
            # distinct GPUs where kubelet offers them.
            log.warning(
                "no offered GPU satisfies the pod; kubelet picks",
                extra={**where, "why": found.refusal},
            )
            found = Judged(self._distinct(request), source="distinct")
        self.metrics.preferences.labels(found.source if found.selection else "none").inc()
        return await self._settle(
            outcome, mode, pod, entry, where, deadline, found.selection, detail=detail, code=code
        )

    async def _judge(
        self, pod: PendingPod, entry: PendingEntry, request: ContainerPreference, deadline: Deadline
    ) -> Judged:
        """kubelet's offered replicas judged by the fallback rule on accounting's usage (one
        snapshot of the node with the pod); distinct GPUs, unjudged, when the usage cannot be
        had within the call's budget."""
        where = {"pod": f"{pod.namespace}/{pod.name}", "container": entry.index}
        budget = self._budget(deadline)
        try:
            if budget < MIN_HOP_S:
                raise AccountingUnavailable("the call's budget is spent")
            reply = await self.accounting.ask(
                messages.SnapshotRequest(node=self.config.node, pod_uid=pod.uid),
                messages.SnapshotReply,
                budget,
            )
            states = reply.nodes or ()
            wire = reply.pod
            if not reply.ok or not states or not isinstance(wire, messages.TrackedPodWire):
                raise AccountingUnavailable(f"no usage for the pod ({_code_text(reply.code)})")
            node = states[0].to_state().snapshot()
            tracked = wire.to_core()
        except (AccountingUnavailable, messages.MessageError) as exc:
            log.warning(
                "kubelet's GPUs not judged: no usage at hand",
                extra={**where, "error": outside_text(str(exc))},
            )
            selection = self._distinct(request)
            return Judged(selection or None, source="distinct")
        if node is None:
            return Judged(self._distinct(request) or None, source="distinct")
        offered = codec.unique_physical_ids(request.available, self.known)
        choice = fallback_choice(tracked, entry.index, node, offered)
        if not choice.ok:
            return Judged(refusal=outside_text(choice.reason))
        try:
            selection = select_replicas(
                request.available, request.required, list(choice.gpus), request.size, self.known
            )
        except SelectionError:
            # kubelet's must-include replicas are not among the picks: distinct GPUs instead.
            return Judged(self._distinct(request) or None, source="distinct")
        return Judged(selection)

    def _distinct(self, request: ContainerPreference) -> list[str]:
        """Replicas of distinct GPUs among those offered (empty when there are too few)."""
        try:
            return distinct_selection(request.available, request.required, request.size, self.known)
        except SelectionError:
            return []

    async def _settle(
        self,
        outcome: PreferredOutcome,
        mode: Alignment | None,
        pod: PendingPod,
        entry: PendingEntry,
        where: dict[str, object],
        deadline: Deadline,
        selection: list[str] | None = None,
        *,
        detail: str = "",
        code: str = "unknown",
        prior: str = "",
    ) -> list[str]:
        """Do what `outcome` says (`EFFECTS`): count it, record it, log it, then answer."""
        effect = EFFECTS[outcome]
        key = (pod.uid, entry.index)
        self.metrics.refits.labels(mode_label(outcome, mode), effect.result).inc()
        self.outcomes[key] = effect.record.format(code=code, prior=prior)
        if effect.then is Then.FAIL:
            await self._fail_binding(pod.uid, deadline)
        if effect.message is not None:
            # a success's detail is its code (the result label)
            extra = {**where, effect.detail: effect.result if effect.detail == "code" else detail}
            if selection is not None:
                extra["replicas"] = selection
            log.log(effect.level, effect.message, extra=extra)
        if effect.then is Then.FAIL:
            mode_text = mode.value if mode is not None else "none"
            raise AdmissionRefused(effect.refusal.format(detail=detail, mode=mode_text))
        if effect.then is Then.FALLBACK:
            self.fallbacks.add(key)
        return selection or []

    async def _ask(self, refit: messages.RefitRequest) -> RefitAnswer:
        """One request, no retry."""
        try:
            msg = await natsconn.request(
                self.nc,
                subjects.refit(refit.node_name),
                messages.encode(refit),
                refit.timeout_ms / 1000,
            )
        except nats.errors.NoRespondersError:
            return RefitAnswer(None, "no refit service answers")
        except (nats.errors.TimeoutError, TimeoutError):
            return RefitAnswer(
                None,
                f"refit timed out: no answer within this call's {self.config.refit_timeout_ms} "
                f"ms budget ({refit.timeout_ms} ms of it left for the refit)",
                timed_out=True,
            )
        except nats.errors.Error as exc:
            return RefitAnswer(None, f"refit transport error: {outside_text(str(exc))}")
        try:
            return RefitAnswer(messages.decode(msg.data, RefitReply))
        except messages.MessageError as exc:
            return RefitAnswer(None, outside_text(str(exc)))

    def _map_committed(self, reply: RefitReply, request: ContainerPreference) -> list[str]:
        """kubelet's replicas for the committed move (`CoreError`, `SelectionError`: none)."""
        moved = [d.uuid for d in codec.decode_container(reply.container_devices or "")]
        if not moved:
            raise SelectionError("empty containerDevices")
        return select_replicas(request.available, request.required, moved, request.size, self.known)

    async def _fail_binding(self, uid: str, deadline: Deadline) -> None:
        """Record bind-phase `failed` (the scheduler's node lock is released) within what is
        left of the call; when that is not enough, after the call, in the background."""
        budget = self._budget(deadline)
        if budget >= MIN_HOP_S and await self._record_failed(uid, budget):
            return
        log.info("bind-phase failed recorded after the call", extra={"pod_uid": uid})
        self.tasks.spawn(self._record_failed_later(uid), f"bind-phase-failed:{uid}")

    async def _record_failed(self, uid: str, budget: float) -> bool:
        """One attempt; True when accounting recorded it (or can never record it)."""
        request = messages.BindPhaseRequest(
            pod_uid=uid, phase=keys.PHASE_FAILED, node=self.config.node
        )
        try:
            reply = await self.accounting.ask(request, messages.BindPhaseReply, budget)
        except AccountingUnavailable as exc:
            log.warning("bind-phase failed not recorded", extra={"error": outside_text(str(exc))})
            return False
        if reply.ok:
            return True
        log.warning(
            "bind-phase failed refused",
            extra={"code": _code_text(reply.code), "error": outside_text(reply.error or "")},
        )
        return _code(reply.code) not in RETRIED_BIND_PHASE

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
                f"{len(unknown)} unknown device ID(s): {outside_text(', '.join(unknown))}",
                invalid_argument=True,
            )
        known = self._take_admitting(len(gpus))
        if known is None:
            # No GetPreferredAllocation before this Allocate: kubelet may be handing an app
            # container the replicas of its pod's init container (device reuse).
            known = await self._reused(device_ids, gpus, deadline)
        request = await self._consume_request(gpus, known, deadline)
        try:
            # With the entry known, some of the call is kept for journalling it (a quarter of
            # a short budget, so that a consume is still asked).
            reserve = min(DEFER_RESERVE_S, deadline.remaining() / 4) if known else 0.0
            reply = await self._consume(request, deadline, reserve)
        except _Unrecorded as exc:
            if known is None:
                self.metrics.allocations.labels(exc.result).inc()
                raise AdmissionRefused(
                    f"{exc} (GetPreferredAllocation fetched no entry for this container, so "
                    "the plugin cannot answer without accounting)"
                ) from exc
            return await self._defer(known, gpus, exc, device_ids)
        try:
            if reply.container_devices is None:
                raise CoreError("no containerDevices")
            entry = codec.decode_container(reply.container_devices)
        except CoreError as exc:
            raise self._unusable(exc) from exc
        uid = reply.pod_uid or ""
        index = -1 if reply.container_index is None else reply.container_index
        self._allocated(uid, index, reply.container_name, device_ids)
        return container_allocation(entry, uid, reply.container_name or "", self.config.hami_core)

    async def _reused(
        self, device_ids: Sequence[str], gpus: Sequence[str], deadline: Deadline
    ) -> Admitting | None:
        """The pending entry of an app container kubelet gives replicas it already handed to
        the pod's init container (kubelet's device reuse: no GetPreferredAllocation is asked),
        its reservation moved onto those GPUs first when it is elsewhere, so that accounting
        records what runs without calling it a difference from the reservation. None when the
        replicas are not the pod's own (a container kubelet gave no choice: consumed as is)."""
        uid, handed = self._handed
        if not uid or not set(device_ids) <= handed or self._budget(deadline) < MIN_HOP_S:
            return None
        try:
            pending = await self.accounting.ask(
                messages.PendingRequest(node=self.config.node),
                messages.PendingReply,
                self._budget(deadline),
            )
        except AccountingUnavailable:
            return None  # the consume that follows says what is wrong
        pod = pending.pod
        if not pending.ok or not isinstance(pod, PendingPod) or pod.uid != uid:
            return None
        unrecorded = self.deferred.journal.indices(uid)
        entry = next((e for e in pod.entries if e.index not in unrecorded), None)
        try:
            reserved = codec.decode_container(entry.devices) if entry is not None else ()
        except CoreError:
            return None
        if entry is None or len(reserved) != len(gpus):
            return None
        where = {"pod": f"{pod.namespace}/{pod.name}", "container": entry.index}
        found = Admitting(
            uid, pod.namespace, pod.name, entry.index, entry.container_name, entry.devices
        )
        self.outcomes[(uid, entry.index)] = "reused"
        if {d.uuid for d in reserved} == set(gpus):
            self.metrics.init_reuses.labels("same").inc()
            log.info(
                "kubelet reused the init container's replicas",
                extra={**where, "devices": list(gpus)},
            )
            return found
        try:
            mode = parse_alignment(pod.numa_alignment) or Alignment.BEST_EFFORT
        except CoreError:
            mode = Alignment.BEST_EFFORT
        refit = messages.RefitRequest(
            pod_uid=uid,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            node_name=self.config.node,
            container_index=entry.index,
            container_name=entry.container_name or msgspec.UNSET,
            device_type=keys.NVIDIA,
            allowed_device_uuids=tuple(dict.fromkeys(gpus)),
            mode=mode.value,
            # The consume comes after it: keep its share of the call.
            timeout_ms=max(deadline.remaining_ms() - int(DEFER_RESERVE_S * 2000), 1),
        )
        answer = await self._ask(refit)
        reply = answer.reply
        if reply is not None and reply.succeeded and reply.container_devices:
            self.metrics.init_reuses.labels("moved").inc()
            log.info(
                "kubelet reused the init container's replicas; the reservation followed",
                extra={**where, "devices": list(gpus), "code": _code_text(reply.code)},
            )
            return dataclasses.replace(found, devices=reply.container_devices)
        self.metrics.init_reuses.labels("unmoved").inc()
        why = answer.failure or (reply.failure_reason if reply is not None else "") or "refused"
        log.warning(
            "kubelet reused the init container's replicas; the reservation could not follow, "
            "accounting records what runs",
            extra={**where, "devices": list(gpus), "why": outside_text(why or "")},
        )
        return found

    def _allocated(
        self,
        uid: str,
        index: int,
        container_name: str | None,
        device_ids: Sequence[str] = (),
    ) -> None:
        if uid:
            # What the pod's containers hold: an app container handed the same replicas
            # again is given its init container's devices (kubelet's reuse).
            held = self._handed[1] if self._handed[0] == uid else set()
            self._handed = (uid, held | set(device_ids))
        if (uid, index) in self.fallbacks:
            self.fallbacks.discard((uid, index))
            name = container_name if container_name is not None else str(index)
            self.fallback_containers.add((uid, name))
            self.metrics.set_fallback_containers(len(self.fallback_containers))
        self.metrics.allocations.labels("ok").inc()

    def _take_admitting(self, size: int) -> Admitting | None:
        """The entry the last GetPreferredAllocation fetched for the container kubelet now
        allocates (the next one, in order), when it is recent and of this many devices."""
        if not self._admitting:
            return None
        if time.monotonic() - self._admitting_at > KNOWN_FOR_S:
            self._admitting = []
            return None
        candidate = self._admitting.pop(0)
        try:
            reserved = codec.decode_container(candidate.devices)
        except CoreError:
            return None
        return candidate if len(reserved) == size else None

    async def _consume_request(
        self, gpus: Sequence[str], known: Admitting | None, deadline: Deadline
    ) -> messages.ConsumeRequest:
        """What to ask accounting. Without a name, consume takes the pending pod's first
        non-empty entry, which is right unless a journalled consumption of the node is still
        pending there: then the container is named (known), or the journal is replayed first
        within half the budget (unknown), else the Allocate cannot be told apart and fails."""
        request = messages.ConsumeRequest(devices=tuple(gpus), node=self.config.node)
        if not len(self.deferred):
            return request
        if known is not None:
            return msgspec.structs.replace(request, pod_uid=known.uid, container_index=known.index)
        if await self.deferred.replay_once(self._budget(deadline) / 2):
            return request
        self.metrics.allocations.labels("accounting_unavailable").inc()
        raise AdmissionRefused(
            f"cannot record the allocation: {len(self.deferred)} earlier consumption(s) of this "
            "node are not recorded by accounting yet, and GetPreferredAllocation fetched no "
            "entry for this container to name it"
        )

    async def _defer(
        self, known: Admitting, gpus: Sequence[str], why: _Unrecorded, device_ids: Sequence[str]
    ) -> ContainerAllocation:
        """Answer kubelet from the known entry and journal the consumption."""
        try:
            entry = _running_on(codec.decode_container(known.devices), gpus)
        except CoreError as exc:
            raise self._unusable(exc) from exc
        record = DeferredConsume(
            pod_uid=known.uid,
            pod_namespace=known.namespace,
            pod_name=known.name,
            container_index=known.index,
            container_name=known.container_name,
            devices=tuple(gpus),
            container_devices=codec.encode_container(entry),
            deferred_at=time.time(),
        )
        where = {"pod": f"{known.namespace}/{known.name}", "container": known.index}
        try:
            durable = await self.deferred.add(record)
        except JournalFull as exc:
            self.metrics.journal_errors.labels("full").inc()
            self.metrics.allocations.labels(why.result).inc()
            log.error("consume journal full", extra={**where, "error": str(exc)})
            raise AdmissionRefused(f"{why} ({exc})") from exc
        self.metrics.consume_deferred.labels(why.reason).inc()
        log.warning(
            "consume deferred: Allocate answered from the pending entry, accounting is told later",
            extra={
                **where,
                "pod_uid": known.uid,
                "devices": list(gpus),
                "reason": why.reason,
                "error": outside_text(str(why)),
                "journalled": durable,
            },
        )
        self._allocated(known.uid, known.index, known.container_name, device_ids)
        return container_allocation(entry, known.uid, known.container_name, self.config.hami_core)

    def _unusable(self, exc: Exception) -> AdmissionRefused:
        self.metrics.allocations.labels("unusable_reply").inc()
        return AdmissionRefused(f"accounting sent an unusable entry: {outside_text(str(exc))}")

    async def _consume(
        self, request: messages.ConsumeRequest, deadline: Deadline, reserve: float
    ) -> messages.ConsumeReply:
        """Ask accounting to consume the entry, leaving `reserve` seconds of the budget. A
        `conflict` means the pod changed under accounting, which re-read it: asked again while
        the budget allows. No answer, `node_unavailable` and `deadline_exceeded` are
        `_Unrecorded`; every other refusal fails the Allocate with accounting's code and (cut)
        reason."""
        for attempt in range(1, CONSUME_ATTEMPTS + 1):
            budget = min(self.config.accounting_timeout, deadline.remaining() - reserve)
            if budget < MIN_HOP_S:
                raise _Unrecorded(
                    "cannot record the allocation: the call's "
                    f"{self.config.refit_timeout_ms} ms budget is spent",
                    "deadline_exceeded",
                    "deadline_exceeded",
                )
            try:
                reply = await self.accounting.ask(request, messages.ConsumeReply, budget)
            except AccountingUnavailable as exc:
                if _unreadable(exc):
                    raise self._unusable(exc) from exc
                raise _Unrecorded(
                    f"cannot record the allocation: {outside_text(str(exc))}",
                    "accounting_unavailable",
                    "accounting_unavailable",
                ) from exc
            if reply.ok:
                return reply
            code, shown_code = _code(reply.code), _code_text(reply.code)
            error = outside_text(reply.error or "")
            if code is Code.CONFLICT and attempt < CONSUME_ATTEMPTS:
                log.info("consume conflict; asking again", extra={"attempt": attempt})
                continue
            log.warning(
                "allocation refused by accounting", extra={"code": shown_code, "error": error}
            )
            message = f"allocation refused by accounting ({shown_code}): {error}"
            if code is not None and code in DEFERRED_CODES:
                raise _Unrecorded(message, allocation_result(code), code.value)
            self.metrics.allocations.labels(allocation_result(code)).inc()
            raise AdmissionRefused(message)
        raise AssertionError("unreachable")  # pragma: no cover

    def forget_pods(self, alive: set[str]) -> None:
        """Drop what is kept per pod (fallback containers, refit outcomes) for pods
        accounting no longer tracks, so a long-running plugin does not grow."""
        self.fallback_containers = {m for m in self.fallback_containers if m[0] in alive}
        self.fallbacks = {f for f in self.fallbacks if f[0] in alive}
        self.outcomes = {k: v for k, v in self.outcomes.items() if k[0] in alive}
        if self._handed[0] not in alive:
            self._handed = ("", set())
        self.metrics.set_fallback_containers(len(self.fallback_containers))


def _running_on(reserved: ContainerEntry, gpus: Sequence[str]) -> ContainerEntry:
    """The entry as it runs on `gpus`, as accounting's consume records it
    (`shared.core.consume.plan_consume`): each reserved amount stays on its GPU when kubelet
    gave that GPU, and the others' amounts go, in order, to the GPUs kubelet gave instead."""
    if len(gpus) != len(reserved) or len(set(gpus)) != len(gpus):
        raise CoreError(
            f"Allocate of {len(gpus)} device(s) does not match the pending entry of {len(reserved)}"
        )
    if {d.uuid for d in reserved} == set(gpus):
        return reserved  # no drift: the reservation as it stands, in its own order
    kept = {d.uuid: d for d in reserved}
    spare = iter([d for d in reserved if d.uuid not in gpus])
    running = []
    for uuid in gpus:
        device = kept[uuid] if uuid in kept else next(spare)
        running.append(ContainerDevice(uuid, device.type, device.usedmem, device.usedcores))
    return tuple(running)


def _unreadable(exc: AccountingUnavailable) -> bool:
    """Accounting answered, but with a reply that does not decode."""
    return isinstance(exc.__cause__, messages.MessageError)


def _code(text: str) -> Code | None:
    """A reply's code; None for one this build does not know (a newer peer's)."""
    try:
        return Code(text)
    except ValueError:
        return None


def _code_text(text: str) -> str:
    """A reply's code for messages, logs and outcomes: bounded."""
    return text if text and len(text) <= 64 else "unknown"
