"""HAMi's node lock as the core decides it (shared/core/lock.py): one pod allocating per node."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core import keys
from shared.core.accounting import TrackedPod, track_pod
from shared.core.lock import NODE_LOCK_EXPIRY_SECONDS, Lock, node_lock, pending_pod
from shared.core.pods import pod_from_object
from tests.builders import container, pod

NOW = 1_000_000
ENTRY = "GPU-a,NVIDIA,5000,10:;"


def tracked(
    name: str,
    *,
    phase: str | None = keys.PHASE_ALLOCATING,
    bound: int | None = NOW - 10,
    status: str = "Pending",
    to_allocate: str | None = None,
    scheduled: int = 1,
) -> TrackedPod:
    annotations: dict[str, Any] = {keys.VGPU_TIME: str(scheduled)}
    if phase is not None:
        annotations[keys.BIND_PHASE] = phase
    if bound is not None:
        annotations[keys.BIND_TIME] = str(bound)
    body = pod(
        name,
        containers=[container("main", 1, 5000, 10)],
        namespace="ml",
        uid=f"uid-{name}",
        allocated=ENTRY,
        to_allocate=to_allocate,
        annotations=annotations,
        phase=status,
    )
    result = track_pod(pod_from_object(body))
    assert result is not None
    return result


CASES: list[tuple[str, list[TrackedPod], int, str, str | None]] = [
    ("no pods", [], NOW, "", None),
    ("allocating holds the lock", [tracked("a")], NOW, "", "uid-a"),
    ("the holder is not locked out", [tracked("a")], NOW, "uid-a", None),
    ("reserved, not yet bound", [tracked("a", phase=None, bound=None)], NOW, "", None),
    ("admitted", [tracked("a", phase=keys.PHASE_SUCCESS)], NOW, "", None),
    ("bind failed", [tracked("a", phase=keys.PHASE_FAILED)], NOW, "", None),
    ("entries consumed", [tracked("a", to_allocate=";")], NOW, "", None),
    ("no longer Pending", [tracked("a", status="Running")], NOW, "", None),
    (
        "just before expiry",
        [tracked("a", bound=NOW - NODE_LOCK_EXPIRY_SECONDS + 1)],
        NOW,
        "",
        "uid-a",
    ),
    ("expired", [tracked("a", bound=NOW - NODE_LOCK_EXPIRY_SECONDS)], NOW, "", None),
    (
        "the oldest bind first",
        [tracked("b", bound=NOW - 5), tracked("a", bound=NOW - 9)],
        NOW,
        "",
        "uid-a",
    ),
    (
        "then the next",
        [tracked("b", bound=NOW - 5), tracked("a", bound=NOW - 9)],
        NOW,
        "uid-a",
        "uid-b",
    ),
    (
        "same bind time: schedule time",
        [tracked("b", scheduled=2), tracked("a", scheduled=3)],
        NOW,
        "",
        "uid-b",
    ),
]


@pytest.mark.parametrize(
    ("pods", "now", "exclude", "holder"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_node_lock(pods: list[TrackedPod], now: int, exclude: str, holder: str | None) -> None:
    lock = node_lock(pods, now, exclude)
    assert (lock.uid if lock is not None else None) == holder


def test_the_lock_names_the_pod_and_its_bind_time() -> None:
    pods = [tracked("a", bound=NOW - 10)]
    assert node_lock(pods, NOW) == Lock("ml/a", "uid-a", NOW - 10)
    assert node_lock(pods, NOW).reason == "node is still allocating pod ml/a"  # type: ignore[union-attr]
    holder = pending_pod(pods)
    assert holder is not None and holder.uid == "uid-a"


def test_without_a_time_the_lock_is_returned_whatever_its_age() -> None:
    old = [tracked("a", bound=NOW - 10 * NODE_LOCK_EXPIRY_SECONDS)]
    assert node_lock(old, NOW) is None
    lock = node_lock(old)
    assert lock is not None and lock.expired(NOW)
    assert not lock.blocks("uid-b", NOW)
    fresh = Lock("ml/a", "uid-a", NOW - 1)
    assert fresh.blocks("uid-b", NOW) and not fresh.blocks("uid-a", NOW)
