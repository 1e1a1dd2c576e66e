"""Held reservations in the ledger (pure state): counted at once, kept across unrelated pod
updates, ended by the pod's own reservation, released on expiry with what the pod carries."""

from __future__ import annotations

import copy
from typing import Any

from shared.core import keys
from shared.core.model import Usage
from shared.core.pods import pod_from_object
from svc_accounting.ledger import Ledger
from tests.builders import container, gpu, node, pod

ONE = "GPU-a,NVIDIA,20000,30:;"
OTHER = "GPU-b,NVIDIA,10000,30:;"


def ledger_with_nodes() -> Ledger:
    ledger = Ledger()
    for name, uuid in (("node-1", "GPU-a"), ("node-2", "GPU-b")):
        annotations = node(name, [gpu(uuid, 0)])["metadata"]["annotations"]
        ledger.set_node(name, annotations)
    return ledger


def unbound(version: str = "5", **annotations: str) -> dict[str, Any]:
    obj = pod("train", containers=[container("main", 1, 20000, 30)], node_name="", uid="u1")
    obj["metadata"]["resourceVersion"] = version
    obj["metadata"]["annotations"].update(annotations)
    return obj


def used(ledger: Ledger, name: str) -> int:
    snapshot = ledger.nodes[name].snapshot
    assert snapshot is not None
    return sum(d.usedmem for d in snapshot.devices)


def test_a_hold_counts_on_its_node_and_in_the_quota_at_once() -> None:
    ledger = ledger_with_nodes()
    revision = ledger.nodes["node-1"].revision
    changed = ledger.hold(pod_from_object(unbound()), "node-1", ONE, 100, 130.0)
    assert changed == {"node-1"}
    assert used(ledger, "node-1") == 20000
    assert ledger.nodes["node-1"].revision == revision + 1
    assert ledger.quota.used["default"].mem == 20000
    tracked = ledger.tracked("u1")
    assert tracked is not None and tracked.pod.annotations[keys.VGPU_TIME] == "100"


def test_an_unrelated_update_of_the_pod_keeps_the_hold_over_the_newer_object() -> None:
    ledger = ledger_with_nodes()
    ledger.hold(pod_from_object(unbound()), "node-1", ONE, 100, 130.0)
    revision = ledger.nodes["node-1"].revision
    relabelled = unbound("6")
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert ledger.observe(pod_from_object(relabelled)) == set()
    assert ledger.nodes["node-1"].revision == revision  # nothing counted changed
    assert ledger.held["u1"].pod.resource_version == "6"  # the bind's write is guarded by it
    assert used(ledger, "node-1") == 20000


def test_the_pods_own_written_reservation_ends_the_hold() -> None:
    ledger = ledger_with_nodes()
    ledger.hold(pod_from_object(unbound()), "node-1", ONE, 100, 130.0)
    written = unbound(
        "7",
        **{
            keys.VGPU_NODE: "node-1",
            keys.ALLOCATED: ONE,
            keys.TO_ALLOCATE: ONE,
            keys.BIND_PHASE: keys.PHASE_ALLOCATING,
        },
    )
    ledger.observe(pod_from_object(written))
    assert "u1" not in ledger.held
    tracked = ledger.tracked("u1")
    assert tracked is not None and tracked.pod.resource_version == "7"
    assert used(ledger, "node-1") == 20000


