"""Scheduler configuration that changes fit results (HAMi's flags and NVIDIA device config).

Keys are camelCase as in a `numafit plan` case's `config` object. Unknown keys and wrong types
are refused so that a typo never silently falls back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from shared.core.errors import ConfigError, shown
from shared.core.policy import check_gpu_policy

NODE_POLICIES = ("binpack", "spread")
"""The node policies (HAMi `--node-scheduler-policy`)."""
MAX_DEFAULT_CORES = 100
"""`defaultCores` stands in for a pod's `nvidia.com/gpucores`, a percent of one GPU."""


def check_node_policy(text: str) -> str | None:
    """Why `text` is not a node policy (None when it is): `binpack` or `spread`, case and
    surrounding spaces ignored. The configured default and the pod annotation keep the same
    rule (HAMi reads anything but spread as binpack, which hides a typo)."""
    if text.strip().lower() in NODE_POLICIES:
        return None
    return f"{shown(text)} is not a node policy: use {' or '.join(NODE_POLICIES)}"


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Everything the core's rules depend on besides the objects themselves."""

    gpu_scheduler_policy: str = "spread"
    """Default GPU ordering policy (HAMi `--gpu-scheduler-policy`)."""
    node_scheduler_policy: str = "binpack"
    """Default node ordering policy (HAMi `--node-scheduler-policy`)."""
    resource_count_name: str = "nvidia.com/gpu"
    resource_memory_name: str = "nvidia.com/gpumem"
    resource_memory_percentage_name: str = "nvidia.com/gpumem-percentage"
    resource_core_name: str = "nvidia.com/gpucores"
    default_memory: int = 0
    """MiB given to a container that names neither memory nor a percentage (0 = whole card)."""
    default_cores: int = 0
    """Core percent given to a container that names no cores."""
    default_gpu_num: int = 1
    """GPU count the admission webhook injects when only memory/cores are requested."""
    memory_factor: int = 1
    """Multiplier applied to requested memory (and to memory quota limits when > 1)."""


_CAMEL = {
    "gpuSchedulerPolicy": "gpu_scheduler_policy",
    "nodeSchedulerPolicy": "node_scheduler_policy",
    "resourceCountName": "resource_count_name",
    "resourceMemoryName": "resource_memory_name",
    "resourceMemoryPercentageName": "resource_memory_percentage_name",
    "resourceCoreName": "resource_core_name",
    "defaultMemory": "default_memory",
    "defaultCores": "default_cores",
    "defaultGPUNum": "default_gpu_num",
    "memoryFactor": "memory_factor",
}


def parse_config(raw: Mapping[str, Any] | None) -> CoreConfig:
    """Build a CoreConfig from camelCase keys; raise ConfigError naming the bad key."""
    if raw is None:
        return CoreConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError("config must be an object")
    types = {f.name: f.type for f in fields(CoreConfig)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = _CAMEL.get(key)
        if name is None:
            known = ", ".join(sorted(_CAMEL))
            raise ConfigError(f"unknown config key {key!r} (known: {known})")
        if types[name] in ("int", int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config {key!r} must be a non-negative integer")
        elif not isinstance(value, str) or not value.strip():
            raise ConfigError(f"config {key!r} must be a non-empty string")
        values[name] = value
    config = CoreConfig(**values)
    if config.memory_factor < 1:
        raise ConfigError("config 'memoryFactor' must be at least 1")
    if (why := check_gpu_policy(config.gpu_scheduler_policy)) is not None:
        raise ConfigError(f"config 'gpuSchedulerPolicy': {why}")
    if (why := check_node_policy(config.node_scheduler_policy)) is not None:
        raise ConfigError(f"config 'nodeSchedulerPolicy': {why}")
    if config.default_cores > MAX_DEFAULT_CORES:
        raise ConfigError(f"config 'defaultCores' must be at most {MAX_DEFAULT_CORES}")
    return config
