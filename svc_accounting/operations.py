"""Accounting's operations, one request at a time: decoded, checked (the subject, the node, the
fields), served under the node's locks and answered. The operations themselves are in
svc_accounting/pod_ops.py (reserve, bind-phase, move, consume) and svc_accounting/node_ops.py
(pending, snapshot, register); the pods' API side in svc_accounting/pod_writes.py.

Every write follows one rule: decide under the node's lock, write the pod (or Node) guarded by
the resourceVersion it was decided on, bounded by the caller's remaining deadline, and change
the ledger only from what the API server returned. Accounting is the single writer, so it
judges every `reserve` and `move` itself, whoever asks: the fit is re-checked on its own ledger
(`shared.core.commit_check`) and an over-commit is refused with `no_fit` (or `quota_exceeded`)
and HAMi's reason names in `fitReasons`.

Requests never create state: an operation on a node the ledger does not know (nodes enter only
from the Node list and watch, or a pod bound there) is answered without touching anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from typing import TYPE_CHECKING, Final

import msgspec

from shared import messages, subjects
from shared.codes import Code
from shared.messages import (
    AccountingReply,
    AccountingRequest,
    BindPhaseRequest,
    ConsumeRequest,
    MessageError,
    MoveReply,
    MoveRequest,
    PendingRequest,
    RegisterRequest,
    ReserveReply,
    ReserveRequest,
    SnapshotRequest,
)
from shared.subjects import InvalidName, shown
from svc_accounting.pod_ops import DEFAULT_RESERVATION_TTL, PodOperations
from svc_accounting.pod_writes import DEFAULT_WRITE_TIMEOUT, PodWrites
from svc_accounting.replies import (
    Call,
    Outcome,
    ReadTooLate,
    Refused,
    bounded,
    deadline_of,
    refuse_late,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from shared.core.pods import PodInfo
    from shared.service.kube_io import Kube
    from shared.service.lifecycle import Deadline
    from svc_accounting.ledger import Ledger
    from svc_accounting.unbound import UnboundPods

log = logging.getLogger("numafit.accounting")

NO_WRITE_OPS = frozenset({"pending", "snapshot"})
"""Operations that change nothing: served without the node's lock."""
HOLD_OPS = frozenset({"reserve"})
"""Operations that write nothing to the API server but decide on the node's free capacity:
served beside another pod's write on the node (a bind-phase's Binding, a consume) under the
node's *capacity* lock only, which the operations that change capacity by a decision (move,
register) hold too. A bind-phase or consume changes no capacity (the hold it writes is
counted already; a consume's drift records what kubelet did), so a reserve need not wait for
its API round trip: kube-scheduler's one-pod-at-a-time filter would."""
CAPACITY_OPS = frozenset({*HOLD_OPS, "move", "register"})
UNLOCKED_NODE_OPS = frozenset({*NO_WRITE_OPS, "register"})
"""Operations allowed on a node the ledger does not know (reads answer empty; register's
Node object is what brings a node in)."""


class _Addressed(msgspec.Struct, frozen=True):
    """A request's `node` of any type, read only when the typed decode failed: so that the
    subject, the node name and whether accounting knows the node are judged first, as for a
    readable request (a body this cannot read is not a JSON object at all)."""

    node: object = None


_ADDRESSED: Final = msgspec.json.Decoder(_Addressed)


