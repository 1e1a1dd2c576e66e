"""Write intents: each claim-carrying write a replica sends, recorded where the next owner reads it.

Why: a PATCH may be committed by the API server after the replica that sent it stopped acting (a
GC pause or a frozen VM past its lease, a SIGKILL) and after another replica took the node's
partition over and listed the pods without it. The new owner would then count the GPU free and
fill it; the late write lands on top: over-commit. Fencing the sender (leases, epochs, deadlines)
cannot stop a request that already left it.

So before a guarded write of a reservation, a move or a bind phase, the owner records its intent
(pod, node, the resourceVersion the write is guarded on) in a JetStream key-value bucket beside
the leases, and deletes it once the write's outcome is known. A replica taking a partition over
settles every intent left there before it serves the partition (`Operations.settle_intent`): a
guarded write of its own at the intent's resourceVersion either lands, and then the late write
can never land (its precondition fails), or conflicts, and then the pod already moved on (the late
write landed, or something else did) and a read shows what is true. Either way the next owner
decides on what the API server will keep.

The bucket (`<lease-bucket>-intents`, on file: a restarted NATS server keeps it) holds one key
per pod with a write under way, `intent.<partition>.<pod-uid>` (a write overwrites the pod's
last intent; its delete names the revision it wrote, so it never removes a newer one). Keys live
MAX_AGE seconds: longer than the lease of the replica that wrote them (the leases bucket expires
keys after a TTL, which a paused owner's intent must survive until a takeover reads it) and than
any write can stay in flight at the API server (its request timeout is 60 s at most), short
enough that the bucket holds only recent pods (a listing at takeover stays small, delete markers
go too). A left-over intent (a delete that did not go through) costs one conflicting write at
the next takeover, nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import KeyValueConfig, StorageType

from svc_accounting.leases import LOST_STREAM

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nats.aio.client import Client
    from nats.js.kv import KeyValue

log = logging.getLogger("numafit.accounting")

SUFFIX = "-intents"
MAX_AGE = 120.0
"""Seconds an intent is kept: twice kube-apiserver's longest request timeout (60 s)."""
OPEN_TIMEOUT = 15.0
"""Seconds start-up keeps trying to open the bucket (as for the lease bucket)."""
MAX_PENDING_TASKS = 1024
"""Deletes of settled intents in the background at most (beyond it they are awaited)."""


