"""The emulated cluster `numafit bench` measures: nats-server, the Kubernetes API emulator (in
a process of its own, or in the bench's, where it counts the writes it serves) and numafit's
services, each in a process of its own as deployed; and the nodes and pods it is seeded with.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from shared.core import codec, keys
from shared.core.model import DeviceInfo
from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.service import processes
from shared.service.wiring import InProcess
from shared.testing.kube_emulator import KubeEmulator
from shared.testing.kube_emulator.faults import FaultRule, Faults
from shared.testing.nats_server import NatsServer

if TYPE_CHECKING:
    from nats.aio.client import Client

    from shared.service.kube_io import Kube

Progress = Callable[[str], None]


def gpus(node: str) -> list[DeviceInfo]:
    return [
        DeviceInfo(f"GPU-{node}-{i}", i, 10, 81920, 100, "NVIDIA H100", i // 4) for i in range(8)
    ]


def node_object(name: str) -> dict[str, Any]:
    register = codec.encode_register(gpus(name))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {keys.NODE_REGISTER: register}},
    }


def placed_pod(name: str, node: str, uuid: str | None, mem: int = 1000) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if uuid is not None:
        value = f"{uuid},NVIDIA,{mem},5:;"
        annotations = {
            keys.VGPU_NODE: node,
            keys.TO_ALLOCATE: value,
            keys.ALLOCATED: value,
            keys.BIND_PHASE: keys.PHASE_ALLOCATING,
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "annotations": annotations},
        "spec": {
            "nodeName": node if uuid is not None else None,
            # Routed to numafit as its webhook would (the extender schedules only its own pods).
            "schedulerName": DEFAULT_SCHEDULER_NAME,
            "containers": [
                {
                    "name": "app",
                    "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": mem}},
                }
            ],
        },
    }


def plain_pod(name: str) -> dict[str, Any]:
    """A pod without GPUs (what the bare PATCH floor writes to)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "annotations": {}},
        "spec": {"containers": [{"name": "app", "image": "x"}]},
    }


def summarize(samples: list[float], elapsed: float) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "requests": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(ordered[max(int(len(ordered) * 0.99) - 1, 0)] * 1e3, 3),
        "throughput_per_s": round(len(ordered) / elapsed, 1) if elapsed > 0 else 0.0,
    }


WRITES = frozenset({"POST", "PATCH", "PUT"})


class WriteCounter(Faults):
    """The emulator's fault rules (none here) that also count the write requests it serves
    (every request passes `take`, watches included; the emulator's own controls do not)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def take(self, method: str, path_qs: str, is_watch: bool = False) -> FaultRule | None:
        if method in WRITES:
            self.writes += 1
        return super().take(method, path_qs, is_watch)


class ControlPlane(NamedTuple):
    nats_url: str
    admin: Kube
    nc: Client
    scheduler_url: str
    """The scheduler extender's URL ("" when no scheduler runs)."""
    kubeconfig: Path
    """The API server's (the chain floor's patcher uses it)."""


@contextlib.asynccontextmanager
async def control_plane(
    objects: list[tuple[str, dict[str, Any]]],
    *,
    refit: bool,
    scheduler: bool,
    progress: Progress,
    counter: WriteCounter | None = None,
) -> AsyncIterator[ControlPlane]:
    """nats-server, the API emulator and the services, each in a process of its own as
    deployed; with a `counter`, the emulator runs in this process instead, which counts the
    writes it serves."""
    with NatsServer() as server, tempfile.TemporaryDirectory() as tmp:
        async with _api_server(Path(tmp), counter) as kubeconfig:
            wiring = InProcess(server.url, kubeconfig)
            started: list[processes.ServiceProcess] = []
            try:
                admin = await wiring.kube("bench")
                for number, (kind, obj) in enumerate(objects, 1):
                    if kind == "node":
                        await admin.create_node(obj)
                    else:
                        await admin.create_pod("bench", obj)
                    if number % 500 == 0:
                        progress(f"created {number}/{len(objects)} objects")
                names = ["accounting", *(["refit"] if refit else [])]
                listen = processes.free_port()
                for name in [*names, *(["scheduler"] if scheduler else [])]:
                    extra: tuple[str, ...] = ()
                    if name == "scheduler":
                        extra = ("--listen-host", "127.0.0.1", "--listen-port", str(listen))
                    started.append(
                        processes.start_service(
                            name,
                            nats_url=server.url,
                            kubeconfig=kubeconfig,
                            log=Path(tmp) / f"{name}.log",
                            extra_args=extra,
                        )
                    )
                    # Accounting first: the others read its ledger as they start.
                    await started[-1].wait_ready()
                url = f"http://127.0.0.1:{listen}" if scheduler else ""
                nc = (await wiring.nats("bench-client")).client
                yield ControlPlane(server.url, admin, nc, url, kubeconfig)
            finally:
                for service in reversed(started):
                    await service.stop()
                await wiring.close(1.0)


API_START_TIMEOUT = 30.0
"""Seconds the API emulator's process may take to listen (imports, then the socket)."""
API_START_POLL = 0.02
"""Seconds between two looks for the kubeconfig it writes once listening (its only signal)."""


@contextlib.asynccontextmanager
async def _api_server(tmp: Path, counter: WriteCounter | None) -> AsyncIterator[Path]:
    """The API emulator, yielding its kubeconfig: in a process of its own (as an API server
    is: a client's request then wakes another process, as in a cluster), or in this process
    when its writes are counted."""
    kubeconfig = tmp / "kubeconfig"
    if counter is not None:
        emulator = KubeEmulator()
        emulator.faults = counter  # before start: the app's middleware is bound then
        async with emulator:
            emulator.write_kubeconfig(str(kubeconfig))
            yield kubeconfig
        return
    with (tmp / "kube-emulator.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shared.testing.kube_emulator",
            "--port",
            "0",
            "--kubeconfig-out",
            str(kubeconfig),
            "--log-level",
            "warning",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
    try:
        async with asyncio.timeout(API_START_TIMEOUT):
            while not kubeconfig.exists():
                if process.returncode is not None:
                    raise RuntimeError(f"the API emulator exited with {process.returncode}")
                await asyncio.sleep(API_START_POLL)
        yield kubeconfig
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()
