"""Helpers of the chaos tier: service processes that can be killed and restarted, a cluster
seeded through the real kubernetes-asyncio client, the ledger as accounting shows it (snapshot
over NATS, gauges on /metrics) and as the API's annotations say it must be (summed here, not by
the code under test), and NATS request-reply with a short reply subject on a connection that is
replaced when the server closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import orjson
from prometheus_client.parser import text_string_to_metric_families

from shared.core import keys
from shared.service.kube import api_client
from shared.service.kube_io import Kube
from tests.builders import container, pod
from tests.integration.harness import wait_for
from tests.integration.processes import NUMAFIT, free_port, get, ready

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from tests.raw_accounting import RawAccounting

# --- service processes -------------------------------------------------------------------------


@dataclass
class ServiceProcess:
    """`numafit run TARGET` with its own metrics port and log file; killable, restartable."""

    target: str
    args: list[str]
    log_dir: Path
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.target}.log"

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        command = [NUMAFIT, "run", self.target, *self.args]
        command += ["--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port)]
        with self.log.open("ab") as handle:  # the child keeps its own descriptor
            handle.write(f"--- start {self.starts}: {' '.join(command)}\n".encode())
            handle.flush()
            self.process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)

    async def wait_ready(self, within: float = 30.0) -> None:
        try:
            await wait_for(lambda: ready(self.metrics_port), within=within)
        except TimeoutError:
            raise AssertionError(f"{self.target} not ready in {within}s:\n{self.tail()}") from None

    def kill(self) -> None:
        """SIGKILL, as the OOM killer or a node failure would."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    async def exit_code(self, within: float) -> int | None:
        """The exit status once the process has ended, or None when it runs past `within`."""
        assert self.process is not None
        try:
            return await asyncio.to_thread(self.process.wait, within)
        except subprocess.TimeoutExpired:
            return None

    async def readyz(self) -> int:
        """/readyz's status; 0 when nothing answers."""
        try:
            status, _ = await get(f"http://127.0.0.1:{self.metrics_port}/readyz")
        except OSError:  # aiohttp's connection errors are OSErrors
            return 0
        return status

    async def metrics(self) -> str:
        status, text = await get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        assert status == 200, text
        return text

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def messages(self) -> list[str]:
        """The `msg` of every JSON log line the process wrote."""
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    found.append(str(json.loads(line).get("msg", "")))
        return found


def service(
    target: str, nats_url: str, kubeconfig: Path, log_dir: Path, *extra: str
) -> ServiceProcess:
    args = ["--nats-url", nats_url, "--kubeconfig", str(kubeconfig), "--log-format", "json"]
    args += ["--grace-seconds", "3", "--nats-connect-timeout", "10", *extra]
    if target == "accounting" and "--replica-id" not in extra:
        # Restarted after a kill under the same name, as a pod's container would be: it takes
        # its own leases back at once. The bucket is the test's own (tests share a broker).
        args += ["--replica-id", "accounting-0", "--lease-bucket", f"chaos-{log_dir.name[-40:]}"]
    return ServiceProcess(target, args, log_dir)


def scheduler(nats_url: str, kubeconfig: Path, log_dir: Path) -> tuple[ServiceProcess, int]:
    port = free_port()
    proc = service(
        "scheduler",
        nats_url,
        kubeconfig,
        log_dir,
        "--listen-host",
        "127.0.0.1",
        "--listen-port",
        str(port),
    )
    return proc, port


def stop_all(processes: Iterable[ServiceProcess]) -> None:
    for proc in processes:
        proc.stop()


# --- the cluster ---------------------------------------------------------------------------------


async def kube_for(kubeconfig: Path) -> Kube:
    """The real kubernetes-asyncio client on the emulator; close with `await kube.api.close()`."""
    return Kube(await api_client(str(kubeconfig)), "chaos-test")


