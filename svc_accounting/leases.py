"""Partition leases in a JetStream key-value bucket: which accounting replica owns which nodes.

Why JetStream KV and not Kubernetes Lease objects: the replicas already depend on NATS for every
request, the bucket gives per-key revisions (compare-and-set) and expiry by age in one place,
its state is replicated by the NATS cluster itself (R3 on a 3-server cluster), and a takeover
costs one NATS round trip instead of an API-server write per partition every few seconds.

The bucket (`--lease-bucket`, default `numafit-accounting`) holds, with a bucket-wide age limit
of `--lease-ttl` seconds:
- `member.<replica>`: each replica's heartbeat, rewritten every `ttl/3`; its absence for a TTL
  means the replica is gone;
- `partition.<k>`: the owner of partition k, taken with create-if-absent, renewed every `ttl/3`
  with compare-and-set on the revision it last wrote, gone `ttl` after its last renewal.

Every replica computes the same wanted assignment from the live members (rendezvous hashing,
shared/core/partitions.py) and converges on it: it takes a wanted partition that has no owner,
renews what it holds, and releases (deletes) a held partition another live member wants, so
replicas joining or leaving rebalance without a coordinator.

Safety: a replica stops *serving* a partition once `renew_deadline` (2/3 of the TTL) has passed
since the last successful renewal was sent, and the key cannot expire before a full TTL after
that renewal reached the server, so two replicas never serve one partition at the same time
(as kube-scheduler's leader election stops leading before its lease can expire). The
resourceVersion precondition on every write remains the last guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType

from shared.core.partitions import SLOTS, targets

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nats.aio.client import Client
    from nats.js.kv import KeyValue

log = logging.getLogger("numafit.accounting")

_T = TypeVar("_T")
_V = TypeVar("_V")

DEFAULT_BUCKET = "numafit-accounting"
DEFAULT_TTL = 10.0
"""Seconds a lease lives without renewal. Longer than a JetStream stream leader election (4-9 s
when the NATS server leading the lease stream dies), so the replicas keep serving through one;
shorter means faster failover of a dead replica, at the price of every partition being dropped
while the stream elects a leader."""
DEFAULT_PARTITIONS = 16
RENEW_FRACTION = 1 / 3
"""Renewals (and heartbeats) every this fraction of the TTL."""
DEADLINE_FRACTION = 2 / 3
"""A partition is served only while its last renewal is younger than this fraction of the TTL."""
NO_JETSTREAM = (
    "JetStream is not enabled on this NATS (accounting keeps its partition leases in a "
    "JetStream key-value bucket): run nats-server with -js, or run one accounting replica "
    "with --partitions 0"
)
TAKEN_BY_ANOTHER = "?"
"""The owner of a key another replica created first, until the next read names it."""
LOST_STREAM = (nats.js.errors.NoStreamResponseError, nats.js.errors.NotFoundError)
"""What a KV call raises when the bucket's stream no longer exists."""
OPEN_TIMEOUT = 15.0
"""Seconds start-up keeps trying to open the lease bucket."""
EXPIRY_MARGIN = 0.05
"""Seconds after a key's expected expiry before taking it (the server expires it by its own
timer)."""
KV_TIMEOUT_FRACTION = 1 / 6
"""One KV request may take at most this fraction of the TTL (it must not eat the deadline)."""


class LeaseValue(msgspec.Struct, frozen=True, kw_only=True):
    """What a partition key says: its owner, the epoch of that ownership, and when it was
    last written (Unix time by the owner's clock: the others wake at the expiry it implies)."""

    replica: str
    epoch: str
    since: float
    renewed: float = 0.0


class MemberValue(msgspec.Struct, frozen=True, kw_only=True):
    """What a member key says: the replica, the partition count it runs with (all must agree)
    and when it was written (Unix time)."""

    replica: str
    partitions: int
    renewed: float


class LeaseConflict(Exception):
    """The replicas disagree on the partitions: serving on would let two own one node."""


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(LeaseValue)
_MEMBER = msgspec.json.Decoder(MemberValue)


