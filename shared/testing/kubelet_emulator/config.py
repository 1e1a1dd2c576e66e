"""Settings of one emulated kubelet: its node, socket directory and managers' policies.

Kept as a frozen value so the CLI, ``numafit simulate`` and tests build the same
thing and the emulator never reads flags or globals.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

# One definition of the policies for the emulator and the scheduler's prediction.
from shared.core.numa_prediction import TopologyPolicy

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_KUBELET_VERSION",
    "DEVICE_PLUGIN_DIR",
    "KubeletConfig",
    "TopologyPolicy",
    "parse_cpus",
]

MAX_SOCKET_PATH = 107
"""Longest unix socket path (``sun_path`` is 108 bytes with its terminating NUL)."""

DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""Where a real kubelet keeps ``kubelet.sock`` and the plugins' sockets."""

DEFAULT_KUBELET_VERSION = "v1.31.0"
"""The version the emulator plays unless told otherwise. Its device manager, CPU manager and
Topology Manager follow kubelet v1.28.7 as observed (unchanged in these respects up to v1.31);
the version only decides whether init containers asking for extended resources no plugin
advertises are rejected (before v1.31: shared/core/kubelet_version.py)."""


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    """One emulated kubelet."""

    directory: Path
    """Device plugin directory: holds ``kubelet.sock``; plugin endpoints are relative to it."""
    node_name: str = "node-1"
    """Node name, used in logs."""
    topology_policy: TopologyPolicy = TopologyPolicy.NONE
    """Topology Manager policy (kubelet's default is ``none``)."""
    cpus: Mapping[int, int] = field(default_factory=dict)
    """Allocatable exclusive CPUs per NUMA node (static CPU manager)."""
    dial_timeout: float = 10.0
    """Seconds to wait for a registering plugin's socket to accept (kubelet: 10 s)."""
    rpc_timeout: float | None = None
    """Seconds allowed for GetPreferredAllocation and Allocate; kubelet sets none."""
    version: str = DEFAULT_KUBELET_VERSION
    """The kubelet version played (`status.nodeInfo.kubeletVersion`)."""
    seed: int = 0
    """Seeds the order kubelet's Go sets come in: the replica IDs offered to
    GetPreferredAllocation, and kubelet's own pick where the plugin prefers nothing."""

    def __post_init__(self) -> None:
        for numa, count in self.cpus.items():
            if numa < 0 or count < 0:
                raise ValueError(f"cpus: NUMA node and CPU count must be >= 0, got {numa}={count}")
        object.__setattr__(self, "directory", Path(self.directory).absolute())
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{self.socket_path} is longer than a unix socket path may be "
                f"({MAX_SOCKET_PATH} bytes); use a shorter directory"
            )
        object.__setattr__(self, "cpus", MappingProxyType(dict(sorted(self.cpus.items()))))
        object.__setattr__(self, "topology_policy", TopologyPolicy(self.topology_policy))

    @property
    def socket_path(self) -> Path:
        """kubelet's registration socket."""
        return self.directory / "kubelet.sock"


def parse_cpus(text: str) -> dict[int, int]:
    """``'0=32,1=32'`` as ``{0: 32, 1: 32}``; an empty string means no exclusive CPUs."""
    cpus: dict[int, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        numa_text, sep, count_text = part.partition("=")
        try:
            numa, count = int(numa_text), int(count_text)
        except ValueError:
            numa = count = -1
        if not sep or numa < 0 or count < 0:
            raise ValueError(f"expected NUMA=COUNT with non-negative integers, got {part!r}")
        if numa in cpus:
            raise ValueError(f"NUMA node {numa} given twice")
        cpus[numa] = count
    return cpus
