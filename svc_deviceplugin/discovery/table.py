"""A readable table of discovered GPUs, for ``numafit run deviceplugin --inventory``.

Operators run it on a node to check what the plugin would advertise before it
registers with kubelet, so the table shows exactly the fields the plugin uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from svc_deviceplugin.discovery.model import NO_NUMA, GpuInfo

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["inventory_lines"]

_HEADER = ("INDEX", "UUID", "MODEL", "MEMORY(MiB)", "NUMA", "MIG", "HEALTH", "CORES")


def inventory_lines(gpus: Sequence[GpuInfo]) -> list[str]:
    """The GPUs as aligned table lines (header first), plus a one-line summary."""
    if not gpus:
        return ["no GPUs discovered"]
    rows = [_HEADER, *(_row(gpu) for gpu in sorted(gpus, key=lambda g: g.index))]
    widths = [max(len(row[col]) for row in rows) for col in range(len(_HEADER))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append(_summary(gpus))
    return lines


def _row(gpu: GpuInfo) -> tuple[str, ...]:
    return (
        str(gpu.index),
        gpu.uuid,
        gpu.model,
        str(gpu.memory_mib),
        "-" if gpu.numa == NO_NUMA else str(gpu.numa),
        "enabled" if gpu.mig_enabled else "disabled",
        "healthy" if gpu.healthy else "unhealthy",
        str(gpu.cores),
    )


def _summary(gpus: Sequence[GpuInfo]) -> str:
    numa_nodes = sorted({gpu.numa for gpu in gpus if gpu.numa != NO_NUMA})
    unhealthy = sum(1 for gpu in gpus if not gpu.healthy)
    numa_text = ", ".join(str(node) for node in numa_nodes) if numa_nodes else "none"
    return (
        f"{len(gpus)} GPU(s), {unhealthy} unhealthy, "
        f"{sum(gpu.memory_mib for gpu in gpus)} MiB total, NUMA nodes: {numa_text}"
    )
