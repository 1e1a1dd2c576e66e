"""The extender's three verbs: filter (fit, pick, reserve), prioritize, bind.

Filter is where the decision happens, as in HAMi: the pod is fitted phase-aware on every
candidate node from the read model, one node is picked by the node policy, and accounting is
asked to *reserve* at the revision the decision was computed on. A `conflict` (the node changed
meanwhile) refreshes that node and decides again, a bounded number of times within the request
budget. The answer keeps only the reserved node; every node that cannot hold the pod is listed
in `FailedNodes` with HAMi's reason (e.g. `1/2 CardInsufficientMemory`), which kube-scheduler
folds into the pod's FailedScheduling event, so `kubectl describe pod` says why it is Pending.

A pod scheduled again (its earlier reservation is in its annotations) is not counted against
itself: its reservation, as accounting holds it, is taken out of that node's usage and out of
its namespace's quota usage before fitting. Accounting's reserve replaces it.

Accounting *holds* a filter's reservation in its ledger (published to every reader at once, so
concurrent filters see it) without writing the pod. Bind asks accounting for bind-phase
`allocating` with `bind`: accounting creates the pod's Binding carrying the whole reservation
(vgpu-node, vgpu-time, both allocation annotations, bind-phase, bind-time) as annotations,
guarded by the pod's uid and resourceVersion: one API write per scheduled pod, and the pod is
never bound without its reservation nor reserved without being bound. The extender writes
nothing to pods itself. A reservation accounting no longer holds (it expired unbound, or
accounting restarted) fails the bind cleanly and kube-scheduler schedules the pod again.

Only pods of numafit's own scheduler names are scheduled. kube-scheduler calls an extender for
every profile it runs, and anyone reaching the port can call it: a GPU pod of another
scheduler gets an `Error` from /filter (nothing is reserved) and from /bind (nothing is
written, released or bound), and /prioritize scores it 0 everywhere; a pod asking for no GPU is
passed through whatever its scheduler, as before (nothing is held for it). Bind reads the pod
named by ExtenderBindingArgs before asking accounting anything (as HAMi's bind does): its
schedulerName must be numafit's and its UID the one given, so a bind naming one pod by name and
another by UID never touches the reservation of the pod owning that UID.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from shared import subjects
from shared.accounting_client import REPLY_MARGIN, AccountingClient, AccountingUnavailable
from shared.codes import SCHEDULER_RETRY, Code
from shared.core import codec, keys
from shared.core.accounting import TrackedPod, total
from shared.core.config import CoreConfig
from shared.core.errors import CoreError
from shared.core.fit import RESOURCE_QUOTA_NOT_FIT, fit_options
from shared.core.model import Usage
from shared.core.nodes import (
    MAX_EXTENDER_PRIORITY,
    extender_priority,
    parse_node_policy,
)
from shared.core.pods import PodInfo, pod_from_object
from shared.core.quota import QuotaLedger, QuotaProbe
from shared.core.requests import ContainerRequest, pod_requests
from shared.core.webhook_rules import (
    DEFAULT_SCHEDULER_NAME,
    other_scheduler_message,
    pod_scheduler_name,
)
from shared.messages import (
    MessageError,
    ReserveReply,
    ReserveRequest,
)
from shared.service.events import EventRecorder
from shared.service.lifecycle import Deadline
from shared.service.supervisor import Supervisor
from svc_scheduler.extender_bind import OTHER_SCHEDULER, Binder
from svc_scheduler.extender_locks import NodeGates, PendingBinds
from svc_scheduler.extender_place import Placer
from svc_scheduler.extender_recent import Recent
from svc_scheduler.extender_wire import (
    BindingArgs,
    BindingResult,
    ExtenderArgs,
    ExtenderFilterResult,
    HostPriority,
    error_filter_result,
    filter_result,
    host_priority_list,
)
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.node_watch import NodeKubelets
from svc_scheduler.topology import TopologyState

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.core.nodes import Placement
    from shared.service.kube_io import Kube
    from svc_scheduler.read_model import NodeView, ReadModel

log = logging.getLogger("numafit.scheduler")

DEFAULT_REQUEST_TIMEOUT = 4.0
"""Seconds one verb may take: under kube-scheduler's default 5 s extender httpTimeout."""
MAX_ATTEMPTS = 5
"""Decisions per filter: the first plus recomputations after a lost revision race."""
EVENT_TIMEOUT = 2.0
"""Longest an Event write may take (events are best effort, off the request path)."""
REMEMBERED_RESERVATIONS = 4096
"""Recent reservations remembered for /prioritize (the pod kube-scheduler sends there predates
the annotations its own filter wrote)."""
REMEMBERED_DEFERRALS = 4096
"""Pods whose filter deferred its refusal to their bind (the reason is shown from there)."""