class WriteIntent(msgspec.Struct, frozen=True, kw_only=True):
    """A write under way: the pod it targets and the resourceVersion it is guarded on."""

    namespace: str
    name: str
    uid: str
    node: str
    resource_version: str = msgspec.field(name="resourceVersion")
    replica: str
    at: float
    """Unix time the intent was recorded (for logs: how long it stayed unsettled)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(WriteIntent)


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a write whose expected last sequence is not the key's."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """Where an intent is stored: its key and the revision its writer put there."""

    key: str
    revision: int | None


class IntentUnavailable(Exception):
    """The intent could not be recorded: the write must not be sent."""


class IntentLog:
    def __init__(self, nc: Client, *, bucket: str, timeout: float) -> None:
        self.nc = nc
        self.bucket = bucket + SUFFIX
        self.timeout = timeout
        self._kv: KeyValue | None = None
        self._deletes: set[asyncio.Task[None]] = set()

    async def open(self, within: float = OPEN_TIMEOUT) -> None:
        """Bind (or create) the bucket, retrying what a NATS cluster says while it settles (a
        stream leader being elected after the lease bucket's creation): ConnectionError when
        it still cannot be opened after `within` seconds."""
        deadline = time.monotonic() + within
        backoff = 0.05
        while True:
            try:
                await self._open()
                return
            except (nats.errors.Error, TimeoutError, OSError) as exc:
                if time.monotonic() + backoff > deadline:
                    raise ConnectionError(
                        f"cannot open intent bucket {self.bucket}: {exc!r}"[:300]
                    ) from exc
                log.info("intent bucket not ready; retrying", extra={"error": repr(exc)[:200]})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _open(self) -> None:
        js = self.nc.jetstream(timeout=max(self.timeout, 1.0))
        try:
            self._kv = await js.key_value(self.bucket)
            return
        except nats.js.errors.BucketNotFoundError:
            pass
        for replicas in (3, 1):  # replicated across a cluster where there is one
            try:
                self._kv = await js.create_key_value(
                    KeyValueConfig(
                        bucket=self.bucket,
                        history=1,
                        ttl=MAX_AGE,
                        storage=StorageType.FILE,
                        replicas=replicas,
                        description="numafit accounting writes under way",
                    )
                )
                return
            except nats.js.errors.BadRequestError:
                # Created by another replica meanwhile (or R3 refused): bind, else try R1.
                try:
                    self._kv = await js.key_value(self.bucket)
                    return
                except nats.js.errors.BucketNotFoundError:
                    if replicas == 1:
                        raise
            except nats.js.errors.APIError:
                if replicas == 1:
                    raise

    async def record(self, partition: int, intent: WriteIntent, within: float) -> Recorded:
        """Store `intent` before its write is sent. IntentUnavailable when the bucket does not
        take it in time (the write is then not sent: nobody could settle it)."""
        kv = self._kv
        if kv is None:
            raise IntentUnavailable("the intent bucket is not open")
        key = f"intent.{partition}.{intent.uid}"
        try:
            async with asyncio.timeout(min(within, self.timeout)):
                try:
                    revision = await kv.put(key, _ENCODER.encode(intent))
                except LOST_STREAM:
                    # The bucket is gone (its NATS server lost its store): made again, once.
                    await self._open()
                    revision = await self._require().put(key, _ENCODER.encode(intent))
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise IntentUnavailable(f"cannot record the write's intent: {exc!r}"[:200]) from exc
        return Recorded(key, revision)

    def _require(self) -> KeyValue:
        if self._kv is None:
            raise IntentUnavailable("the intent bucket is not open")
        return self._kv

    def clear(self, recorded: Recorded) -> None:
        """The write's outcome is known: forget its intent, in the background (the reply does
        not wait; a delete that fails leaves garbage the next takeover settles harmlessly)."""
        if len(self._deletes) >= MAX_PENDING_TASKS:
            log.warning("intent deletes are piling up; one left for the next takeover")
            return
        task = asyncio.get_running_loop().create_task(
            self._delete(recorded.key, recorded.revision), name="intent-clear"
        )
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete(self, key: str, revision: int | None) -> None:
        kv = self._kv
        if kv is None:
            return
        try:
            async with asyncio.timeout(self.timeout):
                # Only the intent this write recorded: the pod's next write may have recorded
                # its own meanwhile (its delete is that write's to do).
                await kv.delete(key, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        except nats.js.errors.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                log.info("intent not deleted", extra={"intent": key, "error": repr(exc)[:200]})
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            log.info("intent not deleted", extra={"intent": key, "error": repr(exc)[:200]})

    async def settle_all(self) -> None:
        """Wait (bounded) for the background deletes (graceful shutdown)."""
        if self._deletes:
            await asyncio.wait(set(self._deletes), timeout=self.timeout)

    async def pending(self, partitions: Iterable[int]) -> list[tuple[Recorded, WriteIntent | None]]:
        """The intents left in `partitions` (None for a value that does not decode: it is
        dropped by whoever settles). Raises on a bucket that cannot be read: a takeover must
        not serve a partition whose writes under way it cannot know."""
        kv = self._kv
        if kv is None:
            raise IntentUnavailable("the intent bucket is not open")
        wanted = {str(k) for k in partitions}
        if not wanted:
            return []
        try:
            async with asyncio.timeout(self.timeout):
                found = await kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        except LOST_STREAM:
            # Gone with its server's store: nothing can be known of the writes it held (a
            # memory store; this bucket is kept on file so that a restart does not lose it).
            log.warning("intent bucket lost; created again", extra={"bucket": self.bucket})
            await self._open()
            return []
        out: list[tuple[Recorded, WriteIntent | None]] = []
        for key in found:
            if partition_of_key(key) not in wanted:
                continue
            try:
                async with asyncio.timeout(self.timeout):
                    entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue  # deleted meanwhile (its writer learned the outcome)
            recorded = Recorded(key, entry.revision)
            try:
                out.append((recorded, _DECODER.decode(entry.value or b"")))
            except msgspec.DecodeError:
                out.append((recorded, None))
        return out

    async def forget(self, recorded: Recorded) -> None:
        """Delete a settled intent now (a takeover waits for it: the next takeover must not
        settle it again needlessly, but a failure here is only garbage)."""
        await self._delete(recorded.key, recorded.revision)


def partition_of_key(key: str) -> str | None:
    """`intent.<partition>.<pod-uid>` -> the partition as written; None for any other key."""
    parts = key.split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "intent" else None


def intent_for(
    namespace: str, name: str, uid: str, node: str, resource_version: str, replica: str
) -> WriteIntent:
    return WriteIntent(
        namespace=namespace,
        name=name,
        uid=uid,
        node=node,
        resource_version=resource_version,
        replica=replica,
        at=time.time(),
    )