class Operations(PodOperations):
    """The seven operations on one replica's ledger: each request decoded, checked, served
    under its node's locks (HOLD_OPS, CAPACITY_OPS) and answered; the pods' API side is
    `writes` (svc_accounting/pod_writes.py)."""

    def __init__(
        self,
        ledger: Ledger,
        kube: Kube,
        *,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        reservation_ttl: float = DEFAULT_RESERVATION_TTL,
        on_drift: Callable[[str, PodInfo, str], None] | None = None,
        unbound: UnboundPods | None = None,
    ) -> None:
        self.ledger = ledger
        self.writes = PodWrites(ledger, kube, write_timeout=write_timeout, unbound=unbound)
        self.reservation_ttl = reservation_ttl
        """Seconds a held reservation waits for its bind before it is released."""
        self.locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        """One lock per node while anyone holds or waits for it: the map never keeps a lock
        nobody uses, so neither made-up nor deleted nodes leave one behind."""
        self.capacity_locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self.binding: set[str] = set()
        """Pods whose bind-phase write is under way, by UID: a reserve of one waits its turn."""
        self.on_drift = on_drift
        self.served_partitions: Callable[[], tuple[int, ...]] | None = None
        self.on_late: Callable[[], None] | None = None
        """Told of each request refused because its deadline had passed (a metric)."""
        self.on_timing: Callable[[str, str, float], None] | None = None
        """Told how long each step took (a metric): (`node_wait`, op, seconds) for the wait for
        the node's lock, (`operation`, op, seconds) from a request's arrival to its answer."""

    # --- helpers ----------------------------------------------------------------------------

    def lock(self, name: str, *, capacity: bool = False) -> asyncio.Lock:
        """The node's lock (one operation that may write at a time), or with `capacity` its
        capacity lock (one decision on its free capacity at a time: HOLD_OPS, CAPACITY_OPS)."""
        locks = self.capacity_locks if capacity else self.locks
        lock = locks.get(name)
        if lock is None:
            lock = asyncio.Lock()
            locks[name] = lock
        return lock

    def busy(self) -> list[tuple[str, asyncio.Lock]]:
        """Every node lock and capacity lock held now, with its node."""
        return [
            (name, lock)
            for locks in (self.locks, self.capacity_locks)
            for name, lock in list(locks.items())
            if lock.locked()
        ]

    @contextlib.asynccontextmanager
    async def _locked(
        self, name: str, deadline: Deadline | None, op: str, *, capacity: bool = False
    ) -> AsyncIterator[None]:
        """The node's lock (or its capacity lock), waited for no longer than the request's
        deadline, which is checked again once it is held: a request is never acted on after
        its caller gave up."""
        lock = self.lock(name, capacity=capacity)
        waited = time.monotonic()
        try:
            async with asyncio.timeout(None if deadline is None else deadline.remaining()):
                await lock.acquire()
            self._timing("node_wait", op, time.monotonic() - waited)
        except TimeoutError as exc:
            self._late()
            raise Refused(
                Code.DEADLINE_EXCEEDED,
                f"node {name} stayed busy until the {op} request's deadline; nothing was done",
            ) from exc
        try:
            if deadline is not None and deadline.expired:
                self._late()
                refuse_late(deadline, op)
            yield
        finally:
            lock.release()

    def _late(self) -> None:
        if self.on_late is not None:
            self.on_late()

    def _timing(self, step: str, what: str, seconds: float) -> None:
        if self.on_timing is not None:
            self.on_timing(step, what, seconds)

    async def handle(
        self, op: str, node_token: str, data: bytes, received: float | None = None
    ) -> Outcome:
        """`_handle`, timed from the request's arrival (`received`) to its answer."""
        started = time.monotonic() if received is None else received
        try:
            return await self._handle(op, node_token, data, received)
        finally:
            if op in messages.OPS:  # a made-up op name is no label
                self._timing("operation", op, time.monotonic() - started)

    async def _handle(
        self, op: str, node_token: str, data: bytes, received: float | None = None
    ) -> Outcome:
        """Decode and run one operation; refusals and bad input become replies, never
        exceptions. The checks, in order: the body is a JSON object (else a reply without
        epoch), the subject token names a node, the body's `node` is a node name and matches
        it (`unauthorized`), accounting knows the node (`node_unavailable`; pending, snapshot
        and register excepted), the body's fields, then the operation's own checks."""
        kinds = messages.OPS.get(op)
        reply_kind = AccountingReply if kinds is None else kinds[1]
        name = ""
        call = Call()  # its node and deadline are known once the request is read
        try:
            if kinds is None:
                raise Refused(Code.INVALID_REQUEST, f"unknown operation {shown(op)}")
            request_kind = kinds[0]
            try:
                request = messages.decode(data, request_kind)
            except MessageError as exc:
                # Where the request goes is judged first, as for a readable one (an unknown
                # node is `node_unavailable` whatever else its body holds), then the fields.
                try:
                    addressed = _ADDRESSED.decode(data)
                except msgspec.DecodeError:
                    # Not a JSON object: nothing of it is read, and the reply has no epoch.
                    unreadable = reply_kind(
                        ok=False, code=Code.INVALID_REQUEST, error=bounded(str(exc))
                    )
                    return Outcome(unreadable, set())
                name = self._node_name(op, node_token, addressed.node, request_kind.WHAT)
                self._admit(op, name, node_token)
                raise
            node: object = getattr(request, "node", None)
            name = self._node_name(op, node_token, node, request_kind.WHAT)
            self._admit(op, name, node_token)
            deadline = deadline_of(request, received)
            if request.deadline_at_ms is not None and time.time() * 1000 > request.deadline_at_ms:
                # Read after the caller's own (absolute) deadline: this replica was paused, or
                # the request waited out a takeover. An answer now reaches nobody and could be
                # a second one: nothing is done and nothing is said (counted, and warned of,
                # by the caller of `handle`). A relative budget already spent on arrival is
                # the caller's to hear about: it is refused below, with an answer.
                self._late()
                raise ReadTooLate(op)
            call.node = "" if name == subjects.ALL_NODES else name
            call.deadline = deadline
            return await self._serve(call, op, name, request)
        except Refused as exc:
            return Outcome(self._refusal(reply_kind, exc, name), set(call.observed))
        except MessageError as exc:
            refused = Refused(Code.INVALID_REQUEST, str(exc))
            return Outcome(self._refusal(reply_kind, refused, name), set(call.observed))

    async def _serve(self, call: Call, op: str, name: str, request: AccountingRequest) -> Outcome:
        """Run a checked request under the node's locks (none for reads, the capacity lock
        alone for HOLD_OPS), once this replica still serves the node."""
        deadline = call.deadline
        if op in NO_WRITE_OPS:
            if isinstance(request, SnapshotRequest) and request.pod_uid in self.writes.settling:
                # Its write is being settled: answer what it settles to, not the state before
                # it (which the late write could still change).
                async with self._locked(name, deadline, op):
                    pass
            return await self._run(call, name, request)
        async with contextlib.AsyncExitStack() as held:
            if op not in HOLD_OPS:
                await held.enter_async_context(self._locked(name, deadline, op))
            if op in CAPACITY_OPS:
                await held.enter_async_context(self._locked(name, deadline, op, capacity=True))
            if op != "register":
                self._known(name)  # it may have been deleted while this request waited
            if not self.writes.serves(name):
                # The partition was handed over (or its lease ran out) while this request
                # waited for the node: its new owner decides, not this replica.
                raise Refused(
                    Code.NODE_UNAVAILABLE,
                    f"this accounting replica no longer owns node {name}'s partition; retry",
                )
            outcome = await self._run(call, name, request)
        outcome.changed |= call.observed
        return outcome

    @staticmethod
    def _node_name(op: str, node_token: str, node: object, what: str) -> str:
        """The node a request is for: `subjects.ALL_NODES` for a snapshot of every node, else
        the body's `node`, which must be a node name (matched to the token by `_admit`)."""
        if node_token == subjects.ALL_NODES:
            if op != "snapshot":
                raise Refused(Code.INVALID_REQUEST, f"{op} must name one node")
            return subjects.ALL_NODES
        if not subjects.valid_token(node_token):
            raise Refused(Code.INVALID_REQUEST, f"subject token {shown(node_token)} names no node")
        if node is None:
            raise Refused(Code.INVALID_REQUEST, f"{what}: node is required")
        try:
            return subjects.check_name(node, "node")
        except InvalidName as exc:
            raise Refused(Code.INVALID_REQUEST, f"{op}: {exc}") from exc

    def _admit(self, op: str, name: str, node_token: str) -> None:
        """The body's node is the subject's (NATS permissions scope a node to its own token),
        and one accounting knows unless the operation allows any."""
        if name == subjects.ALL_NODES:
            return
        if subjects.node_token(name) != node_token:
            raise Refused(
                Code.UNAUTHORIZED,
                f"node {shown(name)} does not match subject token {shown(node_token)}",
            )
        if op not in UNLOCKED_NODE_OPS:
            self._known(name)

    async def _run(self, call: Call, name: str, request: AccountingRequest) -> Outcome:
        match request:
            case ReserveRequest():
                return await self.reserve(call, name, request)
            case BindPhaseRequest():
                return await self.bind_phase(call, name, request)
            case MoveRequest():
                return await self.move(call, name, request)
            case ConsumeRequest():
                return await self.consume(call, name, request)
            case PendingRequest():
                return await self.pending(call, name, request)
            case SnapshotRequest():
                return await self.snapshot(call, name, request)
            case RegisterRequest():
                return await self.register(call, name, request)
        raise AssertionError(f"no handler for {type(request).__name__}")

    def _refusal(self, kind: type[AccountingReply], refused: Refused, name: str) -> AccountingReply:
        node = self.ledger.get(name) if name else None
        error = bounded(str(refused))
        revision = None if node is None else node.revision
        epoch = (
            self.ledger.epoch_of(name) if name and name != subjects.ALL_NODES else self.ledger.epoch
        )
        if refused.fit_reasons is not None and issubclass(kind, (ReserveReply, MoveReply)):
            return kind(
                ok=False,
                code=refused.code,
                error=error,
                epoch=epoch,
                revision=revision,
                fit_reasons=dict(refused.fit_reasons),
            )
        return kind(ok=False, code=refused.code, error=error, epoch=epoch, revision=revision)
