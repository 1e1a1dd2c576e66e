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
from tests.real.kubelet.tier import kubelet_tier

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.real.kubelet.cases import Case
    from tests.real.kubelet.observe import PodSeen

pytestmark = kubelet_tier()

REASON = (
    "KubeletRejectsInitContainerResources: kubelet v1.28.7 would reject the pod "
    "(OutOfnvidia.com/gpucores)"
)


def test_a_node_whose_kubelet_would_reject_the_pod_is_refused_for_it(
    run: Callable[[Case], PodSeen],
) -> None:
    seen = run(cases.INIT_THROUGH_WEBHOOK)
    assert seen.kubelet_version == "v1.28.7"
    (prep,) = seen.spec["initContainers"]
    assert prep["resources"]["limits"]["nvidia.com/gpucores"] == "100"  # the webhook's
    assert (seen.phase, seen.reason) == ("Pending", "Unschedulable"), seen.message
    assert REASON in seen.message, seen.message
    assert [m for m in seen.events_named("FailedScheduling") if REASON in m], seen.events
    assert not seen.annotations.get("hami.io/vgpu-node")  # never reserved, never bound
    for container in seen.containers:
        assert (container.gpus, container.cpus, container.replicas) == ((), None, ())
    assert seen.refits == {}  # the plugin was never asked
    assert seen.allocations == 0
    assert seen.reserved_memory == dict.fromkeys(GPU_NUMA, 0.0)
