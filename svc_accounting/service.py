"""svc_accounting: the single writer of reservations, serving its operations over NATS.

Start: list nodes, pods and quotas and rebuild the ledger from the annotations (readiness waits
for that), then serve `numafit.accounting.v1.<op>.<slot>.<node>` (every slot with one replica,
the slots of the partitions it serves when partitioned: svc_accounting/routes.py) and keep the
ledger in step with the API server through watches of pods, nodes and resource quotas. Every
change of a node is published on `numafit.usage.v1.<node>`; a deleted node is published once
more with `"deleted": true` (and no devices) so readers drop it.

The watches are the service's job itself: each is an eternal task that relists after a 410 and
retries failed lists and watches with backoff, forever. Should one ever end anyway, readiness
fails for good and the process exits 1 (the supervisor's `on_fatal`), so a frozen ledger
never keeps answering. Requests, the watches and the drift Events are all children of the
service's one supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.micro

from shared import messages, subjects
from shared.core.errors import CoreError
from shared.core.pods import PodInfo, pod_from_object
from shared.core.quota import limits_from_quotas
from shared.service import natsconn
from shared.service.events import EventRecorder
from shared.service.follow import follow
from shared.service.health import Readiness
from shared.service.supervisor import Supervisor
from shared.service.wiring import ServiceSpec
from svc_accounting.intents import IntentLog
from svc_accounting.leases import Leases, OwnershipChange
from svc_accounting.ledger import Ledger, NodeLedger, node_lock
from svc_accounting.metrics import AccountingMetrics
from svc_accounting.operations import Operations
from svc_accounting.ownership import Ownership
from svc_accounting.replies import bounded
from svc_accounting.routes import Routes
from svc_accounting.serving import RequestServer
from svc_accounting.settings import AccountingOptions as AccountingOptions  # re-exported
from svc_accounting.unbound import UnboundPods

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.micro.service import Service
    from prometheus_client import CollectorRegistry

    from shared.core.lock import Lock
    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.accounting")

NAME = "numafit-accounting"
VERSION = "0.1.0"
CONDITIONS = ("ledger", "nats", "leases")
FRESH_LEDGER_SECONDS = 1.0
"""A ledger listed this recently needs no relist before a takeover (the first lease round)."""
PEER_CHECK_SECONDS = 0.3
"""How long start-up listens for other accounting instances' answers."""

WATCH_KINDS = ("pods", "nodes", "resourcequotas")
DRAIN_WRITES_FACTOR = 2.0
"""A handover waits at most this many write timeouts for the writes under way (a write and the
fence that settles it when its answer does not come)."""
EXPIRY_CHECK_SECONDS = 1.0
"""Held reservations are checked for expiry at least this often."""


def spec(options: AccountingOptions | None = None) -> ServiceSpec[AccountingService]:
    """How every caller (`numafit run`, simulate, bench, the test harnesses) builds it."""
    chosen = options if options is not None else AccountingOptions()

    def build(
        nc: Client, kube: Kube | None, registry: CollectorRegistry, readiness: Readiness
    ) -> AccountingService:
        if kube is None:
            raise ValueError("accounting needs a Kubernetes client")
        return AccountingService(
            nc, kube, chosen, metrics=AccountingMetrics(registry), readiness=readiness
        )

    return ServiceSpec(NAME, CONDITIONS, build)


