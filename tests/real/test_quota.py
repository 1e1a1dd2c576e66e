"""A namespace's ResourceQuota on GPU memory, with kube-controller-manager filling its
`status.used` and kube-apiserver's own quota admission beside numafit's.

The API server counts `requests.nvidia.com/gpumem` as pods declare it; numafit counts what it
reserves, which includes memory asked as a percentage of a card (no request the API server can
see). Both hold: a pod the API server's count refuses is never created, and a pod only
numafit's count refuses stays Pending with `ResourceQuotaNotFit`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()
USED = "requests.nvidia.com/gpumem"


def test_quota_counted_by_the_api_server_and_by_numafit(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    group = cluster.unique("quota")
    node = f"{group}-node"
    cluster.create_gpu_node(
        plane,
        numafit,
        node,
        group,
        [Gpu(f"GPU-{node}-0", 0, 40000), Gpu(f"GPU-{node}-1", 0, 40000)],
    )
    namespace = cluster.new_namespace(plane, "quota")
    plane.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": namespace},
                "spec": {"hard": {USED: "50000"}},
            }
        ]
    )

    def used() -> str | None:
        """status.used, as the API server writes it: canonical quantities (30000 is "30k")."""
        status = plane.kubectl_json("get", "resourcequota", "gpu", "-n", namespace).get("status")
        value = (status or {}).get("used", {}).get(USED)
        return None if value is None else str(value)

    poll(lambda: used() == "0", within=30, what="kube-controller-manager filled status.used")

    cluster.create(plane, cluster.gpu_pod("declared", namespace, group, memory=30000))
    cluster.bound_and_allocated(plane, numafit, namespace, "declared")
    poll(lambda: used() == "30k", within=30, what="status.used counts the declared pod")

    # Half a 40000 MiB card is 20000 MiB in numafit's count (50000 in all: at the limit) and
    # nothing in the API server's.
    cluster.create(plane, cluster.gpu_pod("half", namespace, group, percentage=50))
    half = cluster.bound_and_allocated(plane, numafit, namespace, "half")
    assert [d[1] for d in cluster.reserved_gpus(half)] == [20000]
    assert used() == "30k"

    # A quarter more: admitted by the API server, refused by numafit's count.
    cluster.create(plane, cluster.gpu_pod("quarter", namespace, group, percentage=25))
    poll(
        lambda: "ResourceQuotaNotFit" in cluster.describe(plane, namespace, "quarter"),
        within=cluster.SCHEDULE_WITHIN,
        what="quarter refused by numafit's quota",
        last=lambda: cluster.describe(plane, namespace, "quarter")[-800:],
    )
    assert cluster.pod(plane, namespace, "quarter")["spec"].get("nodeName") is None

    # 30000 more declared: the API server's own count refuses the creation.
    refused = plane.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps(cluster.gpu_pod("over", namespace, group, memory=30000)),
        check=False,
    )
    assert refused.returncode != 0 and "exceeded quota: gpu" in refused.stderr

    # More than the whole quota: numafit's webhook refuses it before the API server counts.
    refused = plane.kubectl(
        "create",
        "-f",
        "-",
        input=json.dumps(cluster.gpu_pod("never", namespace, group, memory=60000)),
        check=False,
    )
    assert refused.returncode != 0 and "denied the request" in refused.stderr
    assert "quota" in refused.stderr

    # Freeing the declared pod lets the quarter in (numafit releases, then re-filters).
    plane.kubectl("delete", "pod", "declared", "-n", namespace, "--grace-period=0", "--force")
    assert cluster.bound(plane, namespace, "quarter")["spec"]["nodeName"] == node
    poll(lambda: used() == "0", within=30, what="status.used after the deletion")
