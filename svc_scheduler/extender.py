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

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final

from shared import subjects
from shared.accounting_client import REPLY_MARGIN, AccountingClient, AccountingUnavailable
from shared.codes import SCHEDULER_RETRY, Code
from shared.core import codec, keys
from shared.core.accounting import TrackedPod, total
from shared.core.config import CoreConfig
from shared.core.errors import CoreError
from shared.core.fit import RESOURCE_QUOTA_NOT_FIT, FitOptions, fit_options
from shared.core.model import NodeSnapshot, Usage
from shared.core.nodes import (
    MAX_EXTENDER_PRIORITY,
    FitCache,
    NodePolicy,
    Placement,
    extender_priority,
    parse_node_policy,
    place_pod,
    without_pod,
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
    BindPhaseReply,
    BindPhaseRequest,
    MessageError,
    ReserveReply,
    ReserveRequest,
)
from shared.service import kube_io
from shared.service.events import EventRecorder
from shared.service.lifecycle import Deadline
from shared.service.supervisor import Supervisor
from svc_scheduler.extender_locks import NodeGates, PendingBinds
from svc_scheduler.extender_wire import (
    BindingArgs,
    BindingResult,
    ExtenderArgs,
    ExtenderFilterResult,
    HostPriority,
    binding_result,
    error_filter_result,
    filter_result,
    host_priority_list,
)
from svc_scheduler.metrics import SchedulerMetrics
from svc_scheduler.node_watch import NodeKubelets
from svc_scheduler.topology import TopologyState

if TYPE_CHECKING:
    from collections.abc import Hashable, Mapping

    from shared.service.kube_io import Kube
    from svc_scheduler.read_model import NodeView, ReadModel
    from svc_scheduler.topology import NodePrediction

log = logging.getLogger("numafit.scheduler")

DEFAULT_REQUEST_TIMEOUT = 4.0
"""Seconds one verb may take: under kube-scheduler's default 5 s extender httpTimeout."""
MAX_ATTEMPTS = 5
"""Decisions per filter: the first plus recomputations after a lost revision race."""
FAILURE_RESERVE = 0.3
"""Seconds of a bind's budget kept back for recording `failed` when the pod could not be bound,
so the node's lock is released within the same deadline."""
EVENT_TIMEOUT = 2.0
"""Longest an Event write may take (events are best effort, off the request path)."""
FIT_CACHE_PRUNE_EVERY = 1024
"""Placements between two prunes of the fit cache (of nodes the read model no longer has)."""
REMEMBERED_RESERVATIONS = 4096
"""Recent reservations remembered for /prioritize (the pod kube-scheduler sends there predates
the annotations its own filter wrote)."""

LOCK_WAIT_RESERVE = 1.0
"""Seconds of a bind's budget a wait for the node's lock leaves for the rest: accounting's
guarded Binding (the reservation on it), and recording `failed` if the pod was not bound."""
REMEMBERED_DEFERRALS = 4096
"""Pods whose filter deferred its refusal to their bind (the reason is shown from there)."""