# Filter results (metric label values); OTHER_SCHEDULER (extender_bind.py) is one too.
FIT, NO_FIT, NOT_GPU, ERROR = "fit", "no_fit", "not_gpu", "error"
DEFERRED = "deferred"
"""A transient refusal answered through the bind (kube-scheduler then backs the pod off)."""
RETRY_CODES: Final[frozenset[Code]] = SCHEDULER_RETRY
"""Refusals that mean the read model was behind accounting's ledger: recompute on fresh state
(`no_fit`: accounting's own fit re-check found the space taken by a concurrent commit)."""
TRANSIENT_CODES: Final[frozenset[Code]] = frozenset({Code.DEADLINE_EXCEEDED, Code.API_ERROR})
"""Other reserve refusals that clear by themselves (the API server slow or failing while
accounting read the pod): deferred to the bind, so kube-scheduler backs the pod off."""


class FilterError(Exception):
    """The filter cannot decide: answered with `Error`, which fails this scheduling attempt."""


class TransientRefusal(FilterError):
    """The pod cannot be placed now for a reason that clears by itself (accounting not
    answering, a namespace quota that may be raised or freed, lost races): answered by keeping
    one node (`node`, else the first candidate) and failing the pod's bind with the reason,
    because kube-scheduler backs off a pod whose bind failed, while it parks one its filter
    refused until an unrelated cluster event."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


class Extender:
    def __init__(
        self,
        read_model: ReadModel,
        accounting: AccountingClient,
        kube: Kube | None,
        *,
        config: CoreConfig | None = None,
        metrics: SchedulerMetrics | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_attempts: int = MAX_ATTEMPTS,
        supervisor: Supervisor | None = None,
        topology: TopologyState | None = None,
        scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER_NAME,),
        kubelets: NodeKubelets | None = None,
    ) -> None:
        self.read_model = read_model
        self.accounting = accounting
        self.kube = kube
        self.config = config or CoreConfig()
        self.metrics = metrics or SchedulerMetrics()
        self.request_timeout = request_timeout
        self.max_attempts = max_attempts
        if not scheduler_names:
            raise ValueError("the extender needs at least one scheduler name")
        self.scheduler_names = scheduler_names
        """The kube-scheduler profiles numafit schedules for: the only pods reserved or bound."""
        self._reserved = Recent(REMEMBERED_RESERVATIONS)
        """Pod UID -> the node this extender reserved it on (for prioritize and the bind)."""
        self._deferred = Recent(REMEMBERED_DEFERRALS)
        """Pod UID -> the transient refusal its last filter deferred to its bind."""
        self.gates = NodeGates()
        """Binds waiting for a node's lock, one at a time per node (extender_locks.py)."""
        self.pending_binds = PendingBinds()
        """Nodes with a reservation of this extender's whose bind is still to come: about to
        lock, so other pods prefer nodes without one."""
        if hasattr(read_model, "on_change"):
            read_model.on_change = self.gates.changed
        self.topology = topology if topology is not None else TopologyState()
        """NUMA figures from NodeResourceTopology, for predicting kubelet's choice (fed by the
        service's watch; without one no node has figures and nothing is predicted)."""
        self.kubelets = kubelets if kubelets is not None else NodeKubelets()
        """Each Node's kubelet version (fed by the service's node watch): a node whose kubelet
        would reject the pod itself is left out for it (shared/core/kubelet_version.py)."""
        self.placer = Placer(read_model, self.topology, self.pending_binds, self.metrics)
        """The node policy's pick, on cached fits and NUMA predictions (extender_place.py)."""
        self.events = EventRecorder(
            kube,
            supervisor if supervisor is not None else Supervisor("extender"),
            timeout=EVENT_TIMEOUT,
            task_name="scheduler-event",
            logger=log,
        )
        """Events (BindingFailed) recorded off the request path by the service's supervisor
        (the stop bounds them); with no supervisor given, none is recorded."""
        self.binder = Binder(
            accounting=accounting,
            kube=kube,
            read_model=read_model,
            gates=self.gates,
            pending_binds=self.pending_binds,
            events=self.events,
            reserved=self._reserved,
            deferred=self._deferred,
            scheduler_names=scheduler_names,
            request_timeout=request_timeout,
        )

    # --- filter -----------------------------------------------------------------------------

    async def filter(self, args: ExtenderArgs) -> tuple[ExtenderFilterResult, str]:
        """The `ExtenderFilterResult` and the metric result label."""
        try:
            pod = pod_from_object(args.pod)
            subjects.check_pod(pod.namespace, pod.name, pod.uid)
            requests = pod_requests(pod, self.config)
        except (CoreError, subjects.InvalidName) as exc:
            return error_filter_result(args, f"numafit cannot read the pod: {exc}"), ERROR
        try:
            check_node_names(args.names)
        except subjects.InvalidName as exc:
            return error_filter_result(args, str(exc)), ERROR
        if all(r is None for r in requests):
            return filter_result(args, list(args.names)), NOT_GPU
        refusal = self._other_scheduler(args.pod, pod)
        if refusal is not None:
            # Before anything is read or reserved: a hold for it would take GPUs from
            # numafit's own pods, renewed by every filter its scheduler sends.
            log.info("pod of another scheduler refused", extra={"pod": pod.key})
            return error_filter_result(args, refusal), OTHER_SCHEDULER
        try:
            return await self._filter_gpu_pod(args, pod, requests)
        except TransientRefusal as exc:
            node = exc.node if exc.node in args.names else None
            node = node or next(iter(args.names), None)
            if node is None:
                return error_filter_result(args, str(exc)), ERROR
            self._deferred.put(pod.uid, str(exc))
            log.info(
                "refusal deferred to the bind",
                extra={"pod": pod.key, "node": node, "error": str(exc)},
            )
            return filter_result(args, [node]), DEFERRED
        except FilterError as exc:
            log.info("filter failed", extra={"pod": pod.key, "error": str(exc)})
            return error_filter_result(args, str(exc)), ERROR

    async def _filter_gpu_pod(
        self, args: ExtenderArgs, pod: PodInfo, requests: list[ContainerRequest | None]
    ) -> tuple[ExtenderFilterResult, str]:
        try:
            options = fit_options(pod.annotations, self.config)
        except CoreError as exc:
            raise FilterError(f"numafit cannot schedule pod {pod.key}: {exc}") from exc
        policy = parse_node_policy(pod.annotations, self.config)
        rejected = self._kubelet_rejections(pod, args.names)
        names = tuple(n for n in args.names if n not in rejected)
        if not names:
            return filter_result(args, [], rejected), NO_FIT
        deadline = Deadline.after_ms(self.request_timeout * 1000)
        confirmed = False
        for attempt in range(1, self.max_attempts + 1):
            tracked, quota, views = await self._state(pod, names, deadline)
            probe = _quota_probe(quota, tracked, pod)
            placement = self.placer.place(
                names, views, tracked, pod, requests, options, policy, probe
            )
            refused = {**rejected, **placement.refused}
            doubtful = self.read_model.unconfirmed(placement.refused)
            if placement.chosen is None and doubtful and not confirmed:
                # A refusal must not rest on a view that may hide a change (an uncordoned GPU,
                # say): those nodes are fetched, and the pod decided again.
                for name in doubtful:
                    self.read_model.invalidate(name)
                confirmed = True
                continue
            if placement.chosen is None:
                if probe is not None:
                    unlimited = self.placer.place(
                        names, views, tracked, pod, requests, options, policy, assume=False
                    )
                    _refuse_quota_alone(pod, placement, unlimited)
                log.info(
                    "pod fits no node",
                    extra={
                        "pod": pod.key,
                        "nodes": len(placement.refused),
                        "refused": dict(list(refused.items())[:8]),
                    },
                )
                return filter_result(args, [], refused), NO_FIT
            chosen = placement.chosen
            chosen_view = views[chosen]
            assert chosen_view is not None  # a node with a snapshot has a view
            code, reply = await self._reserve(
                pod, chosen, chosen_view, codec.encode_pod(placement.rows), deadline
            )
            if code is Code.OK:
                self._reserved_on(pod, chosen, reply)
                log.info(
                    "pod reserved",
                    extra={
                        "pod": pod.key,
                        "node": chosen,
                        "revision": chosen_view.revision,
                        "attempt": attempt,
                        "policy": policy.value,
                    },
                )
                return filter_result(args, [chosen], refused), FIT
            self._lost_reserve(pod, chosen, code, reply)
        raise TransientRefusal(
            f"pod {pod.key}: every reservation lost a race with another change "
            f"({self.max_attempts} attempts); retried with backoff"
        )

    def _kubelet_rejections(self, pod: PodInfo, names: tuple[str, ...]) -> dict[str, str]:
        """Nodes whose kubelet would reject the pod after its GPUs were allocated (init
        containers asking for resources no plugin advertises, kubelet before v1.31)."""
        return {
            name: why.filter_reason()
            for name, why in self.kubelets.rejections(
                pod, names, (self.config.resource_count_name,)
            ).items()
        }

    def _reserved_on(self, pod: PodInfo, node: str, reply: ReserveReply) -> None:
        """Bookkeeping of a reservation accounting holds."""
        if reply.revision is not None:
            self.read_model.expect(node, reply.revision)
        self._reserved.put(pod.uid, node)
        self._deferred.pop(pod.uid)
        if not pod.node_name:  # a bound pod's bind does not come again
            self.pending_binds.add(pod.uid, pod.key, node)

    def _lost_reserve(self, pod: PodInfo, node: str, code: Code, reply: ReserveReply) -> None:
        """A refused reserve: what was stale is refreshed for the next attempt, or the
        refusal is raised (transient ones deferred to the bind)."""
        if code not in RETRY_CODES:
            error = (
                f"accounting refused to reserve pod {pod.key} on {node}: {code}: "
                f"{(reply.error or '')[:300]}"
            )
            if code in TRANSIENT_CODES:
                raise TransientRefusal(error, node)
            raise FilterError(error)
        if code is Code.QUOTA_EXCEEDED:
            self.read_model.forget_quota(pod.namespace)
        else:
            self.read_model.invalidate(node)

    def _other_scheduler(self, obj: Mapping[str, Any], pod: PodInfo) -> str | None:
        """Why the pod is not numafit's to schedule, or None when its schedulerName is."""
        name = pod_scheduler_name(obj)
        if name in self.scheduler_names:
            return None
        return other_scheduler_message(pod.key, name, self.scheduler_names)

    async def _state(
        self, pod: PodInfo, names: tuple[str, ...], deadline: Deadline
    ) -> tuple[TrackedPod | None, QuotaLedger | None, dict[str, NodeView | None]]:
        """The pod's own earlier reservation, its namespace's quota and the candidates' views,
        fresh enough to decide on."""
        # The pod's earlier reservation: held by accounting (this replica made it) or written
        # to the pod by an earlier bind.
        previous = self._reserved.get(pod.uid) or (
            pod.annotations.get(keys.VGPU_NODE, "") if keys.ALLOCATED in pod.annotations else ""
        )
        quota = self.read_model.cached_quota(pod.namespace)
        tracked = None
        # The quota rides along a node snapshot: ask on a node accounting knows, never on a
        # name from the request that may be made up.
        anchor = previous or next((n for n in names if self.read_model.view(n) is not None), "")
        try:
            if anchor and subjects.valid_name(anchor) and (previous or quota is None):
                context = await self.read_model.context(
                    anchor,
                    pod_uid=pod.uid if previous else None,
                    namespace=pod.namespace if quota is None else None,
                    budget=self._budget(deadline),
                )
                tracked = context.tracked
                quota = context.quota if quota is None else quota
            views = await self.read_model.views(names, self._budget(deadline))
        except AccountingUnavailable as exc:
            raise TransientRefusal(f"accounting unavailable: {exc}", previous or None) from exc
        except MessageError as exc:
            raise FilterError(f"bad snapshot from accounting: {exc}") from exc
        if tracked is not None and tracked.uid != pod.uid:
            tracked = None
        return tracked, quota, views

    def _budget(self, deadline: Deadline) -> float:
        budget = deadline.remaining() - REPLY_MARGIN
        if budget <= 0:
            raise TransientRefusal("the filter's time budget ran out; retried with backoff")
        return budget

    async def _reserve(
        self, pod: PodInfo, node: str, view: NodeView, allocated: str, deadline: Deadline
    ) -> tuple[Code, ReserveReply]:
        request = ReserveRequest(
            pod_uid=pod.uid,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            revision=view.revision,
            epoch=view.epoch or None,  # fencing: the revision counts in this epoch only
            allocated=allocated,
            node=node,
        )
        try:
            reply = await self.accounting.ask(request, ReserveReply, self._budget(deadline))
        except AccountingUnavailable as exc:
            self.metrics.reserve_attempts.labels("unavailable").inc()
            # The reservation may have landed: the bind on this node finds out.
            raise TransientRefusal(f"reserve on {node} unanswered: {exc}", node) from exc
        code = Code.OK if reply.ok else Code.parse(reply.code)
        self.metrics.reserve_attempts.labels(code.value).inc()
        return code, reply

    # --- prioritize -------------------------------------------------------------------------

    async def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        """`HostPriorityList` (0..10). A pod this scheduler reserved gets 10 on its node and 0
        elsewhere (only there are its GPUs reserved); otherwise each node is scored by the
        node policy after placing the pod on it (0 where it does not fit)."""
        scores = dict.fromkeys(args.names, 0)
        names = subjects.valid_names(args.names)  # others can only score 0
        try:
            pod = pod_from_object(args.pod)
            requests = pod_requests(pod, self.config)
            options = fit_options(pod.annotations, self.config)
        except CoreError:
            return host_priority_list(scores)
        if all(r is None for r in requests) or self._other_scheduler(args.pod, pod) is not None:
            return host_priority_list(scores)
        reserved = self._reserved.get(pod.uid) or (
            pod.annotations.get(keys.VGPU_NODE) if keys.ALLOCATED in pod.annotations else None
        )
        if reserved in scores:
            scores[reserved] = MAX_EXTENDER_PRIORITY
            return host_priority_list(scores)
        policy = parse_node_policy(pod.annotations, self.config)
        deadline = Deadline.after_ms(self.request_timeout * 1000)
        try:
            views = await self.read_model.views(names, self._budget(deadline))
        except (AccountingUnavailable, MessageError, FilterError):
            return host_priority_list(scores)
        placement = self.placer.place(
            tuple(views), views, None, pod, requests, options, policy, assume=False
        )
        for name, score in placement.scores.items():
            scores[name] = extender_priority(score, policy)
        return host_priority_list(scores)

    # --- bind -------------------------------------------------------------------------------

    async def bind(self, args: BindingArgs) -> tuple[BindingResult, str]:
        """`ExtenderBindingResult` and the metric result label (extender_bind.py)."""
        return await self.binder.bind(args)


