"""On the real kube-scheduler: transient refusals back the pod off, permanent ones park it.

kube-scheduler v1.28 parks a pod its extender's filter refuses (FailedNodes,
FailedAndUnresolvableNodes and Error alike: `Unschedulable`) in its unschedulable pool, from
which only a cluster event it registers (a Node added or changed, an assigned pod deleted, ...)
or the five-minute flush takes it; a pod whose bind fails goes to its backoff (1 s doubling to
10 s) and is tried again. A namespace quota raised is no event kube-scheduler knows, so
numafit answers a refusal by quota alone (it may be raised, or another pod of the namespace
may leave) through the bind: the pod keeps being tried, and binds within seconds of the
raise. A pod no GPU can hold is refused at filter time with numafit's reasons and stays
Unschedulable.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()

RAISED_WITHIN = 15.0
"""Seconds from the quota's raise to the bind: kube-scheduler's longest backoff (10 s), the
quota's way to accounting (its watch) and the bind."""
USED = "requests.nvidia.com/gpumem"


def scheduled_condition(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    conditions = cluster.pod(plane, namespace, name)["status"].get("conditions") or []
    found = [c for c in conditions if c["type"] == "PodScheduled"]
    return found[0] if found else {}


def test_a_quota_refusal_is_retried_until_the_raise_and_no_fit_stays_unschedulable(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    group = cluster.unique("backoff")
    node = f"{group}-node"
    cluster.create_gpu_node(plane, numafit, node, group, [Gpu(f"GPU-{node}-0", 0, 40000)])
    namespace = cluster.new_namespace(plane, "backoff")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": {USED: "30000"}},
    }
    plane.apply([quota])

    # Half a card is 20000 MiB in numafit's count (nothing in the API server's: a percentage).
    cluster.create(plane, cluster.gpu_pod("first", namespace, group, percentage=50))
    cluster.bound_and_allocated(plane, numafit, namespace, "first")
    cluster.create(plane, cluster.gpu_pod("second", namespace, group, percentage=50))
    # 90000 MiB fits no GPU at all: no quota or release will ever change that (another
    # namespace: the webhook refuses a pod its namespace's quota can never hold).
    elsewhere = cluster.new_namespace(plane, "backoff")
    cluster.create(plane, cluster.gpu_pod("never", elsewhere, group, memory=90000))

    def refused_by_quota() -> str | None:
        text = cluster.describe(plane, namespace, "second")
        return text if "ResourceQuotaNotFit" in text else None

    described = poll(
        refused_by_quota,
        within=cluster.SCHEDULE_WITHIN,
        what="second refused by numafit's quota",
        last=lambda: cluster.describe(plane, namespace, "second")[-1200:],
    )
    assert "retried with backoff" in described
    # Its bind failed (SchedulerError: kube-scheduler's backoff), it was not refused (that
    # would be Unschedulable: parked until an unrelated event).
    assert scheduled_condition(plane, namespace, "second")["reason"] == "SchedulerError"
    assert cluster.pod(plane, namespace, "second")["spec"].get("nodeName") is None

    never: dict[str, Any] = poll(
        lambda: scheduled_condition(plane, elsewhere, "never") or None,
        within=cluster.SCHEDULE_WITHIN,
        what="never refused",
    )
    assert (never["status"], never["reason"]) == ("False", "Unschedulable")
    assert "CardInsufficientMemory" in never["message"]

    plane.kubectl(
        "patch", "resourcequota", "gpu", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"hard": {USED: "60000"}}}),
    )  # fmt: skip
    placed = poll(
        lambda: (p := cluster.pod(plane, namespace, "second"))["spec"].get("nodeName") and p,
        within=RAISED_WITHIN,
        what="second bound after the quota's raise",
        last=lambda: cluster.describe(plane, namespace, "second")[-1200:],
    )
    assert placed["spec"]["nodeName"] == node
    assert [d[1] for d in cluster.reserved_gpus(placed)] == [20000]
    assert cluster.pod(plane, elsewhere, "never")["spec"].get("nodeName") is None
