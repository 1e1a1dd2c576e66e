"""Per-container GPU requests derived from Pod resources (reference d.1).

Limits are read first and requests are the fallback, per resource name. A malformed or
out-of-range value (the rules are in `inputs`) makes the container's request invalid
(RequestError) instead of under-allocating it or clamping it as HAMi does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.core import inputs
from shared.core.keys import NVIDIA, PERCENT_UNSET
from shared.core.quantity import parse_integer_quantity

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.core.config import CoreConfig
    from shared.core.pods import ContainerSpec, PodInfo


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """HAMi's `ContainerDeviceRequest` for one vendor."""

    nums: int
    type: str = NVIDIA
    memreq: int = 0
    """Absolute MiB (already multiplied by memoryFactor); 0 = use the percentage."""
    mem_percentage: int = PERCENT_UNSET
    """Percent of the card's memory; 101 means unset."""
    coresreq: int = 0

    def mem_on(self, totalmem: int) -> int:
        """Effective memory against a device of `totalmem` MiB."""
        if self.memreq > 0:
            return self.memreq
        if self.mem_percentage != PERCENT_UNSET:
            return totalmem * self.mem_percentage // 100
        return 0


def _lookup(container: ContainerSpec, name: str) -> Any:
    if name in container.limits:
        return container.limits[name]
    return container.requests.get(name)


def container_request(container: ContainerSpec, config: CoreConfig) -> ContainerRequest | None:
    """The NVIDIA request of one container, or None when it asks for no GPU. Each value is
    held to its rule in `inputs` (refused, never clamped)."""
    where = f"container {container.name!r}"
    count_what = f"{where}: {config.resource_count_name}"
    count_value = _lookup(container, config.resource_count_name)
    if count_value is None:
        return None
    nums = parse_integer_quantity(count_value, count_what)
    inputs.check_count(nums, count_value, count_what)
    if nums == 0:
        return None

    # The percentage is read first: whether a memory of 0 is refused depends on it.
    percentage = PERCENT_UNSET
    pct_what = f"{where}: {config.resource_memory_percentage_name}"
    pct_value = _lookup(container, config.resource_memory_percentage_name)
    if pct_value is not None:
        percentage = parse_integer_quantity(pct_value, pct_what)
        inputs.check_percentage(percentage, pct_value, pct_what)

    memreq = 0
    mem_what = f"{where}: {config.resource_memory_name}"
    mem_value = _lookup(container, config.resource_memory_name)
    if mem_value is not None:
        mem = parse_integer_quantity(mem_value, mem_what)
        memreq = mem * config.memory_factor
        inputs.check_memory(mem, memreq, mem_value, mem_what)
        if memreq == 0 and percentage == PERCENT_UNSET:
            raise inputs.zero_memory(mem_value, mem_what, config.resource_memory_percentage_name)

    if memreq == 0 and percentage == PERCENT_UNSET:
        if config.default_memory > 0:
            memreq = config.default_memory
        else:
            percentage = 100

    cores_value = _lookup(container, config.resource_core_name)
    if cores_value is None:
        coresreq = config.default_cores
    else:
        cores_what = f"{where}: {config.resource_core_name}"
        coresreq = parse_integer_quantity(cores_value, cores_what)
        inputs.check_cores(coresreq, cores_value, cores_what)
    return ContainerRequest(nums, NVIDIA, memreq, percentage, coresreq)


def pod_requests(pod: PodInfo, config: CoreConfig) -> list[ContainerRequest | None]:
    """Requests by container position (init containers first)."""
    return [container_request(c, config) for c in pod.containers]


def pod_asks_for_gpu(pod: PodInfo, config: CoreConfig) -> bool:
    """True when any container names a GPU resource in its limits or requests."""
    return any(
        asks_for_gpu(c.limits, config) or asks_for_gpu(c.requests, config) for c in pod.containers
    )


def asks_for_gpu(resources: Mapping[str, Any], config: CoreConfig) -> bool:
    """True when a resource map names any of the GPU resources."""
    names = (
        config.resource_count_name,
        config.resource_memory_name,
        config.resource_memory_percentage_name,
        config.resource_core_name,
    )
    return any(name in resources for name in names)
