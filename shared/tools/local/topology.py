"""The simulated nodes of `numafit up`: built from flags, or taken from a scenario file.

From flags, every node is alike: `gpus` GPUs of one model spread evenly over the NUMA nodes
named in `cpus` (the lower half on the lower NUMA node), named `gpu-node-<n>` with GPUs
`GPU-<n>-<i>`; the first `topology_nodes` of them publish NodeResourceTopology (as NFD's
topology-updater would), so the scheduler predicts kubelet's NUMA choice there. A scenario
file (`numafit simulate`'s format) gives each node its own GPUs, CPUs, Topology Manager policy
and NodeResourceTopology setting, the scheduler configuration, and pods to create once the stack
is up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.testing.kubelet_emulator import TopologyPolicy
from shared.tools.simulate.scenario import NodeSpec, Scenario
from svc_deviceplugin.discovery import GpuInfo

if TYPE_CHECKING:
    from shared.core.config import CoreConfig

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_MEMORY_MIB = 81920
DEFAULT_CPUS = {0: 32, 1: 32}
MAX_NODES = 64
MAX_GPUS = 64


class TopologyError(ValueError):
    """The flags describe no usable node (the message names the flag)."""


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What `--nodes`, `--gpus`, `--cpus`, `--gpu-model`, `--gpu-memory` and
    `--topology-policy` say."""

    nodes: int = 1
    gpus: int = 8
    cpus: dict[int, int] = field(default_factory=lambda: dict(DEFAULT_CPUS))
    policy: TopologyPolicy = TopologyPolicy.SINGLE_NUMA_NODE
    model: str = DEFAULT_MODEL
    memory_mib: int = DEFAULT_MEMORY_MIB
    topology_nodes: int = 0
    """The first this many nodes publish NodeResourceTopology."""

    def check(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise TopologyError(f"--nodes must be between 1 and {MAX_NODES}, got {self.nodes}")
        if not 0 <= self.topology_nodes <= self.nodes:
            raise TopologyError(
                f"--nrt-nodes must be between 0 and --nodes ({self.nodes}), "
                f"got {self.topology_nodes}"
            )
        if not 1 <= self.gpus <= MAX_GPUS:
            raise TopologyError(f"--gpus must be between 1 and {MAX_GPUS}, got {self.gpus}")
        if self.memory_mib < 1:
            raise TopologyError(f"--gpu-memory must be a positive MiB count, got {self.memory_mib}")
        if not self.model.strip():
            raise TopologyError("--gpu-model must not be empty")
        if not self.cpus:
            raise TopologyError("--cpus must name at least one NUMA node, e.g. 0=32,1=32")


def node_name(number: int) -> str:
    return f"gpu-node-{number}"


def gpus_of(number: int, shape: NodeShape) -> list[GpuInfo]:
    """Node `number`'s GPUs: spread evenly over the NUMA nodes `cpus` names, in order."""
    numa_nodes = sorted(shape.cpus)
    return [
        GpuInfo(
            uuid=f"GPU-{number}-{index}",
            index=index,
            model=shape.model,
            memory_mib=shape.memory_mib,
            numa=numa_nodes[index * len(numa_nodes) // shape.gpus],
            mig_enabled=False,
            healthy=True,
        )
        for index in range(shape.gpus)
    ]


def scenario_from_shape(shape: NodeShape, config: CoreConfig) -> Scenario:
    """Nodes alike, no pods: what `numafit up` runs without `--scenario`."""
    shape.check()
    nodes = [
        NodeSpec(
            node_name(n),
            shape.policy,
            dict(shape.cpus),
            gpus_of(n, shape),
            node_resource_topology=n <= shape.topology_nodes,
        )
        for n in range(1, shape.nodes + 1)
    ]
    return Scenario(nodes, config, [])


def describe(scenario: Scenario) -> str:
    """One line for the banner: `1 node (gpu-node-1: 8 GPUs on NUMA 0,1, single-numa-node)`."""
    parts = []
    for node in scenario.nodes:
        numa = ",".join(str(n) for n in sorted({g.numa for g in node.gpus}))
        nrt = ", NodeResourceTopology" if node.node_resource_topology else ""
        parts.append(
            f"{node.name}: {len(node.gpus)} GPUs on NUMA {numa}, {node.topology_policy.value}{nrt}"
        )
    count = len(scenario.nodes)
    shown = "; ".join(parts[:3]) + ("; ..." if count > 3 else "")
    return f"{count} node{'s' if count != 1 else ''} ({shown})"
