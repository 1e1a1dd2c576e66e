"""The device plugin's settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared import subjects
from shared.core.refit import MAX_TIMEOUT_MS

JOURNAL_FILE = "consume-journal.json"


@dataclass(frozen=True, slots=True)
class HamiCorePaths:
    """Where HAMi-core lives on the host and where containers see it (all configurable)."""

    library_host: str = "/usr/local/vgpu/libvgpu.so"
    library_container: str = "/usr/local/vgpu/libvgpu.so"
    preload_host: str = "/usr/local/vgpu/ld.so.preload"
    preload_container: str = "/etc/ld.so.preload"
    cache_host_dir: str = "/tmp/vgpu/containers"
    """Per-container shared-cache directories are created below this on the host."""
    cache_container_dir: str = "/tmp/vgpu"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    node: str
    directory: Path = Path("/var/lib/kubelet/device-plugins")
    """kubelet's device-plugin directory (holds kubelet.sock and the plugin's socket)."""
    socket_name: str = "numafit-gpu.sock"
    resource_name: str = "nvidia.com/gpu"
    replicas: int = 10
    """Replica slots advertised per GPU (HAMi's device split count)."""
    refit_enabled: bool = True
    refit_timeout_ms: int = 2000
    """The budget of one kubelet call (GetPreferredAllocation or Allocate), every hop
    included: asking accounting for the pending pod, the refit (its `timeoutMs` is what is
    left), recording a failed binding, consuming the entry. kubelet imposes no deadline on
    these calls and admits pods serially, so this bound is the node's only protection."""
    mig_mode: bool = False
    """Operating mode `mig`: no refits (HAMi refuses MIG on both sides)."""
    accounting_timeout: float = 2.0
    watch_interval: float = 1.0
    """How often kubelet.sock and the plugin's socket are checked for a kubelet restart."""
    health_wait_ms: int = 250
    """How long one wait for a GPU health event (NVML's nvmlEventSetWait_v2) may block its
    worker thread; it bounds how long stopping waits for the health watch."""
    hami_core: HamiCorePaths = HamiCorePaths()
    state_dir: Path | None = None
    """Where the consume journal lives (`svc_deviceplugin.journal`): consumptions kubelet was
    answered for while accounting did not acknowledge them, kept across plugin restarts. None
    keeps them in memory only (embedded plugins: `numafit simulate`, tests). Not kubelet's
    device-plugin directory: kubelet empties that when it starts."""

    def __post_init__(self) -> None:
        subjects.check_name(self.node, "node name")
        if not 0 < self.refit_timeout_ms <= MAX_TIMEOUT_MS:
            raise ValueError(f"refit timeout must be between 1 and {MAX_TIMEOUT_MS} ms")
        if self.replicas < 1:
            raise ValueError("replicas must be at least 1")

    @property
    def socket_path(self) -> Path:
        return self.directory / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.directory / "kubelet.sock"

    @property
    def journal_path(self) -> Path | None:
        return None if self.state_dir is None else self.state_dir / JOURNAL_FILE
