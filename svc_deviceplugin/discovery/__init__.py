"""GPU discovery for the device plugin: real NVML or a simulated topology, one interface.

The plugin depends on :class:`GpuBackend` only; :class:`NvmlBackend` runs on GPU
nodes, :class:`SimulatedBackend` in tests and ``numafit simulate``.
"""

from svc_deviceplugin.discovery.errors import DiscoveryError, TopologyError
from svc_deviceplugin.discovery.model import (
    APPLICATION_XIDS,
    NO_NUMA,
    GpuBackend,
    GpuInfo,
    HealthEvent,
    HealthWatch,
)
from svc_deviceplugin.discovery.nvml import NvmlApi, NvmlBackend, NvmlHealthWatch, pci_sysfs_name
from svc_deviceplugin.discovery.simulated import (
    SimulatedBackend,
    SimulatedHealthWatch,
    parse_gpus,
    parse_topology,
)
from svc_deviceplugin.discovery.table import inventory_lines

__all__ = [
    "APPLICATION_XIDS",
    "NO_NUMA",
    "DiscoveryError",
    "GpuBackend",
    "GpuInfo",
    "HealthEvent",
    "HealthWatch",
    "NvmlApi",
    "NvmlBackend",
    "NvmlHealthWatch",
    "SimulatedBackend",
    "SimulatedHealthWatch",
    "TopologyError",
    "inventory_lines",
    "parse_gpus",
    "parse_topology",
    "pci_sysfs_name",
]
