"""`numafit run deviceplugin`'s settings, declared once (`shared.service.declare`).

Most defaults are PluginConfig's and HamiCorePaths' own (read from them, not repeated); the
flags that do not map one to one (--no-refit, --operating-mode, --hami-core-dir) are turned
into a PluginConfig by `plugin_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from shared.core.refit import MAX_TIMEOUT_MS
from shared.service.declare import default_of, setting, switch
from shared.service.values import optional_text, whole
from svc_deviceplugin.config import HamiCorePaths, PluginConfig

if TYPE_CHECKING:
    from svc_deviceplugin.discovery import GpuBackend

METRICS_PORT = 9104
RECONCILE_INTERVAL = 30.0
"""Seconds between two checks of which pods accounting still tracks (not a flag)."""
OPERATING_MODES = ("hami-core", "mig")
_HAMI_CORE = HamiCorePaths()


@dataclass(frozen=True, slots=True)
class DevicePluginSettings:
    """The flags of `numafit run deviceplugin`."""

    node: str = setting(
        "",
        "this node's name (the downward API's spec.nodeName); required to serve",
        aliases=("NODE_NAME",),
        shown_default="none (required)",
    )
    device_plugin_dir: str = setting(
        str(default_of(PluginConfig, "directory")), "kubelet's device-plugin directory"
    )
    socket_name: str = setting(
        default_of(PluginConfig, "socket_name"), "the plugin's socket file in that directory"
    )
    resource_name: str = setting(
        default_of(PluginConfig, "resource_name"), "the extended resource advertised"
    )
    replicas: int = setting(
        default_of(PluginConfig, "replicas"), "replica slots per GPU", parse=whole(1)
    )
    topology: str | None = setting(
        None,
        "simulated GPUs from a YAML/JSON topology file instead of NVML (tests, demos)",
        parse=optional_text,
        shown_default="none (NVML)",
        metavar="PATH",
    )
    xid_file: str | None = setting(
        None,
        "with --topology: inject GPU health events; every line appended to this file, "
        "`<uuid> <xid>` ('*' for every GPU), is one XID event",
        parse=optional_text,
        metavar="PATH",
    )
    refit_timeout_ms: int = setting(
        default_of(PluginConfig, "refit_timeout_ms"),
        "budget of each kubelet call (GetPreferredAllocation, Allocate), every hop included; "
        "a refit gets what is left of it",
        parse=whole(1, MAX_TIMEOUT_MS),
        unit="ms",
    )
    no_refit: bool = switch("never ask for NUMA refits")
    operating_mode: str = setting(
        "hami-core", "mig: register GPUs in MIG mode; no refits", choices=OPERATING_MODES
    )
    hami_core_dir: str = setting(
        str(PurePosixPath(_HAMI_CORE.library_host).parent),
        "host directory holding libvgpu.so and ld.so.preload",
    )
    cache_dir: str = setting(
        _HAMI_CORE.cache_host_dir, "host directory for per-container shared caches"
    )
    state_dir: str = setting(
        "/var/lib/numafit/deviceplugin",
        "host directory for the consume journal: allocations kubelet was answered for while "
        "accounting did not acknowledge them, sent again until it does, across plugin "
        "restarts (mount it from the host; not the device-plugin directory, which kubelet "
        "empties when it starts; '' keeps them in memory only)",
    )


def plugin_config(flags: DevicePluginSettings) -> PluginConfig:
    """The plugin's configuration from its flags (ValueError: a bad node name)."""
    return PluginConfig(
        node=flags.node,
        directory=Path(flags.device_plugin_dir),
        socket_name=flags.socket_name,
        resource_name=flags.resource_name,
        replicas=flags.replicas,
        refit_enabled=not flags.no_refit,
        refit_timeout_ms=flags.refit_timeout_ms,
        mig_mode=flags.operating_mode == "mig",
        state_dir=Path(flags.state_dir) if flags.state_dir else None,
        hami_core=HamiCorePaths(
            library_host=f"{flags.hami_core_dir}/libvgpu.so",
            preload_host=f"{flags.hami_core_dir}/ld.so.preload",
            cache_host_dir=flags.cache_dir,
        ),
    )


@dataclass(frozen=True, slots=True)
class PluginOptions:
    """Everything the device plugin is configured with, received whole."""

    config: PluginConfig
    backend: GpuBackend
    """NVML, or simulated GPUs (`--topology`)."""
    reconcile_interval: float = RECONCILE_INTERVAL
    """Seconds between two checks of which pods accounting still tracks."""