class AccountingService:
    def __init__(
        self,
        nc: Client,
        kube: Kube,
        options: AccountingOptions,
        *,
        metrics: AccountingMetrics | None = None,
        readiness: Readiness | None = None,
    ) -> None:
        self.nc = nc
        self.kube = kube
        self.options = options
        """Everything it is configured with (svc_accounting/settings.py)."""
        self.config = options.config
        self.metrics = metrics or AccountingMetrics()
        self.readiness = readiness or Readiness(*CONDITIONS)
        self.supervisor = Supervisor("accounting", on_fatal=self.readiness.fail)
        self.events = EventRecorder(
            kube,
            self.supervisor,
            timeout=options.event_timeout,
            task_name="drift-event",
            logger=log,
        )
        self.ledger = Ledger()
        self.unbound = UnboundPods(self.config)
        self.ops = Operations(
            self.ledger,
            kube,
            write_timeout=options.write_timeout,
            reservation_ttl=options.reservation_ttl,
            on_drift=self._record_drift,
            unbound=self.unbound,
        )
        self.quota_resync_seconds = options.quota_resync_seconds
        """ResourceQuotas are watched; the quota watch is renewed at least this often."""
        self.watch_timeout_seconds = options.watch_timeout_seconds
        self._service: Service | None = None
        self._quotas: dict[tuple[str, str], dict[str, Any]] = {}
        """Every ResourceQuota object by (namespace, name), as the list and watch show them."""
        self.replica = options.replica_id or default_replica_id()
        self._rebuilt_at: float | None = None
        """When the ledger was last listed whole (a takeover right after needs no relist)."""
        self.leases: Leases | None = None
        if options.partitions:
            self.leases = Leases(
                nc,
                replica=self.replica,
                partitions=options.partitions,
                ttl=options.lease_ttl,
                bucket=options.lease_bucket,
                on_acquired=self._take_over,
                on_released=self._hand_over,
                on_change=self._ownership_changed,
                on_serving=self._subscribe,
                on_unserving=self._unsubscribe,
            )
            self.ledger.partition_count = options.partitions
            self.metrics.partitions_total.set(options.partitions)
            self.ops.writes.intents = IntentLog(
                nc, bucket=options.lease_bucket, timeout=self.leases.kv_timeout
            )
        self.ownership = Ownership(self.leases)
        self.requests = RequestServer(
            nc, self.ops, self.ownership, self.ledger, self.metrics, self._publish_changed
        )
        """Each delivered request: checked, served, answered once, its change published."""
        # A drain runs inside a lease round: bounded so that the other partitions' renewals
        # are not held up past their deadline.
        drain = options.write_timeout
        if self.leases is not None:
            drain = min(drain, self.leases.renew_every / 2)
        self.routes = Routes(nc, self._deliver, partitions=options.partitions, timeout=drain)
        """This replica's subscriptions: the slots of what it serves, nothing else."""
        writes = self.ops.writes
        writes.serves = self.ownership.serves
        writes.on_settled = lambda outcome: self.metrics.unknown_writes.labels(outcome).inc()
        writes.on_timing = self.metrics.timing
        writes.replica = self.replica
        self.ops.on_late = self.metrics.late_requests.inc
        self.ops.on_timing = self.metrics.timing
        self.ops.served_partitions = self.ownership.served if options.partitions else None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        await self.supervisor.start()
        versions = await self.rebuild()
        self._rebuilt_at = time.monotonic()
        self.readiness.set("ledger")
        for kind in WATCH_KINDS:
            self.supervisor.spawn(
                self._watch_loop(kind, versions[kind]), f"watch-{kind}", eternal=True
            )
        self.supervisor.spawn(self._expire_loop(), "expire-reservations", eternal=True)
        await self._check_peers()
        if self.leases is not None:
            # Take what nobody holds, bring it up to date, then subscribe to it (`_subscribe`).
            await self.leases.open()
            if self.ops.writes.intents is not None:
                await self.ops.writes.intents.open()
            await self.leases.first_round()
        # The service carries no endpoint (its subscriptions follow ownership, and nats.micro
        # cannot remove an endpoint): it is how instances find each other (`_check_peers`).
        service = await nats.micro.add_service(
            self.nc,
            name="numafit-accounting",
            version=VERSION,
            description="numafit accounting: owner of every GPU reservation",
            metadata={
                "partitions": str(self.ownership.partition_count),
                "replica": self.replica,
            },
        )
        if self.leases is None:
            await self.routes.open_every_slot()
        await self.nc.flush()
        self._service = service
        self.readiness.set("nats")
        if self.leases is not None:
            self.supervisor.spawn(self.leases.run(), "leases", eternal=True)
        else:
            await self.publish(self.ledger.nodes.values())
        self.readiness.set("leases")
        log.info(
            "accounting ready",
            extra={
                "epoch": self.ledger.epoch,
                "replica": self.replica,
                "partitions": list(self.ownership.served()) if self.leases else "all",
                "nodes": len(self.ledger.nodes),
                "pods": len(self.ledger.pod_node),
            },
        )

    async def stop(self, grace: float) -> None:
        """Stop taking requests, then one grace period for the rest: in-flight requests and
        drift Events finish, the watches are cancelled (nothing outlives shutdown)."""
        self.readiness.draining = True
        if self.leases is not None:
            # Hand every partition over at once (the others take them without waiting for a
            # lease to expire), then stop taking requests.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(grace):
                    await self.leases.stop()
        await self.routes.close_all()
        service, self._service = self._service, None
        await natsconn.stop_service(self.nc, service)
        await self.supervisor.stop(grace)
        if self.ops.writes.intents is not None:
            await self.ops.writes.intents.settle_all()

    async def on_reconnect(self) -> None:
        """Readers may have missed updates while the connection was down: republish all."""
        await self.publish(list(self.ledger.nodes.values()))

    # --- partitions -------------------------------------------------------------------------

    async def _check_peers(self) -> None:
        """Refuse to start beside an accounting instance of another mode (or a second one
        without partitions): two of them would both answer every node."""
        try:
            async with asyncio.timeout(PEER_CHECK_SECONDS):
                found = await natsconn.peers(self.nc, NAME, PEER_CHECK_SECONDS)
        except TimeoutError:
            found = []
        mine = str(self.ownership.partition_count)
        for info in found:
            theirs = str((info.get("metadata") or {}).get("partitions", "0"))
            if theirs != mine or mine == "0":
                raise ConnectionError(
                    f"another accounting instance ({info.get('id', '?')}, partitions "
                    f"{theirs}) is running; this one has partitions {mine}: "
                    + (
                        "run a single replica with --partitions 0, or every replica with the "
                        "same --partitions (the default)"
                    )
                )

    async def _take_over(self, acquired: dict[int, str]) -> None:
        """Partitions this replica now holds the keys of: bring their nodes up to date from
        the API server (the watch may lag the previous owner's last writes), give them their
        new epochs, publish them (readers see the epoch change and refresh), then serve."""
        started = time.monotonic()
        await self._settle_intents(set(acquired))
        self.ledger.epochs.update(acquired)
        if self._rebuilt_at is None or time.monotonic() - self._rebuilt_at > FRESH_LEDGER_SECONDS:
            await self._relist("nodes")
            await self._relist("pods")
        # else the ledger was listed a moment ago (start-up): nothing to catch up on.
        nodes = [
            node
            for node in self.ledger.nodes.values()
            if self.ledger.partition(node.name) in acquired
        ]
        for node in nodes:
            node.changed()  # a new revision under the new epoch
        await self.publish(nodes, force=set(acquired))
        self.metrics.takeover.observe(time.monotonic() - started)

    async def _settle_intents(self, partitions: set[int]) -> None:
        """Before a taken-over partition is served, every write its previous owner recorded
        and may still see land is ended (svc_accounting/intents.py): the relist that follows
        then shows what the API server will keep. Bounded: an API server that does not answer
        fails the takeover (the partitions are handed back and taken again next round)
        instead of serving a partition with writes of unknown outcome."""
        intents = self.ops.writes.intents
        if intents is None or self.leases is None:
            return
        async with asyncio.timeout(self.leases.renew_every):
            for recorded, intent in await intents.pending(partitions):
                if intent is not None:
                    outcome = await self.ops.writes.settle_intent(intent)
                    log.info(
                        "a previous owner's write settled at takeover",
                        extra={
                            "pod": intent.key,
                            "node": intent.node,
                            "writer": intent.replica,
                            "resource_version": intent.resource_version,
                            "outcome": outcome,
                            "age_s": round(time.time() - intent.at, 3),
                        },
                    )
                await intents.forget(recorded)

    async def _subscribe(self, partitions: set[int]) -> None:
        """Partitions now served (brought up to date, lease renewed): from here on the server
        delivers their requests to this replica, and only to it."""
        await self.routes.open(partitions)

    async def _unsubscribe(self, partitions: set[int]) -> None:
        """Partitions about to be handed over (or lost), their keys still this replica's: no
        request of theirs is delivered here once this returns; those delivered already are
        handed to `_deliver` first (and answered: the partitions are still served)."""
        await self.routes.close(partitions)

    def _ownership_changed(self, change: OwnershipChange) -> None:
        """Counted, and the owned gauge follows (only here: it is not worth a look per
        request)."""
        self.metrics.ownership_change(change)
        leases = self.leases
        self.metrics.partitions_owned.set(len(leases.serving) if leases is not None else 0)

    async def _hand_over(self, released: set[int]) -> None:
        """Partitions this replica no longer serves: reservations it held there (unwritten)
        are dropped, so their binds fail cleanly and kube-scheduler schedules them again.
        Writes already under way there finish first (new requests are refused once the node's
        lock is theirs): the key is freed for the next owner only after, so no write of this
        replica can land after the next owner has listed the pods."""
        await self._drain(released)
        for uid, hold in list(self.ledger.held.items()):
            if self.ledger.partition(hold.node) in released:
                self.ledger.release(uid)
        for k in released:
            self.ledger.epochs.pop(k, None)
        for name in list(self.ledger.nodes):
            if self.ledger.partition(name) in released:
                self.metrics.node_gone(name)  # its new owner exports its series now
        self.metrics.partitions_owned.set(len(self.ownership.served()))

    async def _drain(self, released: set[int]) -> None:
        """Wait (bounded) until no request holds a node lock of the `released` partitions."""
        busy = [lock for name, lock in self.ops.busy() if self.ledger.partition(name) in released]
        if not busy:
            return
        bound = DRAIN_WRITES_FACTOR * self.ops.writes.write_timeout
        if self.leases is not None:
            bound = min(bound, self.leases.renew_every)  # the other partitions' renewals wait
        try:
            async with asyncio.timeout(bound):
                for lock in busy:
                    async with lock:
                        pass
        except TimeoutError:
            log.warning(
                "writes still under way when the partitions were handed over",
                extra={"partitions": sorted(released)},
            )

    # --- rebuild and watches ----------------------------------------------------------------

    async def rebuild(self) -> dict[str, str]:
        """The whole ledger from the API server's annotations (phase-aware, init-released).
        Returns the resourceVersion each watch starts from."""
        nodes, nodes_rv = await self.kube.list_nodes()
        for node in nodes:
            meta = node.get("metadata") or {}
            name = meta.get("name", "")
            if isinstance(name, str) and subjects.valid_name(name):
                self.ledger.set_node(name, meta.get("annotations") or {})
        quotas, quotas_rv = await self.kube.list_resource_quotas_versioned()
        self._set_quotas(quotas)
        pods, pods_rv = await self.kube.list_pods()
        for obj in pods:
            self._observe(obj)
        return {"pods": pods_rv, "nodes": nodes_rv, "resourcequotas": quotas_rv}

    def _observe(self, obj: dict[str, Any], deleted: bool = False) -> set[str]:
        if not deleted and self._already_applied(obj):
            # The echo of accounting's own write (its response was applied already): the same
            # object at the same resourceVersion changes nothing, so it is not parsed again.
            return set()
        try:
            pod = pod_from_object(obj)
        except CoreError as exc:
            log.warning("pod ignored", extra={"error": bounded(str(exc))})
            return set()
        if deleted:
            self.unbound.forget(pod.uid)
            return self.ledger.forget(pod.uid)
        self.unbound.observe(pod)
        return self.ledger.observe(pod)

    def _already_applied(self, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return False
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not isinstance(uid, str) or not isinstance(version, str) or not version:
            return False
        tracked = self.ledger.tracked(uid)
        return tracked is not None and tracked.pod.resource_version == version

    async def _watch_loop(self, kind: str, resource_version: str | None) -> None:
        """Follow one kind forever (shared/service/follow.py): watch from `resource_version`;
        after a 410 (or with no version) relist first; every failure retried with backoff."""

        async def relist() -> str:
            return await self._relist(kind)

        async def apply(event_type: str, obj: dict[str, Any]) -> None:
            await self._apply_event(kind, event_type, obj)

        await follow(
            kind,
            relist,
            lambda version: self.kube.watch(kind, version, self._watch_timeout(kind)),
            apply,
            log=log,
            resource_version=resource_version,
        )

    async def _expire_loop(self) -> None:
        """Release held reservations whose bind never came, when their time is up (checked at
        least every EXPIRY_CHECK_SECONDS, so a renewed one is not released early)."""
        while True:
            expired, changed = self.ledger.expire(time.time())
            for hold in expired[:8]:
                log.info(
                    "held reservation expired unbound",
                    extra={"pod": hold.pod.key, "node": hold.node},
                )
            if expired:
                self.metrics.expired.inc(len(expired))
                await self._publish_changed(changed)
            due = self.ledger.next_expiry()
            wait = EXPIRY_CHECK_SECONDS if due is None else due - time.time()
            await asyncio.sleep(min(max(wait, 0.01), EXPIRY_CHECK_SECONDS))

    def _watch_timeout(self, kind: str) -> int:
        if kind == "resourcequotas":
            return max(1, min(self.watch_timeout_seconds, int(self.quota_resync_seconds)))
        return self.watch_timeout_seconds

    async def _apply_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if kind == "pods":
            await self._publish_changed(self._observe(obj, deleted=event_type == "DELETED"))
        elif kind == "nodes":
            name = meta.get("name", "")
            if not isinstance(name, str) or not subjects.valid_name(name):
                return
            if event_type == "DELETED":
                await self._drop_node(name)
            elif self.ledger.set_node(name, meta.get("annotations") or {}):
                await self._publish_changed({name})
        else:
            key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
            if event_type == "DELETED":
                self._quotas.pop(key, None)
            else:
                self._quotas[key] = obj
            self._apply_quotas()

    async def _relist(self, kind: str) -> str:
        if kind == "nodes":
            nodes, rv = await self.kube.list_nodes()
            changed: set[str] = set()
            listed: set[str] = set()
            for obj in nodes:
                meta = obj.get("metadata") or {}
                name = meta.get("name", "")
                if not isinstance(name, str) or not subjects.valid_name(name):
                    continue
                listed.add(name)
                if self.ledger.set_node(name, meta.get("annotations") or {}):
                    changed.add(name)
            for name in [n for n, node in self.ledger.nodes.items() if node.listed]:
                if name not in listed:
                    await self._drop_node(name)  # deleted while the watch was not looking
            await self._publish_changed(changed)
        elif kind == "pods":
            pods, rv = await self.kube.list_pods()
            seen = set()
            changed = set()
            for obj in pods:
                changed |= self._observe(obj)
                seen.add((obj.get("metadata") or {}).get("uid"))
            for uid in [u for u in self.ledger.pod_node if u not in seen]:
                changed |= self.ledger.forget(uid)
            self.unbound.retain(u for u in seen if isinstance(u, str))
            await self._publish_changed(changed)
        else:
            quotas, rv = await self.kube.list_resource_quotas_versioned()
            self._set_quotas(quotas)
        return rv

    # --- quotas -----------------------------------------------------------------------------

    def _set_quotas(self, quotas: Iterable[dict[str, Any]]) -> None:
        self._quotas = {}
        for obj in quotas:
            meta = obj.get("metadata") or {}
            key = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
            self._quotas[key] = obj
        self._apply_quotas()

    def _apply_quotas(self) -> None:
        """Limits from every ResourceQuota that parses; one that does not is skipped (and
        logged) without discarding the others."""
        valid = []
        for (namespace, name), obj in self._quotas.items():
            try:
                limits_from_quotas([obj], self.config)
            except CoreError as exc:
                log.warning(
                    "resource quota ignored",
                    extra={"quota": f"{namespace}/{name}", "error": bounded(str(exc))},
                )
                continue
            valid.append(obj)
        self.ledger.set_quota_limits(limits_from_quotas(valid, self.config))

    # --- publishing -------------------------------------------------------------------------

    async def _publish_changed(self, names: Iterable[str]) -> None:
        """Publish the nodes that changed; one that left the ledger meanwhile (its last pod
        went, or the Node was deleted) is published as deleted."""
        present: list[NodeLedger] = []
        for name in sorted(set(names)):
            node = self.ledger.get(name)
            if node is not None:
                present.append(node)
            else:
                await self._publish_deleted(name, 0)
        await self.publish(present)

    async def _drop_node(self, name: str) -> None:
        """A Node DELETED: out of the ledger (its pods released), its series removed, and
        readers told to drop it. Its lock goes with the last request that holds it."""
        dropped = self.ledger.drop_node(name)
        if dropped is None:
            return
        log.info("node deleted", extra={"node": name, "pods": len(dropped.pods)})
        await self._publish_deleted(name, dropped.revision + 1)
        self.metrics.tracked.set(len(self.ledger.pod_node))

    async def _publish_deleted(self, name: str, revision: int) -> None:
        self.metrics.node_gone(name)
        if not self.ownership.serves(name):
            return  # its partition's owner tells the readers
        body = messages.UsageUpdate(
            epoch=self.ledger.epoch_of(name), node=name, revision=revision, devices={}, deleted=True
        )
        with contextlib.suppress(Exception):  # a broken connection must not fail the watch
            await self.nc.publish(subjects.usage(name), messages.encode(body))

    async def publish(self, nodes: Iterable[NodeLedger], force: set[int] | None = None) -> None:
        """Each node's revision and per-device usage, for every reader's read model: only
        nodes this replica serves (or, `force`, of partitions it is taking over)."""
        for node in nodes:
            if not self.ownership.serves(node.name) and (
                force is None or self.ledger.partition(node.name) not in force
            ):
                continue
            self.metrics.node(node)
            body = messages.UsageUpdate(
                epoch=self.ledger.epoch_of(node.name),
                node=node.name,
                revision=node.revision,
                devices=messages.usage_entries(node.snapshot),
                allocating=_lock_wire(node_lock(node)),
            )
            with contextlib.suppress(Exception):  # a broken connection must not fail the op
                await self.nc.publish(subjects.usage(node.name), messages.encode(body))
        self.metrics.tracked.set(len(self.ledger.pod_node))
        self.metrics.held.set(len(self.ledger.held))

    # --- requests ---------------------------------------------------------------------------

    async def _deliver(self, msg: Msg) -> None:
        answer = self.requests.admit(msg)  # judged now, while its partition may still be served
        await self.supervisor.request(answer(), name="accounting-request")

    def _record_drift(self, node: str, pod: PodInfo, message: str) -> None:
        self.metrics.drift.labels(node).inc()
        log.warning(
            "allocation differs from reservation",
            extra={"pod": pod.key, "detail": bounded(message)},
        )
        self.events.record(
            {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
            "Warning",
            "AllocationDiffersFromReservation",
            message,
        )


def default_replica_id() -> str:
    """The host name (a pod's name in Kubernetes) and the process id: unique per process."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())
    # The random part keeps two instances of one process apart (tests, a restart in place).
    return f"{host[:40] or 'accounting'}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def _lock_wire(lock: Lock | None) -> messages.LockWire | None:
    return None if lock is None else messages.LockWire.from_core(lock)
