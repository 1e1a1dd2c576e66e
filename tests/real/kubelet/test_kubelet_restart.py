"""A kubelet restart on the real kubelet: running pods keep running untouched (kubelet
re-admits them from its checkpoints without calling the device plugin), the plugin registers
again by itself, and the next pod is admitted through it as before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.real.kubelet import cases
from tests.real.kubelet.deviceplugin import GPU_NUMA
from tests.real.kubelet.kubelet import BEST_EFFORT
from tests.real.kubelet.observe import (
    ALLOCATED,
    REGISTRATIONS,
    allocations_ok,
    container_output,
    refit_results,
)
from tests.real.kubelet.tier import kubelet_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from typing import Any

    from tests.real.kubelet.node import RealNode

pytestmark = kubelet_tier()

RUNNING = cases.Case("survives-restart", BEST_EFFORT, (cases.MAIN,), "best-effort")
AFTER = cases.Case("after-restart", BEST_EFFORT, (cases.Box("main", exclusive_cpu=False),))


def containers(pod: dict[str, Any]) -> dict[str, tuple[str, str, int]]:
    """container -> (containerID, startedAt, restartCount): the same container process."""
    return {
        s["name"]: (s["containerID"], s["state"]["running"]["startedAt"], s["restartCount"])
        for s in pod["status"]["containerStatuses"]
    }


def test_kubelet_restart_leaves_running_pods_alone_and_the_plugin_registers_again(
    best_effort: RealNode,
) -> None:
    node = best_effort
    seen = node.run(RUNNING, keep=True)
    after = None
    try:
        (main,) = seen.containers
        assert (seen.phase, main.gpus, main.cpus) == ("Running", ("GPU-7",), "1"), seen.message
        before = node.api.pod(seen.namespace, RUNNING.name)
        output = container_output(seen.namespace, RUNNING.name, seen.uid, "main")
        registrations = node.plugin.sample(REGISTRATIONS)
        metrics = node.plugin.metrics()

        node.kubelet.restart()
        # kubelet empties its device-plugin directory when it starts: the plugin notices and
        # registers again, and kubelet advertises every replica once more.
        poll(
            lambda: node.plugin.sample(REGISTRATIONS) == registrations + 1,
            within=30,
            what="the device plugin registered again",
        )
        node.wait_node_ready()

        # A pod admitted after the restart runs through the plugin as before; once it runs,
        # kubelet has synced its pods (its admission needs them) and reconciled its CPUs.
        after = node.run(AFTER, keep=True, alone=False)
        (shared,) = after.containers
        assert (after.phase, shared.gpus) == ("Running", ("GPU-3",))
        # A Burstable container gets the shared pool: every CPU but the exclusive ones. cpu1
        # is still the running pod's: kubelet re-admitted it from its checkpoint.
        assert shared.cpus == "0"
        assert GPU_NUMA["GPU-3"] == 0

        current = node.api.pod(seen.namespace, RUNNING.name)
        assert current["status"]["phase"] == "Running"
        assert containers(current) == containers(before)
        assert container_output(seen.namespace, RUNNING.name, seen.uid, "main") == output
        assert current["metadata"]["annotations"][ALLOCATED] == "GPU-7,NVIDIA,20000,30:;"
        assert node.kubelet.cpu_assignments()[seen.uid] == {"main": "1"}
        # The plugin was asked for the new pod only: one GetPreferredAllocation, one Allocate.
        now = node.plugin.metrics()
        assert refit_results(now) - refit_results(metrics) == {"none/no_mismatch": 1}
        assert allocations_ok(now) - allocations_ok(metrics) == 1
        assert node.reserved_memory() == {
            **dict.fromkeys(GPU_NUMA, 0.0),
            "GPU-7": 20000.0,
            "GPU-3": 20000.0,
        }
    finally:
        if after is not None:
            node.delete(AFTER.namespace, AFTER.name, after.uid)
        node.delete(RUNNING.namespace, RUNNING.name, seen.uid)
