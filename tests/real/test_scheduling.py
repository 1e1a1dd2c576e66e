"""kube-scheduler, configured exactly as the svc-scheduler chart renders it, schedules GPU pods
through numafit's extender over HTTPS: filter reserves through accounting, the extender binds,
and a pod that fits nowhere stays Pending with numafit's reasons in `kubectl describe pod`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()


def test_kube_scheduler_uses_the_extender(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    group = cluster.unique("sched")
    small, large = f"{group}-small", f"{group}-large"
    cluster.create_gpu_node(plane, numafit, small, group, [Gpu(f"GPU-{small}-0", 0, 20000)])
    cluster.create_gpu_node(
        plane,
        numafit,
        large,
        group,
        [Gpu(f"GPU-{large}-0", 0, 80000), Gpu(f"GPU-{large}-1", 1, 80000)],
    )
    namespace = cluster.new_namespace(plane, "sched")
    fits_before = numafit.sample("scheduler", 'numafit_scheduler_filter_total{result="fit"}')
    binds_before = numafit.sample("scheduler", 'numafit_scheduler_bind_total{result="ok"}')

    # 30000 MiB fits only the large node's GPUs.
    cluster.create(plane, cluster.gpu_pod("fits", namespace, group, memory=30000, cores=20))
    placed = cluster.bound(plane, namespace, "fits")
    assert placed["spec"]["nodeName"] == large
    assert placed["spec"]["schedulerName"] == numafit.scheduler_name  # the webhook routed it
    (device,) = cluster.reserved_gpus(placed)
    assert device[0] in {f"GPU-{large}-0", f"GPU-{large}-1"}
    assert device[1:] == (30000, 20)
    assert placed["metadata"]["annotations"][cluster.BIND_PHASE] == "allocating"
    scheduled = [
        e for e in cluster.events_of(plane, namespace, "fits") if e["reason"] == "Scheduled"
    ]
    # kube-scheduler records through events.k8s.io/v1: the reporting controller, no source.
    assert scheduled and scheduled[0]["reportingComponent"] == numafit.scheduler_name
    assert f"Successfully assigned {namespace}/fits to {large}" in scheduled[0]["message"]
    assert numafit.sample("scheduler", 'numafit_scheduler_filter_total{result="fit"}') > fits_before
    assert numafit.sample("scheduler", 'numafit_scheduler_bind_total{result="ok"}') > binds_before
    # The filter keeps the one node it reserved on, and kube-scheduler scores only when more
    # than one node is feasible: /prioritize is configured but never called for GPU pods.
    assert numafit.sample("scheduler", 'numafit_scheduler_prioritize_total{result="ok"}') == 0

    # 90000 MiB fits no GPU: kube-scheduler reports each node's reason as the extender gave it.
    cluster.create(plane, cluster.gpu_pod("too-big", namespace, group, memory=90000))
    pattern = re.compile(
        r"0/\d+ nodes are available: "
        r"(?=.*\b1 1/1 CardInsufficientMemory)(?=.*\b1 2/2 CardInsufficientMemory)"
    )
    described = poll(
        lambda: (
            (text := cluster.describe(plane, namespace, "too-big"))
            and pattern.search(text)
            and text
        ),
        within=cluster.SCHEDULE_WITHIN,
        what="FailedScheduling with numafit's reasons",
        last=lambda: cluster.describe(plane, namespace, "too-big")[-1200:],
    )
    assert "FailedScheduling" in described
    assert cluster.pod(plane, namespace, "too-big")["spec"].get("nodeName") is None
    # Nothing was reserved for it: the large node's ledger holds the first pod only.
    held = cluster.ledger_pods(numafit, large)
    assert held is not None and list(held) == [placed["metadata"]["uid"]]
