"""HAMi's node lock: one pod per node is being allocated at a time.

A pod holds its node's lock from bind-phase `allocating` until the device plugin has consumed
its to-allocate entry (or the pod is admitted, fails, or leaves Pending): while it does, the
plugin's `pending` names exactly that pod. Accounting refuses to bind a second pod there, and
the scheduler does not pick such a node for another pod while a free one fits. A lock older
than `NODE_LOCK_EXPIRY_SECONDS` (by its bind time) no longer counts, as in HAMi.

Pure: times are Unix seconds given by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shared.core import keys

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shared.core.accounting import TrackedPod

NODE_LOCK_EXPIRY_SECONDS: Final = 300
"""A pod still `allocating` after this long no longer blocks its node (HAMi's lock expiry)."""


@dataclass(frozen=True, slots=True)
class Lock:
    """The pod that holds a node's lock: its `namespace/name`, UID, and bind time (Unix s)."""

    pod_key: str
    uid: str
    since: int

    def expired(self, now: int | float) -> bool:
        return now - self.since >= NODE_LOCK_EXPIRY_SECONDS

    def blocks(self, uid: str, now: int | float) -> bool:
        """Does this lock keep pod `uid` off the node at `now`? (Never the holder itself.)"""
        return self.uid != uid and not self.expired(now)

    @property
    def reason(self) -> str:
        """Why a node with this lock is not chosen (FailedNodes text)."""
        return f"node is still allocating pod {self.pod_key}"


def _time(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def is_allocating(tracked: TrackedPod) -> bool:
    """Bind-phase `allocating`, still Pending, with a non-empty to-allocate entry."""
    return (
        tracked.pod.annotations.get(keys.BIND_PHASE) == keys.PHASE_ALLOCATING
        and tracked.pod.phase == "Pending"
        and tracked.pending_rows is not None
        and any(tracked.pending_rows)
    )


def pending_pod(pods: Iterable[TrackedPod], exclude_uid: str = "") -> TrackedPod | None:
    """The pod a node must allocate next (of `pods`, less `exclude_uid`): the oldest bind (then
    schedule) time first, as kubelet admits pods in the order they were bound."""
    candidates = [p for p in pods if p.uid != exclude_uid and is_allocating(p)]
    if not candidates:
        return None

    def order(p: TrackedPod) -> tuple[int, int, str]:
        return (
            _time(p.pod.annotations.get(keys.BIND_TIME)),
            _time(p.pod.annotations.get(keys.VGPU_TIME)),
            p.uid,
        )

    return min(candidates, key=order)


def lock_of(tracked: TrackedPod) -> Lock:
    return Lock(tracked.pod.key, tracked.uid, _time(tracked.pod.annotations.get(keys.BIND_TIME)))


def node_lock(
    pods: Iterable[TrackedPod], now: int | float | None = None, exclude_uid: str = ""
) -> Lock | None:
    """The lock another pod than `exclude_uid` holds on the node of `pods`; None when free.

    With `now`, an expired lock is no lock; without, the lock is returned whatever its age (a
    publisher's view: each reader judges the expiry by its own clock through `Lock.blocks`).
    """
    holder = pending_pod(pods, exclude_uid)
    if holder is None:
        return None
    lock = lock_of(holder)
    if now is not None and lock.expired(now):
        return None
    return lock