def _quota_probe(
    quota: QuotaLedger | None, tracked: TrackedPod | None, pod: PodInfo
) -> QuotaProbe | None:
    """The namespace's quota check for the fit, without the pod's own earlier reservation;
    None when the namespace has no GPU quota."""
    if quota is None or not quota.limited(pod.namespace):
        return None
    exclude = total(tracked.usage) if tracked is not None else Usage()
    return QuotaProbe(quota, pod.namespace, pod.kinds, False, exclude)


def _refuse_quota_alone(pod: PodInfo, placement: Placement, unlimited: Placement) -> None:
    """Refused by the namespace's quota alone (the pod fits once it is not counted)? That
    clears when the quota is raised or another pod of the namespace leaves, neither of which
    kube-scheduler requeues the pod for: back it off instead (a transient refusal)."""
    if unlimited.chosen is None:
        return
    raise TransientRefusal(
        f"{RESOURCE_QUOTA_NOT_FIT}: pod {pod.key} does not fit namespace "
        f"{pod.namespace}'s GPU quota now ("
        + ", ".join(sorted(set(placement.refused.values())))[:300]
        + "); retried with backoff",
        unlimited.chosen,
    )


def check_node_names(names: tuple[str, ...]) -> None:
    """Every candidate must be a Kubernetes node name before any becomes a subject token."""
    if subjects.all_valid_names(names):
        return
    for i, name in enumerate(names):  # the first invalid one, for the error
        subjects.check_name(name, f"NodeNames[{i}]")
