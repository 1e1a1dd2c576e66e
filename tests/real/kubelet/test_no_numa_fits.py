"""A pod no NUMA node can hold on the real kubelet: NUMA 1's four GPUs have reported an XID
(fallen off the bus), so the only exclusive CPU (cpu1, NUMA 1) and a healthy GPU never share
a NUMA node. What happens is the Topology Manager policy's to decide: `best-effort` admits the
pod across NUMA nodes, `single-numa-node` refuses it before the device plugin is asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.real.kubelet import cases
from tests.real.kubelet.deviceplugin import GPU_NUMA
from tests.real.kubelet.tier import kubelet_tier

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.real.kubelet.cases import Case
    from tests.real.kubelet.observe import PodSeen

pytestmark = kubelet_tier()

IDLE = dict.fromkeys(GPU_NUMA, 0.0)


@pytest.mark.usefixtures("best_effort")
def test_best_effort_policy_runs_it_across_numa_nodes_on_its_reservation(
    run: Callable[[Case], PodSeen],
) -> None:
    """kubelet offers every free replica when no NUMA node fits (its hint spans both): the
    reservation, GPU-3 on NUMA 0, is among them, so the plugin keeps it and no refit is
    needed; the CPU stays on NUMA 1. The ledger records what runs."""
    seen = run(cases.NO_NUMA_FITS_BEST_EFFORT_POLICY)
    (main,) = seen.containers
    assert (seen.phase, main.gpus, main.cpus) == ("Running", ("GPU-3",), "1"), seen.message
    assert main.allocated == (("GPU-3", 20000, 30),)
    assert main.ledger == main.allocated
    assert tuple(sorted({r.rsplit("-", 1)[0] for r in main.replicas})) == main.gpus
    assert seen.refits == {"best-effort/no_mismatch": 1}
    assert not [r for r in seen.event_reasons() if r.startswith(("NumaRefit", "Allocation"))]
    assert seen.reserved_memory == {**IDLE, "GPU-3": 20000.0}


@pytest.mark.usefixtures("single_numa_node")
def test_single_numa_node_refuses_it_before_asking_the_plugin(
    run: Callable[[Case], PodSeen],
) -> None:
    seen = run(cases.NO_NUMA_FITS_STRICT_POLICY)
    assert (seen.phase, seen.reason) == ("Failed", "TopologyAffinityError"), seen.message
    assert seen.message.startswith("Pod was rejected: "), seen.message
    assert "Resources cannot be allocated with Topology locality" in seen.message, seen.message
    (main,) = seen.containers
    assert (main.gpus, main.cpus, main.replicas) == ((), None, ())
    assert seen.refits == {}
    assert seen.allocations == 0
    assert seen.reserved_memory == IDLE  # accounting released the refused pod
