"""kubelet v1.28.7 rejects a pod whose init container asks for an extended resource no device
plugin advertises (`OutOfnvidia.com/gpucores`, kubernetes/kubernetes#124255), after the device
plugin ran. numafit's admission webhook gives an init container asking for a whole GPU
`nvidia.com/gpucores: 100`, so such a pod would always fail on this kubelet: numafit's
scheduler reads the node's kubelet version and refuses the node for it instead (issue 21 item
5), before anything is reserved or the plugin is asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.real.kubelet import cases
from tests.real.kubelet.deviceplugin import GPU_NUMA
from tests.real.kubelet.kubelet import SINGLE_NUMA_NODE
from tests.real.kubelet.observe import allocations_ok, refit_results
from tests.real.kubelet.tier import kubelet_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.kubelet.node import RealNode

pytestmark = kubelet_tier()

THROUGH_WEBHOOK = cases.Case(
    "init-through-webhook",
    SINGLE_NUMA_NODE,
    (cases.Box("prep", memory=None, cores=None, init=True), cases.MAIN),
    "strict",
)
REASON = (
    "KubeletRejectsInitContainerResources: kubelet v1.28.7 would reject the pod "
    "(OutOfnvidia.com/gpucores)"
)


def test_a_node_whose_kubelet_would_reject_the_pod_is_refused_for_it(
    real_node: RealNode,
) -> None:
    # Any Topology Manager policy: the rule is the kubelet version's.
    node = real_node
    node.assert_idle()
    kubelet_version = node.api.node(cases.NODE)["status"]["nodeInfo"]["kubeletVersion"]
    assert kubelet_version == "v1.28.7"
    metrics = node.plugin.metrics()
    path = f"/api/v1/namespaces/{THROUGH_WEBHOOK.namespace}/pods/{THROUGH_WEBHOOK.name}"
    created = node.api.create(
        f"/api/v1/namespaces/{THROUGH_WEBHOOK.namespace}/pods", THROUGH_WEBHOOK.manifest()
    )
    uid = created["metadata"]["uid"]
    try:
        (prep,) = created["spec"]["initContainers"]
        assert prep["resources"]["limits"]["nvidia.com/gpucores"] == "100"  # the webhook's

        def refusal() -> str | None:
            for _, reason, message in node.events(THROUGH_WEBHOOK.namespace, uid):
                if reason == "FailedScheduling" and REASON in message:
                    return message
            return None

        poll(
            refusal,
            within=60,
            what="kube-scheduler reports numafit's refusal",
            last=lambda: node.events(THROUGH_WEBHOOK.namespace, uid),
        )
        assert not node.api.get(path)["spec"].get("nodeName")
        assert node.ledger_pod(uid) is None
        assert node.reserved_memory() == dict.fromkeys(GPU_NUMA, 0.0)
        now = node.plugin.metrics()
        assert refit_results(now) == refit_results(metrics)
        assert allocations_ok(now) == allocations_ok(metrics)
    finally:
        node.api.delete(path, grace_seconds=0)
        poll(lambda: not node.api.exists(path), within=30, what="pod deleted")