async def create(kube: Kube, kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    body = dict(obj)
    if kind == "node":
        return await kube.create_node(body)
    meta = dict(body["metadata"])
    meta.pop("uid", None)
    meta.pop("resourceVersion", None)
    body["metadata"] = meta
    return await kube.create_pod(meta["namespace"], body)


def reserved_pod(
    name: str,
    uuid: str,
    mem: int,
    cores: int,
    *,
    namespace: str = "ml",
    node_name: str = "node-1",
    alignment: str | None = "best-effort",
) -> dict[str, Any]:
    """A one-container pod the scheduler placed on `uuid`, not yet allocated (its
    to-allocate entry is still there, so a refit can move it)."""
    entry = f"{uuid},NVIDIA,{mem},{cores}:;"
    annotations = {keys.NUMA_ALIGNMENT: alignment} if alignment else {}
    return pod(
        name,
        containers=[container("main", 1, mem, cores)],
        namespace=namespace,
        node_name=node_name,
        allocated=entry,
        annotations=annotations,
    )


def refit_body(created: Mapping[str, Any], allowed: list[str], **extra: Any) -> dict[str, Any]:
    """A refit request for container 0 of a pod as the API server returned it."""
    meta = created["metadata"]
    body: dict[str, Any] = {
        "podUID": meta["uid"],
        "podNamespace": meta["namespace"],
        "podName": meta["name"],
        "nodeName": created["spec"]["nodeName"],
        "containerIndex": 0,
        "containerName": created["spec"]["containers"][0]["name"],
        "deviceType": "NVIDIA",
        "allowedDeviceUUIDs": allowed,
        "mode": "best-effort",
        "timeoutMs": 2000,
    }
    body.update(extra)
    return body


async def list_pods(kube: Kube) -> list[dict[str, Any]]:
    pods, _ = await kube.list_pods()
    return pods


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


# --- what the ledger must be, from the annotations alone ---------------------------------------


@dataclass(frozen=True)
class DeviceUse:
    slots: int = 0
    mem: int = 0
    cores: int = 0


def entry_devices(allocated: str) -> list[list[tuple[str, int, int]]]:
    """HAMi's `vgpu-devices-allocated`, parsed here on purpose (not by the code under test):
    containers separated by `;`, devices by `:`, each `UUID,Type,MiB,cores`."""
    containers = []
    for piece in allocated.split(";"):
        devices = []
        for device in filter(None, piece.split(":")):
            uuid, _type, mem, cores = device.split(",")
            devices.append((uuid, int(mem), int(cores)))
        containers.append(devices)
    if containers and not containers[-1]:
        containers.pop()  # the trailing separator
    return containers


def expected_usage(pods: Iterable[Mapping[str, Any]], node: str) -> dict[str, DeviceUse]:
    """Per GPU of `node`: what the pods' allocated annotations add up to. Only for pods made
    of app containers (no init containers, so no phase peak), which is what these tests use."""
    usage: dict[str, DeviceUse] = {}
    for obj in pods:
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        spec = obj.get("spec") or {}
        assert not spec.get("initContainers"), "expected_usage sums app containers only"
        notes = annotations_of(obj)
        if notes.get(keys.VGPU_NODE, spec.get("nodeName")) != node or keys.ALLOCATED not in notes:
            continue
        for devices in entry_devices(notes[keys.ALLOCATED]):
            for uuid, mem, cores in devices:
                old = usage.get(uuid, DeviceUse())
                usage[uuid] = DeviceUse(old.slots + 1, old.mem + mem, old.cores + cores)
    return usage


def allocated_by_uid(pods: Iterable[Mapping[str, Any]], node: str) -> dict[str, str]:
    """uid -> allocated annotation of the live pods of `node` that carry one."""
    found = {}
    for obj in pods:
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        notes = annotations_of(obj)
        if keys.ALLOCATED in notes and notes.get(keys.VGPU_NODE) == node:
            found[obj["metadata"]["uid"]] = notes[keys.ALLOCATED]
    return found


def gauges(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of gauge `name` in a /metrics page, by its sorted labels."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                samples[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def usage_from_metrics(text: str, node: str) -> dict[str, DeviceUse]:
    """Accounting's own per-GPU usage of `node`, from its gauges."""
    parts = {
        "slots": gauges(text, "numafit_accounting_device_slots_reserved"),
        "mem": gauges(text, "numafit_accounting_device_memory_reserved_mib"),
        "cores": gauges(text, "numafit_accounting_device_cores_reserved"),
    }
    uuids = {
        dict(labels)["uuid"]
        for samples in parts.values()
        for labels in samples
        if dict(labels).get("node") == node
    }
    usage = {}
    for uuid in uuids:
        key = (("node", node), ("uuid", uuid))
        usage[uuid] = DeviceUse(
            int(parts["slots"].get(key, 0)),
            int(parts["mem"].get(key, 0)),
            int(parts["cores"].get(key, 0)),
        )
    return usage


def nonzero(usage: Mapping[str, DeviceUse]) -> dict[str, DeviceUse]:
    return {uuid: use for uuid, use in usage.items() if use != DeviceUse()}


async def ledger_allocated(client: RawAccounting, node: str) -> dict[str, str]:
    """uid -> allocated annotation of every pod accounting tracks on `node` (its snapshot)."""
    reply = await client.snapshot(node)
    found = {}
    for tracked in reply["nodes"][0]["pods"]:
        mini = tracked["pod"]["metadata"]
        found[mini["uid"]] = mini["annotations"].get(keys.ALLOCATED, "")
    return found


async def ledger_node_names(client: RawAccounting) -> list[str]:
    """Every node of accounting's cluster snapshot (`snapshot._all`, page by page)."""
    reply = await client.snapshot_all()
    return [n["node"] for n in reply["nodes"]]


# --- NATS ------------------------------------------------------------------------------------------

NO_RESPONDERS = "no responders"
NO_REPLY = "no reply"
REFUSED = "refused by the broker"


class Requester:
    """Request-reply over one short reply subject, so that a request subject of nearly 4 KiB
    still fits nats-server's 4096-byte control line; the connection is replaced whenever the
    server closed it (which it does to the *sender* of an over-long or malformed line)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.nc: Client | None = None
        self._future: asyncio.Future[Msg] | None = None
        self.reconnects = 0

    async def _connection(self) -> Client:
        if self.nc is not None and not self.nc.is_closed:
            return self.nc
        if self.nc is not None:
            self.reconnects += 1

        async def quiet(_: Exception) -> None:
            pass  # the server refusing this test client's line is expected here

        async def closed() -> None:
            if self._future is not None and not self._future.done():
                self._future.set_exception(nats.errors.ConnectionClosedError())

        self.nc = await nats.connect(
            self.url,
            allow_reconnect=False,
            error_cb=quiet,
            closed_cb=closed,
            name="chaos-requester",
        )
        await self.nc.subscribe("r", cb=self._on_reply)
        await self.nc.flush()
        return self.nc

    async def _on_reply(self, msg: Msg) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(msg)

    async def request(self, subject: str, payload: bytes, wait: float = 2.0) -> bytes | str:
        """The reply's body, or NO_RESPONDERS / NO_REPLY / REFUSED."""
        nc = await self._connection()
        self._future = asyncio.get_running_loop().create_future()
        try:
            await nc.publish(subject, payload, reply="r")
            await nc.flush(timeout=max(1, int(wait)))
        except (nats.errors.Error, TimeoutError, OSError):
            return REFUSED
        try:
            msg = await asyncio.wait_for(self._future, wait)
        except nats.errors.ConnectionClosedError:
            return REFUSED
        except TimeoutError:
            return REFUSED if nc.is_closed else NO_REPLY
        if msg.headers and msg.headers.get("Status") == "503":
            return NO_RESPONDERS
        return msg.data

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.close()


def control_line_bytes(subject: str, payload: bytes) -> int:
    """Length of the PUB line nats-server checks against its max_control_line (4096)."""
    return len(f"PUB {subject} r {len(payload)}\r\n".encode())


def decodes_to_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


# --- figures ---------------------------------------------------------------------------------------


@dataclass
class Stopwatch:
    started: float = field(default_factory=time.perf_counter)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


def tally(codes: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(codes).items()))