# Filter results (metric label values); OTHER_SCHEDULER is a bind result too.
FIT, NO_FIT, NOT_GPU, ERROR = "fit", "no_fit", "not_gpu", "error"
DEFERRED = "deferred"
"""A transient refusal answered through the bind (kube-scheduler then backs the pod off)."""
LOCK_WAIT_TIMEOUT = "lock_wait_timeout"
"""A bind that waited its whole budget for the node's lock (bind result label)."""
OTHER_SCHEDULER = "other_scheduler"
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
        self._reserved: OrderedDict[str, str] = OrderedDict()
        self._deferred: OrderedDict[str, str] = OrderedDict()
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
        self.fit_cache = FitCache()
        """Per-node fit outcomes by (node revision, snapshot, pod shape): unchanged nodes are
        not fitted again by the next filter (shared/core/nodes.py)."""
        self._placements = 0
        self.events = EventRecorder(
            kube,
            supervisor if supervisor is not None else Supervisor("extender"),
            timeout=EVENT_TIMEOUT,
            task_name="scheduler-event",
            logger=log,
        )
        """Events (BindingFailed) recorded off the request path by the service's supervisor
        (the stop bounds them); with no supervisor given, none is recorded."""

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
            self._defer(pod.uid, str(exc))
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
        # Nodes whose kubelet would reject the pod after its GPUs were allocated (init
        # containers asking for resources no plugin advertises, kubelet before v1.31).
        rejected = {
            name: why.filter_reason()
            for name, why in self.kubelets.rejections(
                pod, args.names, (self.config.resource_count_name,)
            ).items()
        }
        names = tuple(n for n in args.names if n not in rejected)
        if not names:
            return filter_result(args, [], rejected), NO_FIT
        deadline = Deadline.after_ms(self.request_timeout * 1000)
        confirmed = False
        for attempt in range(1, self.max_attempts + 1):
            tracked, quota, views = await self._state(pod, names, deadline)
            probe = None
            if quota is not None and quota.limited(pod.namespace):
                exclude = total(tracked.usage) if tracked is not None else Usage()
                probe = QuotaProbe(quota, pod.namespace, pod.kinds, False, exclude)
            placement = self._place(names, views, tracked, pod, requests, options, policy, probe)
            refused = {**rejected, **placement.refused}
            doubtful = self.read_model.unconfirmed(placement.refused)
            if placement.chosen is None and doubtful and not confirmed:
                # A refusal must not rest on a view that may hide a change (an uncordoned GPU,
                # say): those nodes are fetched, and the pod decided again.
                for name in doubtful:
                    self.read_model.invalidate(name)
                confirmed = True
                continue
            if placement.chosen is None and probe is not None:
                # Refused by the namespace's quota alone (the pod fits once it is not counted)?
                # That clears when the quota is raised or another pod of the namespace leaves,
                # neither of which kube-scheduler requeues the pod for: back it off instead.
                unlimited = self._place(
                    names, views, tracked, pod, requests, options, policy, assume=False
                )
                if unlimited.chosen is not None:
                    raise TransientRefusal(
                        f"{RESOURCE_QUOTA_NOT_FIT}: pod {pod.key} does not fit namespace "
                        f"{pod.namespace}'s GPU quota now ("
                        + ", ".join(sorted(set(placement.refused.values())))[:300]
                        + "); retried with backoff",
                        unlimited.chosen,
                    )
            if placement.chosen is None:
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
                if reply.revision is not None:
                    self.read_model.expect(chosen, reply.revision)
                self._remember(pod.uid, chosen)
                self._deferred.pop(pod.uid, None)
                if not pod.node_name:  # a bound pod's bind does not come again
                    self.pending_binds.add(pod.uid, pod.key, chosen)
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
            if code not in RETRY_CODES:
                error = (
                    f"accounting refused to reserve pod {pod.key} on {chosen}: {code}: "
                    f"{(reply.error or '')[:300]}"
                )
                if code in TRANSIENT_CODES:
                    raise TransientRefusal(error, chosen)
                raise FilterError(error)
            if code is Code.QUOTA_EXCEEDED:
                self.read_model.forget_quota(pod.namespace)
            else:
                self.read_model.invalidate(chosen)
        raise TransientRefusal(
            f"pod {pod.key}: every reservation lost a race with another change "
            f"({self.max_attempts} attempts); retried with backoff"
        )

    def _other_scheduler(self, obj: Mapping[str, Any], pod: PodInfo) -> str | None:
        """Why the pod is not numafit's to schedule, or None when its schedulerName is."""
        name = pod_scheduler_name(obj)
        if name in self.scheduler_names:
            return None
        return other_scheduler_message(pod.key, name, self.scheduler_names)

    def _place(
        self,
        names: tuple[str, ...],
        views: Mapping[str, NodeView | None],
        tracked: TrackedPod | None,
        pod: PodInfo,
        requests: list[ContainerRequest | None],
        options: FitOptions,
        policy: NodePolicy,
        probe: QuotaProbe | None = None,
        *,
        assume: bool = True,
    ) -> Placement:
        """The node policy's pick among `names`, on cached fits where a node is unchanged,
        leaving out nodes another pod is still allocating on.

        Where a node publishes NodeResourceTopology, each GPU container is fitted first on the
        NUMA node kubelet is predicted to give it (svc_scheduler/topology.py). `assume`: this
        is the filter's decision, so the chosen node counts what the pod takes there until its
        figures show it (prioritize only scores)."""
        self._placements += 1
        if self._placements % FIT_CACHE_PRUNE_EVERY == 0:
            # Nodes deleted from the cluster leave the read model; their cached fits go too.
            self.fit_cache.prune(lambda name: self.read_model.view(name) is not None)
        snapshots, stamps = self._snapshots(names, views, tracked)
        predictions = self.topology.predict(snapshots, pod, requests)
        plans = {name: p.plan for name, p in predictions.items()}
        # A cached fit is only good for the same plan: the plan rides in the stamp (without
        # NodeResourceTopology there is no plan, and the stamps are used as they are).
        stamped: Mapping[str, Hashable] = stamps
        if plans:
            stamped = {
                name: (stamp, plans[name]) if name in plans else stamp
                for name, stamp in stamps.items()
            }
        # Nodes locked for another pod's allocation, or about to be (a reservation of this
        # extender's whose bind is to come), are left to the last: a pod goes where it is
        # bound at once whenever such a node fits, and waits in its bind otherwise.
        busy = {
            **self.pending_binds.busy(pod.uid),
            **locked_nodes(views, pod.uid, time.time()),
        }
        # A pod kube-scheduler already bound stays where it is: nothing there is busy for it.
        busy.pop(pod.node_name, None)
        placement = place_pod(
            snapshots,
            requests,
            pod.kinds,
            options,
            policy,
            probe,
            busy,
            cache=self.fit_cache,
            stamps=stamped,
            numa=plans or None,
        )
        waiting = [n for n in placement.refused if n in busy and busy[n] == placement.refused[n]]
        if placement.chosen is None and waiting:
            # Every node that fits is busy: the policy's pick among those with the fewest binds
            # to come (the bind waits for its lock, behind them) rather than a refusal
            # kube-scheduler would park the pod on.
            queued = self.pending_binds.queued(pod.uid)
            shortest = min(queued.get(n, 0) for n in waiting)
            among = place_pod(
                {n: snapshots[n] for n in waiting if queued.get(n, 0) == shortest},
                requests,
                pod.kinds,
                options,
                policy,
                probe,
                cache=self.fit_cache,
                stamps=stamped,
                numa=plans or None,
            )
            if among.chosen is not None:
                placement = Placement(
                    among.chosen,
                    among.rows,
                    {n: r for n, r in placement.refused.items() if n not in among.scores},
                    among.scores,
                )
        if assume and placement.chosen is not None:
            self._placed(pod, requests, placement, predictions.get(placement.chosen))
        return placement

    def _placed(
        self,
        pod: PodInfo,
        requests: list[ContainerRequest | None],
        placement: Placement,
        prediction: NodePrediction | None,
    ) -> None:
        assert placement.chosen is not None
        gpus = [p for p, r in enumerate(requests) if r is not None]
        counts = self.topology.placed(
            pod, placement.chosen, placement.rows, gpus, prediction, time.time()
        )
        for result, count in counts.items():
            self.metrics.numa_predictions.labels(result).inc(count)
        if prediction is not None:
            log.debug(
                "NUMA predicted",
                extra={
                    "pod": pod.key,
                    "node": placement.chosen,
                    "numa": dict(prediction.plan.first),
                    "lagging": self.topology.assumed(placement.chosen),
                },
            )

    def _snapshots(
        self,
        names: tuple[str, ...],
        views: Mapping[str, NodeView | None],
        tracked: TrackedPod | None,
    ) -> tuple[dict[str, NodeSnapshot | None], dict[str, tuple[str | None, int]]]:
        """The snapshot each candidate is fitted on, and the stamp (epoch, revision) its fit
        may be cached under: none for the node holding the pod's own earlier reservation (its
        snapshot is a copy without that reservation)."""
        # Comprehensions: this runs over every node of the cluster on every filter.
        present = [(name, view) for name in names if (view := views.get(name)) is not None]
        snapshots: dict[str, NodeSnapshot | None] = dict.fromkeys(names)
        snapshots.update((name, view.snapshot) for name, view in present)
        stamps: dict[str, tuple[str | None, int]] = {
            name: (view.epoch, view.revision) for name, view in present
        }
        own = tracked.node if tracked is not None else None
        if tracked is not None and own is not None:
            snapshot = snapshots.get(own)
            if snapshot is not None:
                snapshots[own] = without_pod(snapshot, tracked.usage)
                del stamps[own]
        return snapshots, stamps

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

    def _defer(self, uid: str, reason: str) -> None:
        self._deferred[uid] = reason
        self._deferred.move_to_end(uid)
        while len(self._deferred) > REMEMBERED_DEFERRALS:
            self._deferred.popitem(last=False)

    def _remember(self, uid: str, node: str) -> None:
        self._reserved[uid] = node
        self._reserved.move_to_end(uid)
        while len(self._reserved) > REMEMBERED_RESERVATIONS:
            self._reserved.popitem(last=False)

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
        placement = self._place(
            tuple(views), views, None, pod, requests, options, policy, assume=False
        )
        for name, score in placement.scores.items():
            scores[name] = extender_priority(score, policy)
        return host_priority_list(scores)

    # --- bind -------------------------------------------------------------------------------

    async def bind(self, args: BindingArgs) -> tuple[BindingResult, str]:
        """`ExtenderBindingResult` and the metric result label."""
        try:
            subjects.check_pod(args.pod_namespace, args.pod_name, args.pod_uid)
            subjects.check_name(args.node, "Node")
        except subjects.InvalidName as exc:
            return binding_result(f"ExtenderBindingArgs: {exc}"), "invalid_request"
        key = f"{args.pod_namespace}/{args.pod_name}"
        deadline = Deadline.after_ms(self.request_timeout * 1000)
        refused = await self._check_bind(args, deadline)
        if refused is not None:
            label, message = refused
            self.pending_binds.done(args.pod_uid)
            log.info("bind refused", extra={"pod": key, "node": args.node, "error": message})
            return binding_result(message), label
        deferred = self._deferred.pop(args.pod_uid, None)
        try:
            reply = await self._allocating(args, deadline)
        except (AccountingUnavailable, FilterError) as exc:
            return binding_result(f"accounting unavailable: {exc}"), "accounting_unavailable"
        finally:
            # Ended one way or the other: no longer a bind to come on the node.
            self.pending_binds.done(args.pod_uid)
        if not reply.ok:
            code = Code.parse(reply.code)
            detail = (reply.error or "")[:300]
            if code is Code.CONFLICT:
                # The node stayed locked for another pod's allocation the whole budget:
                # kube-scheduler binds again after its backoff, on the reservation still held.
                message = (
                    f"cannot bind pod {key} to node {args.node} yet: {detail}; "
                    "retried after kube-scheduler's backoff"
                )
                log.info("bind waited out", extra={"pod": key, "node": args.node})
                return binding_result(message), LOCK_WAIT_TIMEOUT
            # pod_not_tracked / node_mismatch: no reservation there (it expired unbound,
            # accounting restarted and forgot it, or the filter deferred a transient
            # refusal): kube-scheduler schedules the pod again, after its backoff.
            self._reserved.pop(args.pod_uid, None)
            message = f"cannot bind pod {key} to node {args.node}: {code}: {detail}"
            if deferred is not None and code in (Code.POD_NOT_TRACKED, Code.NODE_MISMATCH):
                message = deferred
            log.info("bind refused", extra={"pod": key, "node": args.node, "error": message})
            return binding_result(message), code.value
        if reply.revision is not None:
            # The node is locked from now on: the next filter must see it before deciding.
            self.read_model.expect(args.node, reply.revision)
        if reply.bound:
            # Accounting's one write was the Binding, the reservation on it.
            self._reserved.pop(args.pod_uid, None)
            log.info("pod bound", extra={"pod": key, "node": args.node})
            return binding_result(), "ok"
        # Written but not bound: an accounting replica older than the bind-phase `bind` field
        # (an upgrade in the wrong order: accounting goes first). The pod is not bound, so
        # its phase becomes `failed` (the node's lock is released) and kube-scheduler
        # schedules it again after its backoff.
        error = (
            f"accounting wrote the reservation of pod {key} but did not bind it (an accounting "
            "replica older than this extender: upgrade svc-accounting first)"
        )
        log.warning("binding failed", extra={"pod": key, "node": args.node, "error": error})
        await self._bind_failed(args, deadline)
        self._record_event(args, "Warning", "BindingFailed", error)
        return binding_result(error), "binding_failed"

    async def _allocating(self, args: BindingArgs, deadline: Deadline) -> BindPhaseReply:
        """Bind-phase `allocating` for the pod (accounting writes its reservation), waiting
        while the node is locked for another pod's allocation (a `conflict`), as long as the
        budget leaves LOCK_WAIT_RESERVE for the rest of the bind; the last answer."""
        request = _phase_request(args, keys.PHASE_ALLOCATING)
        node = args.node
        # The first try needs no turn: usually the node is free, and a pod with nothing
        # reserved there (a deferred refusal) must not queue behind others to learn it.
        changed = self.gates.armed(node)
        reply = await self.accounting.ask(
            request, BindPhaseReply, self._bind_budget(deadline, FAILURE_RESERVE)
        )
        if reply.ok or Code.parse(reply.code) is not Code.CONFLICT:
            return reply
        async with self.gates.turn(node, deadline.remaining() - LOCK_WAIT_RESERVE) as mine:
            while mine:
                left = deadline.remaining() - LOCK_WAIT_RESERVE
                if left <= 0:
                    break
                await self.gates.wait(changed, left)
                changed = self.gates.armed(node)
                reply = await self.accounting.ask(
                    request, BindPhaseReply, self._bind_budget(deadline, FAILURE_RESERVE)
                )
                if reply.ok or Code.parse(reply.code) is not Code.CONFLICT:
                    return reply
        return reply

    async def _check_bind(self, args: BindingArgs, deadline: Deadline) -> tuple[str, str] | None:
        """(metric label, message) when the bind must not happen; None when the pod named by
        namespace and name has the UID given and one of numafit's scheduler names.

        Checked before accounting is asked anything: bind-phase acts on the reservation of the
        UID, so a bind naming another pod would write (and, once its Binding failed, mark
        `failed`) the reservation of a pod it does not name."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        if self.kube is None:
            return "binding_failed", "no Kubernetes client configured"
        try:
            async with asyncio.timeout(self._bind_budget(deadline, FAILURE_RESERVE)):
                # From the API server's watch cache: the uid and the scheduler name never
                # change, and kube-scheduler learned of the pod from that cache (a quorum read
                # per bind was an etcd round trip on every bind's path).
                body = await self.kube.get_pod_cached(args.pod_namespace, args.pod_name)
        except kube_io.NotFound:
            return Code.POD_NOT_TRACKED.value, f"cannot bind pod {key}: it does not exist"
        except (TimeoutError, FilterError):
            return Code.DEADLINE_EXCEEDED.value, f"cannot bind pod {key}: reading it timed out"
        except kube_io.KubeError as exc:
            return Code.API_ERROR.value, f"cannot bind pod {key}: {str(exc)[:300]}"
        meta = body.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if uid != args.pod_uid:
            return Code.POD_MISMATCH.value, (
                f"cannot bind pod {key} to node {args.node}: {Code.POD_MISMATCH}: the pod has "
                f"uid {subjects.shown(str(uid))}, not {args.pod_uid}"
            )
        name = pod_scheduler_name(body)
        if name not in self.scheduler_names:
            return OTHER_SCHEDULER, other_scheduler_message(key, name, self.scheduler_names)
        return None

    def _bind_budget(self, deadline: Deadline, keep: float = 0.0) -> float:
        """What one step of a bind may take: the rest of the deadline less `keep` (the part
        held back for the failure path), never past the deadline."""
        budget = deadline.remaining() - REPLY_MARGIN - keep
        if budget <= 0:
            raise FilterError("the bind's time budget ran out")
        return budget

    async def _bind_failed(self, args: BindingArgs, deadline: Deadline) -> None:
        try:
            await self.accounting.ask(
                _phase_request(args, keys.PHASE_FAILED),
                BindPhaseReply,
                self._bind_budget(deadline),
            )
        except (AccountingUnavailable, FilterError) as exc:
            # The lock expires by itself (NODE_LOCK_EXPIRY_SECONDS) when this is lost.
            log.warning("bind phase failed not recorded", extra={"error": str(exc)[:300]})

    def _record_event(self, args: BindingArgs, event_type: str, reason: str, message: str) -> None:
        pod = {"namespace": args.pod_namespace, "name": args.pod_name, "uid": args.pod_uid}
        self.events.record(pod, event_type, reason, message)


def locked_nodes(views: Mapping[str, NodeView | None], uid: str, now: float) -> dict[str, str]:
    """Nodes whose lock another pod than `uid` holds (and has not let expire), with the reason
    a node that would fit is refused: accounting would refuse the bind there (HAMi's lock)."""
    return {
        name: view.lock.reason
        for name, view in views.items()
        if view is not None and view.lock is not None and view.lock.blocks(uid, now)
    }


def check_node_names(names: tuple[str, ...]) -> None:
    """Every candidate must be a Kubernetes node name before any becomes a subject token."""
    if subjects.all_valid_names(names):
        return
    for i, name in enumerate(names):  # the first invalid one, for the error
        subjects.check_name(name, f"NodeNames[{i}]")


def _phase_request(args: BindingArgs, phase: str) -> BindPhaseRequest:
    """The bind-phase request for the pod a bind names: its UID, and its name, so that
    accounting refuses a UID that belongs to another pod before it writes anything."""
    return BindPhaseRequest(
        pod_uid=args.pod_uid,
        phase=phase,
        node=args.node,
        pod_namespace=args.pod_namespace,
        pod_name=args.pod_name,
        # `allocating`: accounting's write of the reservation is the pod's Binding itself.
        bind=phase == keys.PHASE_ALLOCATING,
    )