@dataclass
class Lease:
    partition: int
    revision: int
    """The KV revision of this replica's last write of the key (the compare-and-set base)."""
    epoch: str
    renewed_at: float
    """Monotonic time the last successful renewal (or the creation) was sent."""
    since: float


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    partition: int
    change: str
    """`acquired`, `released` (handed over on purpose) or `lost` (renewals failed)."""
    epoch: str
    at: float
    """Unix time of the change."""


class Leases:
    def __init__(
        self,
        nc: Client,
        *,
        replica: str,
        partitions: int = DEFAULT_PARTITIONS,
        ttl: float = DEFAULT_TTL,
        bucket: str = DEFAULT_BUCKET,
        on_acquired: Callable[[dict[int, str]], Awaitable[None]],
        on_released: Callable[[set[int]], Awaitable[None]],
        on_change: Callable[[OwnershipChange], None] | None = None,
        on_serving: Callable[[set[int]], Awaitable[None]] | None = None,
        on_unserving: Callable[[set[int]], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if partitions < 1:
            raise ValueError("--partitions must be at least 1")
        if partitions > SLOTS:
            raise ValueError(f"--partitions must be at most {SLOTS} (the slots of the subjects)")
        if ttl <= 0:
            raise ValueError("--lease-ttl must be positive")
        self.nc = nc
        self.replica = replica
        self.partitions = partitions
        self.ttl = ttl
        self.bucket = bucket
        self.on_acquired = on_acquired
        self.on_released = on_released
        self.on_change = on_change
        self.on_serving = on_serving
        """Told the partitions just served (brought up to date, lease renewed): it subscribes
        to their subjects (svc_accounting/routes.py); should it fail, they are handed back."""
        self.on_unserving = on_unserving
        """Told the partitions about to stop being served, while this replica still holds
        their keys: it drains their subscriptions, so no request reaches it after the key is
        freed."""
        self.clock = clock
        self.renew_every = ttl * RENEW_FRACTION
        self.renew_deadline = ttl * DEADLINE_FRACTION
        self.kv_timeout = max(ttl * KV_TIMEOUT_FRACTION, 0.05)
        self.held: dict[int, Lease] = {}
        """Partitions this replica holds the key of."""
        self.serving: set[int] = set()
        """Held partitions whose ledgers are rebuilt: requests for their nodes are answered."""
        self.releasing: set[int] = set()
        """Held partitions being handed over or lost: no longer served, key not yet freed."""
        self.owners: dict[int, str] = {}
        """Each partition's owner as last read (any replica)."""
        self.sightings: Counter[int] = Counter()
        """How many times each partition was seen held by another replica: a request kept for
        a partition that was someone's meanwhile is that replica's to answer (ownership.py)."""
        self.members: set[str] = set()
        self.wanted: frozenset[int] = frozenset()
        """The partitions this replica should own among the live members (as last read)."""
        self._revisions: dict[int, int] = {}
        """Each owned partition key's revision as last read."""
        self._expiries: dict[int, float] = {}
        """When each partition key expires unless renewed (Unix time, from its value)."""
        self._member_expiries: dict[str, float] = {}
        """When each other member's key expires unless renewed."""
        self._kv: KeyValue | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._round = asyncio.Lock()
        """One round at a time: `stop` never races a round that would take keys again."""

    # --- what callers ask -------------------------------------------------------------------

    def may_serve(self, partition: int) -> bool:
        """Is this replica the owner of `partition` now, with time left on its lease?"""
        return partition in self.serving and self._fresh(partition)

    def rebuilding(self, partition: int) -> bool:
        """Held with time left on the lease, not served yet: its nodes are being brought up to
        date (a takeover). A held lease past its renew deadline is not: it may be lost."""
        return (
            partition not in self.serving
            and partition not in self.releasing
            and self._fresh(partition)
        )

    def holds_fresh(self, partition: int) -> bool:
        """Held, and its last renewal younger than the renew deadline: no other replica can
        hold the key (served or not)."""
        return self._fresh(partition)

    def _fresh(self, partition: int) -> bool:
        """Held, and its last renewal younger than the renew deadline."""
        lease = self.held.get(partition)
        return lease is not None and self.clock() - lease.renewed_at < self.renew_deadline

    def epoch(self, partition: int) -> str | None:
        lease = self.held.get(partition)
        return lease.epoch if lease is not None else None

    def unowned(self, partition: int) -> bool:
        """No replica owned `partition` at the last read (a takeover is under way)."""
        return partition not in self.owners

    # --- lifecycle --------------------------------------------------------------------------

    async def open(self, within: float = OPEN_TIMEOUT) -> None:
        """Bind (or create) the bucket, retrying what a cluster says while it settles (a
        stream leader being elected, replicas starting together): ConnectionError when
        JetStream is not available or the bucket disagrees with this replica."""
        deadline = self.clock() + within
        backoff = 0.05
        while True:
            try:
                await self._open()
                return
            except ConnectionError:
                raise
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                # A server without JetStream answers its API with "service unavailable" (so
                # does a cluster still electing its meta leader: hence the retries).
                absent = isinstance(exc, nats.js.errors.ServiceUnavailableError)
                if self.clock() + backoff > deadline:
                    if absent:
                        raise ConnectionError(NO_JETSTREAM) from exc
                    raise ConnectionError(f"cannot open lease bucket {self.bucket}: {exc}") from exc
                reason = "JetStream unavailable" if absent else str(exc)[:200]
                log.info("lease bucket not ready; retrying", extra={"error": reason})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def first_round(self) -> None:
        """The first round before the service answers anything; a failure is logged and left
        to the rounds that follow (the replica then starts serving nothing)."""
        try:
            await self.step()
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            log.warning("first lease round failed", extra={"error": str(exc)[:200]})

    async def _open(self) -> None:
        js = self.nc.jetstream(timeout=max(self.kv_timeout, 1.0))
        try:
            try:
                self._kv = await js.key_value(self.bucket)
            except nats.js.errors.BucketNotFoundError:
                self._kv = await self._create(js)
        except nats.errors.NoRespondersError as exc:
            raise ConnectionError(NO_JETSTREAM) from exc
        config = (await self._kv.status()).stream_info.config
        age = config.max_age or 0.0
        if abs(age - self.ttl) > 0.001:
            raise ConnectionError(
                f"lease bucket {self.bucket} expires keys after {age:g}s, not --lease-ttl "
                f"{self.ttl:g}s: every replica must use the same --lease-ttl (delete the "
                "bucket to change it)"
            )

    async def _reopen(self) -> None:
        """The bucket's stream is gone (a single NATS server restarted: memory streams do not
        survive it): create it again, so the replicas take their partitions anew instead of
        failing every round for good."""
        try:
            await self._open()
            log.info("lease bucket opened again", extra={"bucket": self.bucket})
        except (ConnectionError, nats.errors.Error, TimeoutError, OSError) as exc:
            log.warning("lease bucket cannot be opened again", extra={"error": str(exc)[:200]})

    async def _create(self, js: object) -> KeyValue:
        # Replicated across the cluster where there is one: R3, else as many as there are.
        for replicas in (3, 1):
            try:
                config = KeyValueConfig(
                    bucket=self.bucket,
                    history=1,
                    ttl=self.ttl,
                    storage=StorageType.MEMORY,
                    replicas=replicas,
                    description="numafit accounting partition leases",
                )
                kv: KeyValue = await js.create_key_value(config)  # type: ignore[attr-defined]
                return kv
            except nats.js.errors.APIError as exc:
                if replicas == 1:
                    raise
                log.info(
                    "lease bucket not replicated 3 times; trying 1",
                    extra={"error": str(exc)[:200]},
                )
        raise AssertionError("unreachable")  # pragma: no cover

    async def run(self) -> None:
        """Converge on the wanted assignment forever (an eternal task of the service)."""
        watcher = asyncio.create_task(self._watch(), name="lease-watch")
        try:
            while not self._stopping:
                started = self.clock()
                # Cleared before the round: a change seen during it wakes the next one at once.
                self._wake.clear()
                failed = False
                try:
                    await self.step()
                except (nats.errors.Error, TimeoutError, OSError) as exc:
                    failed = True
                    log.warning("lease round failed", extra={"error": str(exc)[:200]})
                    if isinstance(exc, LOST_STREAM):
                        await self._reopen()
                await self._expire_stale()
                wait = self.renew_every - (self.clock() - started)
                due = self._next_takeover()
                if due is not None and not failed:
                    # Another's key expires before the next round: be there.
                    wait = min(wait, due - time.time() + EXPIRY_MARGIN)
                if failed:
                    wait = max(wait, self.renew_every / 4)  # NATS is struggling: do not spin
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(wait, 0.01))
            # Stopped on purpose (`stop`): idle until the service cancels its tasks, so the
            # end of this eternal task never reads as a failure.
            await asyncio.Event().wait()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher

    def _next_takeover(self) -> float | None:
        """When the first key another replica holds (a partition, or its member key) would
        expire unless renewed: a round then sees whether its owner is gone and who takes its
        partitions (a partition nobody wants until its old owner's member key is gone too)."""
        now = time.time()
        # A key just past its expiry that the last read still saw is gone any moment (the
        # server's clock, a write a few ms after the estimate): look again shortly, for at
        # most one round's time, so a clock that disagrees cannot make the rounds spin.
        horizon = now - self.renew_every
        due = [at for k, at in self._expiries.items() if k not in self.held and at > horizon]
        due += [at for at in self._member_expiries.values() if at > horizon]
        return max(min(due), now + EXPIRY_MARGIN) if due else None

    async def stop(self) -> None:
        """Hand every partition over at once (stop serving, then delete the keys), and leave."""
        self._stopping = True
        self._wake.set()
        async with self._round:
            held = set(self.held)
            if held:
                await self._release(held, "released", delete=True)
        kv = self._kv
        if kv is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.kv_timeout):
                    await kv.delete(self._member_key(self.replica))

    # --- one round --------------------------------------------------------------------------

    async def step(self) -> None:
        async with self._round:
            if not self._stopping:
                await self._step()

    async def _step(self) -> None:
        kv = self._require()
        member = MemberValue(replica=self.replica, partitions=self.partitions, renewed=time.time())
        await self._timed(kv.put(self._member_key(self.replica), _ENCODER.encode(member)))
        await self._read(kv)
        await self._renew(kv)
        await self._expire_stale()
        wanted = self.wanted
        extras = {k for k in self.held if k not in wanted}
        if extras and not self._stopping:
            # Another live member wants them (it joined): hand them over now.
            await self._release(extras, "released", delete=True)
        acquired: dict[int, str] = {}
        for k in sorted(wanted - set(self.held)):
            if self.owners.get(k) == self.replica:
                # Written by an earlier process of this replica (a restart under the same
                # --replica-id, e.g. the same pod): that process is gone, take it back now.
                over = self._revisions.get(k)
                if over is None:
                    continue
                lease = await self._acquire(kv, k, over)
            elif k in self.owners:
                continue  # still someone's: it expires or is handed over
            else:
                lease = await self._acquire(kv, k)
            if lease is not None:
                acquired[k] = lease.epoch
        if acquired:
            await self._start_serving(acquired)

    async def _read(self, kv: KeyValue) -> None:
        try:
            keys = await self._timed(kv.keys())
        except nats.js.errors.NoKeysError:
            keys = []
        members: set[str] = set()
        owners: dict[int, str] = {}
        revisions: dict[int, int] = {}
        expiries: dict[int, float] = {}
        member_expiries: dict[str, float] = {}
        for key in keys:
            kind, _, name = key.partition(".")
            if kind == "member":
                value = await self._member(kv, key)
                if value is None:
                    continue
                if value.partitions != self.partitions:
                    raise LeaseConflict(
                        f"replica {value.replica} runs with --partitions {value.partitions}, "
                        f"this one with {self.partitions}: every replica must use the same"
                    )
                members.add(name)
                if name != self.replica:
                    member_expiries[name] = value.renewed + self.ttl
            elif kind == "partition" and name.isdigit() and int(name) < self.partitions:
                found = await self._get(kv, key)
                if found is not None:
                    owners[int(name)] = found[0].replica
                    if found[0].replica != self.replica:
                        self.sightings[int(name)] += 1
                    revisions[int(name)] = found[1]
                    renewed = found[0].renewed or found[0].since
                    expiries[int(name)] = renewed + self.ttl
        self.members = members | {self.replica}
        self.wanted = targets(self.replica, self.partitions, self.members)
        self.owners = owners
        self._revisions = revisions
        self._expiries = expiries
        self._member_expiries = member_expiries

    async def _member(self, kv: KeyValue, key: str) -> MemberValue | None:
        found = await self._value(kv, key, _MEMBER)
        return None if found is None else found[0]

    async def _get(self, kv: KeyValue, key: str) -> tuple[LeaseValue, int] | None:
        return await self._value(kv, key, _DECODER)

    async def _value(
        self, kv: KeyValue, key: str, decoder: msgspec.json.Decoder[_V]
    ) -> tuple[_V, int] | None:
        """A key's decoded value and revision; None when absent, deleted or unreadable."""
        try:
            entry = await self._timed(kv.get(key))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        if entry.value is None or entry.revision is None:
            return None
        try:
            return decoder.decode(entry.value), entry.revision
        except msgspec.DecodeError:
            log.warning("unreadable lease key ignored", extra={"key": key})
            return None

    async def _renew(self, kv: KeyValue, only: set[int] | None = None) -> None:
        for k, lease in list(self.held.items()):
            if only is not None and k not in only:
                continue
            sent = self.clock()
            value = LeaseValue(
                replica=self.replica, epoch=lease.epoch, since=lease.since, renewed=time.time()
            )
            try:
                revision = await self._timed(
                    kv.update(self._partition_key(k), _ENCODER.encode(value), last=lease.revision)
                )
            except nats.js.errors.KeyWrongLastSequenceError:
                # The key changed under us: it expired and someone else took it.
                await self._release({k}, "lost", delete=False)
                continue
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                log.warning(
                    "lease renewal failed",
                    extra={"partition": k, "error": str(exc)[:200]},
                )
                continue
            lease.revision = revision
            lease.renewed_at = sent

    async def _expire_stale(self) -> None:
        """Stop serving partitions whose renewals did not land in time."""
        now = self.clock()
        late = {
            k for k, lease in self.held.items() if now - lease.renewed_at >= self.renew_deadline
        }
        if late:
            await self._release(late, "lost", delete=False)

    async def _acquire(self, kv: KeyValue, k: int, over: int | None = None) -> Lease | None:
        """Take partition `k`'s key: create it, or with `over` (the revision an earlier
        process of this replica wrote) compare-and-set over it. None when someone else's."""
        sent = self.clock()
        since = time.time()
        # The epoch names this ownership: the replica and the time it took the key (a new one on
        # every takeover, so readers know the node's revisions restarted).
        epoch = f"{self.replica}.{k}.{int(since * 1000)}"
        body = _ENCODER.encode(
            LeaseValue(replica=self.replica, epoch=epoch, since=since, renewed=since)
        )
        key = self._partition_key(k)
        try:
            if over is None:
                revision = await self._timed(kv.create(key, body))
            else:
                revision = await self._timed(kv.update(key, body, last=over))
        except nats.js.errors.KeyWrongLastSequenceError:
            # Taken (or changed) meanwhile: someone's until a read says whose. Not unowned any
            # more, so requests for it are no longer kept here (its taker answers them).
            self.owners.setdefault(k, TAKEN_BY_ANOTHER)
            self.sightings[k] += 1
            return None
        lease = Lease(k, revision, epoch, sent, since)
        self.held[k] = lease
        self.owners[k] = self.replica
        return lease

    async def _start_serving(self, acquired: dict[int, str]) -> None:
        try:
            await self.on_acquired(acquired)
        except Exception:
            log.exception("taking partitions over failed; handing them back")
            await self._release(set(acquired), "released", delete=True)
            return
        # The rebuild may have taken a while (a large cluster's relist): renew before serving,
        # so serving starts with a full renew deadline, or not at all when the key was lost.
        await self._renew(self._require(), set(acquired))
        started = {k: epoch for k, epoch in acquired.items() if k in self.held}
        self.serving |= set(started)
        if started and self.on_serving is not None:
            try:
                await self.on_serving(set(started))
            except Exception:
                log.exception("subscribing to taken partitions failed; handing them back")
                await self._release(set(started), "released", delete=True)
                return
        for k, epoch in started.items():
            self._changed(k, "acquired", epoch)

    async def _release(self, partitions: set[int], change: str, *, delete: bool) -> None:
        """Stop serving first (requests arriving meanwhile are refused, to be retried at the
        next owner), let the writes under way finish (`on_released`), then free the keys.
        Before all that, while the keys are still this replica's, its subscriptions to them
        are drained (`on_unserving`): what the server delivered is answered here, nothing
        more is delivered."""
        if self.on_unserving is not None and partitions & set(self.held):
            with contextlib.suppress(Exception):  # bounded by its own timeout
                await self.on_unserving(partitions & set(self.held))
        serving = partitions & self.serving
        self.serving -= partitions
        if delete:
            # Handed over: this replica still holds the keys, so it answers (refuses) what
            # arrives until they are free. A lost key may be someone else's already: silent.
            self.releasing |= partitions & set(self.held)
        try:
            if serving:
                with contextlib.suppress(Exception):
                    await self.on_released(serving)
            kv = self._kv
            for k in sorted(partitions):
                lease = self.held.pop(k, None)
                if lease is None:
                    continue
                if delete:
                    self.owners.pop(k, None)
                # A lost key stays someone's (as last read) until a read shows it free: this
                # replica, wanting it back, must not keep requests for a partition another
                # replica serves (it would act on them a second time once it takes it).
                self._changed(k, change, lease.epoch)
                # No longer refused here from the moment the key may be free: the next owner
                # keeps what arrives once it sees the key gone, and two answers to one request
                # would be the result of refusing it here as well.
                self.releasing.discard(k)
                if delete and kv is not None:
                    with contextlib.suppress(Exception):
                        await self._timed(kv.delete(self._partition_key(k), last=lease.revision))
        finally:
            self.releasing -= partitions

    def _changed(self, k: int, change: str, epoch: str) -> None:
        at = time.time()
        log.info(
            f"partition {change}",
            extra={"partition": k, "replica": self.replica, "epoch": epoch, "at": round(at, 6)},
        )
        if self.on_change is not None:
            self.on_change(OwnershipChange(k, change, epoch, at))

    async def _watch(self) -> None:
        """Wake the loop on any change of the bucket (a handed-over key is taken at once
        instead of at the next round). Best effort: the rounds alone also converge."""
        kv = self._require()
        while True:
            try:
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is not None and entry.operation is not None:
                        self._wake.set()  # a deletion: maybe ours to take
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("lease watch ended", extra={"error": str(exc)[:200]})
            await asyncio.sleep(self.renew_every)

    # --- helpers ----------------------------------------------------------------------------

    def _require(self) -> KeyValue:
        if self._kv is None:
            raise RuntimeError("the lease bucket is not open")
        return self._kv

    async def _timed(self, awaitable: Awaitable[_T]) -> _T:
        async with asyncio.timeout(self.kv_timeout):
            return await awaitable

    @staticmethod
    def _partition_key(k: int) -> str:
        return f"partition.{k}"

    @staticmethod
    def _member_key(replica: str) -> str:
        return f"member.{replica}"
