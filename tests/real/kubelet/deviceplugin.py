"""numafit's device plugin on the kubelet tier's node, run as the svc-deviceplugin chart
renders it (its DaemonSet's command line and its simulated-GPU ConfigMap), with only what a
machine differs by substituted: host paths (HAMi-core's files, the cache and state
directories, the topology file), the metrics port and the NATS URL.

The GPUs (`GPUS`) are eight simulated A100s, four per NUMA node. NUMA 0's have twice the
memory of NUMA 1's, which steers numafit's scheduler without touching it: `spread` ranks a GPU
by how full the pod would make it, so a share that fits both lands on the emptier-looking
NUMA 0 GPU, GPU-3 (ties end on the highest index), while kubelet pins the only exclusive CPU
(cpu1) to NUMA 1 and offers NUMA 1's GPUs: the reservation must be refitted there, to GPU-7
(../shared/k8s/README.md's observation `from [GPU-3] to [GPU-7]`). A share over 40960 MiB fits
NUMA 0 only.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.real import chart
from tests.real.controlplane import free_port
from tests.real.kubelet import host
from tests.real.waiting import poll

if TYPE_CHECKING:
    from shared.testing.realk8s.procs import Child, Processes

NUMAFIT_BIN = Path(sys.executable).parent
START_WITHIN = 60.0
REPLICAS = 10
"""Replica slots per GPU (HAMi's default split count, the chart's default): kubelet sees 80
`nvidia.com/gpu`."""

GPU_NUMA = {f"GPU-{i}": 0 if i < 4 else 1 for i in range(8)}
GPU_MEMORY = {uuid: 81920 if numa == 0 else 40960 for uuid, numa in GPU_NUMA.items()}
GPU_MODEL = {0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA A100-SXM4-40GB"}
GPUS: list[dict[str, Any]] = [
    {
        "uuid": uuid,
        "index": index,
        "model": GPU_MODEL[GPU_NUMA[uuid]],
        "memory": GPU_MEMORY[uuid],
        "numa": GPU_NUMA[uuid],
    }
    for index, uuid in enumerate(GPU_NUMA)
]

SUBSTITUTED = (
    "--metrics-port=",
    "--hami-core-dir=",
    "--cache-dir=",
    "--state-dir=",
    "--topology=",
)


def rendered() -> tuple[list[str], str]:
    """(the DaemonSet container's command and args, the topology ConfigMap's JSON)."""
    objects = chart.render("svc-deviceplugin", {"simulatedGpus": GPUS})
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    return [*container["command"], *container["args"]], configmap["data"]["topology.json"]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class DevicePlugin:
    """One plugin process at a time. Each start gets a fresh XID file: an XID marks a GPU
    unhealthy for the plugin's lifetime, and the lines of an old file would count again."""

    def __init__(self, directory: Path, processes: Processes, nats_url: str, node: str) -> None:
        self.directory = directory
        self.processes = processes
        self.nats_url = nats_url
        self.node = node
        self.starts = 0
        self.child: Child | None = None
        self.metrics_port = 0
        directory.mkdir(parents=True, exist_ok=True)
        self.argv, topology = rendered()
        self.topology_file = directory / "topology.json"
        self.topology_file.write_text(topology)
        # HAMi-core's library and preload list are mounted into every GPU container: the
        # host files must exist (empty ones: the workload is a static busybox).
        self.hami_core = directory / "vgpu"
        self.hami_core.mkdir(exist_ok=True)
        for name in ("libvgpu.so", "ld.so.preload"):
            (self.hami_core / name).touch()
        self.xid_file = directory / "xid-0"

    def command(self) -> list[str]:
        program, *args = self.argv
        assert program == "numafit", self.argv
        kept = [a for a in args if not a.startswith(SUBSTITUTED)]
        assert f"--device-plugin-dir={host.DEVICE_PLUGIN_DIR}" in kept, kept
        return [
            str(NUMAFIT_BIN / program),
            *kept,
            f"--metrics-port={self.metrics_port}",
            "--metrics-host=127.0.0.1",
            f"--hami-core-dir={self.hami_core}",
            f"--cache-dir={self.directory / 'cache'}",
            f"--state-dir={self.directory / 'state'}",
            f"--topology={self.topology_file}",
            f"--xid-file={self.xid_file}",
        ]

    def start(self) -> None:
        self.starts += 1
        self.xid_file = self.directory / f"xid-{self.starts}"
        self.metrics_port = free_port()
        environment = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        environment |= {"NODE_NAME": self.node, "NUMAFIT_NATS_URL": self.nats_url}
        child = self.processes.start(f"deviceplugin-{self.starts}", self.command(), env=environment)
        self.child = child

        def ready() -> bool:
            if not child.alive():
                raise RuntimeError(f"device plugin exited:\n{child.tail()}")
            return _ready(self.metrics_port)

        poll(ready, within=START_WITHIN, what="device plugin ready")

    def check_alive(self) -> None:
        """Fail at once, with its log, if the plugin process has exited."""
        if self.child is not None and not self.child.alive():
            raise AssertionError(f"device plugin exited:\n{self.child.tail()}")

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(grace=15.0)
            self.processes.children.remove(self.child)
            self.child = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return "" if self.child is None else self.child.tail(400)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text: str = response.read().decode()
            return text

    def sample(self, series: str) -> float:
        """One sample of the plugin's /metrics (0 when absent)."""
        for line in self.metrics().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def inject_xid(self, uuid: str, xid: int = 79) -> None:
        """An XID event on `uuid` (79: the GPU has fallen off the bus), as NVML reports one."""
        with self.xid_file.open("a") as handle:
            handle.write(f"{uuid} {xid}\n")