def test_expiry_releases_the_hold_and_the_earlier_written_reservation_counts_again() -> None:
    ledger = ledger_with_nodes()
    # Written by an earlier bind that failed: counted on node-2.
    earlier = unbound(
        **{
            keys.VGPU_NODE: "node-2",
            keys.ALLOCATED: OTHER,
            keys.TO_ALLOCATE: OTHER,
            keys.BIND_PHASE: keys.PHASE_FAILED,
        }
    )
    ledger.observe(pod_from_object(earlier))
    assert used(ledger, "node-2") == 10000
    ledger.hold(pod_from_object(copy.deepcopy(earlier)), "node-1", ONE, 100, 130.0)
    assert (used(ledger, "node-1"), used(ledger, "node-2")) == (20000, 0)
    assert ledger.next_expiry() == 130.0
    assert ledger.expire(129.9) == ([], set())
    expired, changed = ledger.expire(130.0)
    assert [h.pod.uid for h in expired] == ["u1"]
    assert changed == {"node-1", "node-2"}
    assert (used(ledger, "node-1"), used(ledger, "node-2")) == (0, 10000)
    assert ledger.next_expiry() is None


def test_deleting_the_pod_drops_its_hold() -> None:
    ledger = ledger_with_nodes()
    ledger.hold(pod_from_object(unbound()), "node-1", ONE, 100, 130.0)
    assert ledger.forget("u1") == {"node-1"}
    assert ledger.held == {} and used(ledger, "node-1") == 0
    assert ledger.quota.used.get("default", Usage()).mem == 0


def _bound_by_binding(version: str) -> dict[str, Any]:
    """The pod as accounting's Binding leaves it, at `version` (the Binding's guard)."""
    obj = unbound(
        version,
        **{
            keys.VGPU_NODE: "node-1",
            keys.VGPU_TIME: "100",
            keys.ALLOCATED: ONE,
            keys.TO_ALLOCATE: ONE,
            keys.BIND_PHASE: keys.PHASE_ALLOCATING,
            keys.BIND_TIME: "101",
        },
    )
    obj["spec"]["nodeName"] = "node-1"
    return obj


def test_a_binding_ends_the_hold_at_its_guard_and_the_version_before_stays_stale() -> None:
    ledger = ledger_with_nodes()
    ledger.hold(pod_from_object(unbound("5")), "node-1", ONE, 100, 130.0)
    # The Binding's answer is a Status: the ledger takes the written content at the guard's
    # resourceVersion (5), which `observe` alone would ignore as not newer.
    ledger.observe_bound(pod_from_object(_bound_by_binding("5")))
    assert "u1" not in ledger.held
    tracked = ledger.tracked("u1")
    assert tracked is not None
    assert tracked.pod.node_name == "node-1"
    assert tracked.pod.annotations[keys.BIND_PHASE] == keys.PHASE_ALLOCATING
    assert used(ledger, "node-1") == 20000
    # The watch delivering the pod as it was before the Binding (a lagging watch) changes
    # nothing: the node stays locked for it and its GPU counted.
    assert ledger.observe(pod_from_object(unbound("5"))) == set()
    tracked = ledger.tracked("u1")
    assert tracked is not None and tracked.pod.annotations[keys.BIND_PHASE] == "allocating"
    assert ledger.unseen == {"u1": "5"}  # its written version is not known yet
    seen: list[str] = []
    ledger.on_seen = seen.append
    # The Binding's own event (a newer resourceVersion) is applied as usual, and ends that.
    ledger.observe(pod_from_object(_bound_by_binding("8")))
    tracked = ledger.tracked("u1")
    assert tracked is not None and tracked.pod.resource_version == "8"
    assert ledger.unseen == {} and seen == ["u1"]


def test_a_binding_the_watch_already_showed_is_not_applied_again() -> None:
    ledger = ledger_with_nodes()
    ledger.hold(pod_from_object(unbound("5")), "node-1", ONE, 100, 130.0)
    later = _bound_by_binding("9")
    later["metadata"]["annotations"][keys.BIND_PHASE] = keys.PHASE_SUCCESS
    ledger.observe(pod_from_object(later))  # the watch was faster, and the pod moved on
    assert ledger.observe_bound(pod_from_object(_bound_by_binding("5"))) == set()
    tracked = ledger.tracked("u1")
    assert tracked is not None
    assert tracked.pod.resource_version == "9"
    assert tracked.pod.annotations[keys.BIND_PHASE] == keys.PHASE_SUCCESS
