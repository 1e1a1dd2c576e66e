"""An emulated kubelet for driving a real device plugin over gRPC without a node.

In-process (tests, ``numafit simulate``)::

    config = KubeletConfig(directory=Path("/tmp/kl"), cpus={0: 32, 1: 32},
                           topology_policy=TopologyPolicy.SINGLE_NUMA_NODE)
    async with KubeletEmulator(config) as kubelet:
        async with asyncio.timeout(5):
            await kubelet.wait_for_devices("nvidia.com/gpu", 20)
        admission = await kubelet.admit_container("uid-1", "main", gpu_count=1, exclusive_cpus=4)

A whole pod, as kubelet admits it (init containers first, their devices and exclusive CPUs
reused by the containers after them, kubelet's resource predicate last)::

    result = await kubelet.admit_pod(uid, container_asks(pod_object))
    if result.error is not None:
        status = rejected_status(pod_object, result.error)   # what kubelet writes

With ``KubeletEmulator(config, TopologyPublisher(sink, node, policy))`` it also publishes the
node's NodeResourceTopology after every admission and release, as NFD's topology-updater does.

As a program: :func:`main` (``numafit run kubelet-emulator``).
"""

from shared.testing.kubelet_emulator.cli import main
from shared.testing.kubelet_emulator.config import (
    DEFAULT_KUBELET_VERSION,
    DEVICE_PLUGIN_DIR,
    KubeletConfig,
    TopologyPolicy,
    parse_cpus,
)
from shared.testing.kubelet_emulator.emulator import (
    SUPPORTED_VERSIONS,
    Admission,
    ContainerAsk,
    KubeletEmulator,
    PodAdmission,
)
from shared.testing.kubelet_emulator.errors import (
    AdmissionError,
    OutOfResourceError,
    RegistrationError,
    TopologyAffinityError,
    UnexpectedAdmissionError,
)
from shared.testing.kubelet_emulator.ledger import ContainerKey, PluginDevice
from shared.testing.kubelet_emulator.placement import (
    DeviceAllocation,
    FreeDevice,
    Placement,
    PreferenceAsk,
    place,
)
from shared.testing.kubelet_emulator.pods import (
    REJECTED_PREFIX,
    container_asks,
    device_count,
    rejected_status,
)
from shared.testing.kubelet_emulator.resource_names import is_extended_resource_name
from shared.testing.kubelet_emulator.topology import TopologyPublisher, TopologySink

__all__ = [
    "DEFAULT_KUBELET_VERSION",
    "DEVICE_PLUGIN_DIR",
    "REJECTED_PREFIX",
    "SUPPORTED_VERSIONS",
    "Admission",
    "AdmissionError",
    "ContainerAsk",
    "ContainerKey",
    "DeviceAllocation",
    "FreeDevice",
    "KubeletConfig",
    "KubeletEmulator",
    "OutOfResourceError",
    "Placement",
    "PluginDevice",
    "PodAdmission",
    "PreferenceAsk",
    "RegistrationError",
    "TopologyAffinityError",
    "TopologyPolicy",
    "TopologyPublisher",
    "TopologySink",
    "UnexpectedAdmissionError",
    "container_asks",
    "device_count",
    "is_extended_resource_name",
    "main",
    "parse_cpus",
    "place",
    "rejected_status",
]
