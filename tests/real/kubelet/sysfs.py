"""A fake `/sys/devices/system/node` with two NUMA nodes, for a machine that has one.

kubelet (through cAdvisor) learns the NUMA layout from this directory alone: which CPUs each
`nodeN` holds (its `cpuM` links), its memory (`meminfo`), distances and hugepage pools. The
tree written here is bind-mounted over the real one inside kubelet's own mount namespace, so
kubelet's CPU manager and Topology Manager see two NUMA nodes while nothing else on the
machine does. The memory is the real node's, halved, so the two fake nodes add up to the
machine.
"""

from __future__ import annotations

import re
from pathlib import Path

REAL_NODE = Path("/sys/devices/system/node/node0")
HUGEPAGE_POOLS = ("hugepages-2048kB", "hugepages-1048576kB")

CPUS_BY_NUMA: dict[int, tuple[int, ...]] = {0: (0,), 1: (1,)}
"""cpu0 on NUMA 0 and cpu1 on NUMA 1. kubelet reserves cpu0 (reservedSystemCPUs), so the one
exclusive CPU a Guaranteed container can get is cpu1, on NUMA 1."""


def _cpulist(cpus: tuple[int, ...]) -> str:
    return ",".join(str(cpu) for cpu in cpus)


def _cpumap(cpus: tuple[int, ...]) -> str:
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return f"{mask:08x}"


def _halved_meminfo(node: int, real: str) -> str:
    """The real node's meminfo with every kB figure halved, relabelled `Node <node>`."""
    lines = []
    for line in real.splitlines():
        match = re.match(r"Node \d+ (\S+):\s+(\d+)( kB)?$", line)
        if match is None:
            continue
        name, value, unit = match.groups()
        figure = int(value) // 2 if unit else int(value)
        lines.append(f"Node {node} {name + ':':<16}{figure:>8}{unit or ''}")
    return "\n".join(lines) + "\n"


def write_numa_tree(
    destination: Path, cpus_by_numa: dict[int, tuple[int, ...]] = CPUS_BY_NUMA
) -> Path:
    """The fake node tree in `destination` (created); returns it."""
    destination.mkdir(parents=True, exist_ok=True)
    real_meminfo = (REAL_NODE / "meminfo").read_text()
    count = len(cpus_by_numa)
    span = f"0-{count - 1}" if count > 1 else "0"
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (destination / name).write_text(f"{span}\n")
    for numa, cpus in sorted(cpus_by_numa.items()):
        node = destination / f"node{numa}"
        node.mkdir(exist_ok=True)
        for cpu in cpus:
            link = node / f"cpu{cpu}"
            if not link.is_symlink():
                # Relative, as in the real tree: resolved where the tree is mounted.
                link.symlink_to(f"../../cpu/cpu{cpu}")
        (node / "cpulist").write_text(f"{_cpulist(cpus)}\n")
        (node / "cpumap").write_text(f"{_cpumap(cpus)}\n")
        distances = " ".join("10" if other == numa else "20" for other in sorted(cpus_by_numa))
        (node / "distance").write_text(f"{distances}\n")
        (node / "meminfo").write_text(_halved_meminfo(numa, real_meminfo))
        for pool in HUGEPAGE_POOLS:
            directory = node / "hugepages" / pool
            directory.mkdir(parents=True, exist_ok=True)
            for counter in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                (directory / counter).write_text("0\n")
    return destination
