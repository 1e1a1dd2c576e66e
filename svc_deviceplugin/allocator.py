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

import logging
import time
from typing import TYPE_CHECKING

import msgspec

from shared import messages
from shared.accounting_client import AccountingClient, AccountingUnavailable
from shared.core import codec, keys
from shared.core.errors import CoreError
from shared.core.pods import Alignment, parse_alignment
from shared.core.replicas import (
    ReplicaMismatch,
    SelectionError,
    physical_ids,
    select_replicas,
)
from shared.messages import PendingEntry, PendingPod, RefitReply
from shared.service.lifecycle import Deadline
from shared.subjects import shown
from svc_deviceplugin.admitting import DEFER_RESERVE_S, Admitting, follow_reuse
from svc_deviceplugin.bind_failed import BindFailures
from svc_deviceplugin.consume import Unrecorded, consume, running_on, unusable
from svc_deviceplugin.deferred import DeferredConsumes
from svc_deviceplugin.environment import ContainerAllocation, container_allocation
from svc_deviceplugin.hops import (
    MIN_HOP_S,
    AdmissionRefused,
    RefitAnswer,
    ask_refit,
    code_text,
    outside_text,
    unreadable,
)
from svc_deviceplugin.journal import ConsumeJournal, DeferredConsume, JournalFull
from svc_deviceplugin.judge import ContainerPreference, Judged, distinct, judge_offered
from svc_deviceplugin.outcome import EFFECTS, PreferredOutcome, Then, decide, judged, mode_label

if TYPE_CHECKING:
    from collections.abc import Sequence

    from nats.aio.client import Client

    from shared.service.supervisor import Supervisor
    from svc_deviceplugin.config import PluginConfig
    from svc_deviceplugin.metrics import PluginMetrics

log = logging.getLogger("numafit.deviceplugin")

KNOWN_FOR_S = 10.0
"""How long after GetPreferredAllocation its entries may answer an Allocate: kubelet calls
Allocate right after it, so an older one belongs to an admission that went no further."""
FALLBACK_RESERVE_S = 0.25
"""Seconds of a best-effort container's budget kept back from its refit, so that kubelet's GPUs
can still be judged (the fallback rule, on a snapshot of accounting's usage) should the refit
not move the reservation (a quarter of a shorter budget)."""


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
        self.bind_failures = BindFailures(
            self.accounting, config.node, config.accounting_timeout, tasks
        )
        """Records bind-phase `failed` when an admission fails (bind_failed.py)."""
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
        nothing = [distinct(r, self.known) for r in requests]
        budget = self._budget(deadline)
        if budget < MIN_HOP_S:
            log.warning("no preference: the call's budget is spent")
            return nothing
        request = messages.PendingRequest(node=self.config.node)
        try:
            pending = await self.accounting.ask(request, messages.PendingReply, budget)
        except AccountingUnavailable as exc:
            what = "an unusable pending reply" if unreadable(exc) else "accounting unreachable"
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
                else distinct(container, self.known)
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
            return distinct(request, self.known)
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
            answer = await ask_refit(self.nc, refit, self.config.refit_timeout_ms)
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
        code = code_text(reply.code) if reply is not None else "unknown"
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
        found = await judge_offered(
            self.accounting,
            self.config.node,
            self.known,
            pod,
            entry,
            request,
            self._budget(deadline),
        )
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
            found = Judged(distinct(request, self.known), source="distinct")
        self.metrics.preferences.labels(found.source if found.selection else "none").inc()
        return await self._settle(
            outcome, mode, pod, entry, where, deadline, found.selection, detail=detail, code=code
        )

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
            await self.bind_failures.record(pod.uid, self._budget(deadline))
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

    def _map_committed(self, reply: RefitReply, request: ContainerPreference) -> list[str]:
        """kubelet's replicas for the committed move (`CoreError`, `SelectionError`: none)."""
        moved = [d.uuid for d in codec.decode_container(reply.container_devices or "")]
        if not moved:
            raise SelectionError("empty containerDevices")
        return select_replicas(request.available, request.required, moved, request.size, self.known)

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
            reply = await consume(
                self.accounting,
                request,
                deadline,
                reserve,
                accounting_timeout=self.config.accounting_timeout,
                call_ms=self.config.refit_timeout_ms,
                metrics=self.metrics,
            )
        except Unrecorded as exc:
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
            raise unusable(exc, self.metrics) from exc
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
        found = Admitting(
            uid, pod.namespace, pod.name, entry.index, entry.container_name, entry.devices
        )
        self.outcomes[(uid, entry.index)] = "reused"
        return await follow_reuse(
            self.nc, self.config, self.metrics, found, pod.numa_alignment, reserved, gpus, deadline
        )

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
        self, known: Admitting, gpus: Sequence[str], why: Unrecorded, device_ids: Sequence[str]
    ) -> ContainerAllocation:
        """Answer kubelet from the known entry and journal the consumption."""
        try:
            entry = running_on(codec.decode_container(known.devices), gpus)
        except CoreError as exc:
            raise unusable(exc, self.metrics) from exc
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

    def forget_pods(self, alive: set[str]) -> None:
        """Drop what is kept per pod (fallback containers, refit outcomes) for pods
        accounting no longer tracks, so a long-running plugin does not grow."""
        self.fallback_containers = {m for m in self.fallback_containers if m[0] in alive}
        self.fallbacks = {f for f in self.fallbacks if f[0] in alive}
        self.outcomes = {k: v for k, v in self.outcomes.items() if k[0] in alive}
        if self._handed[0] not in alive:
            self._handed = ("", set())
        self.metrics.set_fallback_containers(len(self.fallback_containers))
