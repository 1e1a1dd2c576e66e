"""GPU health: XID events from NVML (against the real `pynvml` module with its functions
monkeypatched, since there is no GPU here) and from the simulated backend, through the running
plugin to kubelet's device list (ListAndWatch) and the Node's register annotation (written by
accounting on the API emulator)."""

from __future__ import annotations

import asyncio
import logging
import signal
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from shared.core import keys
from shared.testing.kubelet_emulator import KubeletConfig, KubeletEmulator
from svc_deviceplugin.discovery import (
    DiscoveryError,
    HealthEvent,
    NvmlBackend,
    SimulatedBackend,
)
from tests.deviceplugin.stack import DEFAULT_GPUS, RESOURCE, Stack, bare_node, node_stack
from tests.integration.harness import harness, wait_for
from tests.integration.processes import free_port, spawn
from tests.metrics import sample
from tests.raw_kube import raw

if TYPE_CHECKING:
    import subprocess

pynvml = pytest.importorskip("pynvml")

XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError in NVML's nvml.h
XID_EVENTS = "numafit_deviceplugin_xid_events_total"


# --- NVML: the real module, its functions replaced --------------------------------------


class FakeDriver:
    """What the monkeypatched `pynvml` functions answer: GPUs by handle, scripted waits."""

    def __init__(self, uuids: list[str], *, unsupported: tuple[str, ...] = ()) -> None:
        self.handles = [SimpleNamespace(uuid=uuid) for uuid in uuids]
        self.unsupported = unsupported
        self.broken: dict[str, Exception] = {}
        """uuid -> what nvmlDeviceRegisterEvents raises for it."""
        self.unnamed: set[int] = set()
        """ids of handles nvmlDeviceGetUUID fails for."""
        self.waits: list[Any] = []
        """What each nvmlEventSetWait_v2 returns (event data) or raises (an exception)."""
        self.event_set = SimpleNamespace(name="event-set")
        self.calls: list[tuple[Any, ...]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # raising=True (the default): each name must exist in the installed nvidia-ml-py.
        for name in (
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetCount",
            "nvmlDeviceGetHandleByIndex",
            "nvmlDeviceGetUUID",
            "nvmlEventSetCreate",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait_v2",
            "nvmlEventSetFree",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlInit(self) -> None:
        self.calls.append(("init",))

    def nvmlShutdown(self) -> None:
        self.calls.append(("shutdown",))

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if id(handle) in self.unnamed:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return str(handle.uuid)

    def nvmlEventSetCreate(self) -> object:
        self.calls.append(("create",))
        return self.event_set

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: object) -> None:
        self.calls.append(("register", handle.uuid, event_types, event_set))
        if handle.uuid in self.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if handle.uuid in self.broken:
            raise self.broken[handle.uuid]

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self.calls.append(("wait", event_set, timeout_ms))
        outcome = self.waits.pop(0) if self.waits else pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.calls.append(("free", event_set))

    def xid(self, index: int, xid: int, event_type: int = XID_CRITICAL) -> SimpleNamespace:
        """Event data as nvmlEventSetWait_v2 returns it (c_nvmlEventData_t's fields)."""
        return SimpleNamespace(
            device=self.handles[index],
            eventType=event_type,
            eventData=xid,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )


def timeout() -> Exception:
    error: Exception = pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)  # NVMLError_Timeout
    return error


def test_the_real_constant_is_nvmls() -> None:
    assert pynvml.nvmlEventTypeXidCriticalError == XID_CRITICAL
    assert isinstance(timeout(), pynvml.NVMLError_Timeout)


def test_every_gpu_is_registered_for_xid_errors_and_unsupported_ones_stay_healthy(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    driver = FakeDriver(["GPU-0", "GPU-1", "GPU-2"], unsupported=("GPU-1",))
    driver.install(monkeypatch)
    with caplog.at_level(logging.INFO), NvmlBackend() as backend:
        watch = backend.watch_health()
        assert watch.wait(250) is None  # a Timeout is no event, and no error
        watch.close()
    assert [c for c in driver.calls if c[0] == "register"] == [
        ("register", "GPU-0", XID_CRITICAL, driver.event_set),
        ("register", "GPU-1", XID_CRITICAL, driver.event_set),
        ("register", "GPU-2", XID_CRITICAL, driver.event_set),
    ]
    assert ("wait", driver.event_set, 250) in driver.calls
    about_gpu1 = [r for r in caplog.records if getattr(r, "uuid", None) == "GPU-1"]
    assert len(about_gpu1) == 1 and "does not support XID events" in about_gpu1[0].getMessage()
    # The set is freed once, before NVML is shut down.
    assert driver.calls[-2:] == [("free", driver.event_set), ("shutdown",)]


def test_events_carry_the_device_and_the_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver(["GPU-0", "GPU-1", "GPU-2"])
    driver.install(monkeypatch)
    driver.waits = [
        timeout(),
        driver.xid(2, 79),
        driver.xid(0, 13),
        driver.xid(1, 48, event_type=0x1),  # not an XID critical error: not for us
    ]
    with NvmlBackend() as backend:
        watch = backend.watch_health()
        seen = [watch.wait(100) for _ in range(4)]
        watch.close()
    assert [(e.uuid, e.xid, e.critical) if e else None for e in seen] == [
        None,
        ("GPU-2", 79, True),
        ("GPU-0", 13, False),
        None,
    ]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_not_critical(xid: int) -> None:
    assert not HealthEvent("GPU-0", xid, "").critical


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119])
def test_other_xids_are_critical(xid: int) -> None:
    assert HealthEvent("GPU-0", xid, "").critical


def test_failures_concern_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver(["GPU-0", "GPU-1"])
    driver.broken["GPU-1"] = pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
    driver.install(monkeypatch)
    driver.waits = [driver.xid(0, 79), pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)]
    with NvmlBackend() as backend:
        watch = backend.watch_health()
        driver.unnamed.add(id(driver.handles[0]))  # from now on NVML cannot name GPU-0
        registration = watch.wait(10)  # GPU-1 could not be registered: it is unhealthy
        no_name = watch.wait(10)
        lost = watch.wait(10)
        watch.close()
        watch.close()
        with pytest.raises(DiscoveryError, match="closed"):
            watch.wait(10)
    assert registration is not None and (registration.uuid, registration.critical) == (
        "GPU-1",
        True,
    )
    assert no_name is not None and (no_name.uuid, no_name.xid, no_name.critical) == (
        None,
        79,
        True,
    )
    assert lost is not None and (lost.uuid, lost.xid, lost.critical) == (None, None, True)
    assert [c for c in driver.calls if c[0] == "free"] == [("free", driver.event_set)]


# --- the simulated backend ----------------------------------------------------------------


def test_injected_xids_come_out_in_order() -> None:
    backend = SimulatedBackend(DEFAULT_GPUS)
    watch = backend.watch_health()
    backend.inject_xid("GPU-a", 79)
    backend.inject_xid("GPU-b", 13)
    backend.inject_xid(None, 48)
    first, second, third = (watch.wait(1000) for _ in range(3))
    assert watch.wait(10) is None
    assert [(e.uuid, e.xid) for e in (first, second, third) if e] == [
        ("GPU-a", 79),
        ("GPU-b", 13),
        (None, 48),
    ]
    with pytest.raises(ValueError, match="no simulated GPU 'GPU-zz'"):
        backend.inject_xid("GPU-zz", 79)


def test_the_xid_file_is_read_line_by_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "xids"
    backend = SimulatedBackend(DEFAULT_GPUS, xid_file=path)
    watch = backend.watch_health()
    assert watch.wait(10) is None  # no file yet: no events, no error
    path.write_text("# comments and blank lines are skipped\n\nGPU-a 79\n* 48\nGPU-b 1")
    assert [(e.uuid, e.xid) for e in (watch.wait(1000), watch.wait(1000)) if e] == [
        ("GPU-a", 79),
        (None, 48),
    ]
    assert watch.wait(10) is None  # "GPU-b 1" is not a complete line yet
    with caplog.at_level(logging.WARNING), path.open("a") as handle:
        handle.write("3\nnot an event " + "z" * 5000 + "\n")
    event = watch.wait(1000)
    assert event is not None and (event.uuid, event.xid) == ("GPU-b", 13)
    assert watch.wait(10) is None
    (skipped,) = [r for r in caplog.records if "XID file line skipped" in r.getMessage()]
    assert len(str(getattr(skipped, "line", ""))) < 200
    path.write_text("GPU-b 79\n")  # truncated and rewritten: read from the start
    event = watch.wait(1000)
    assert event is not None and (event.uuid, event.xid) == ("GPU-b", 79)


# --- the running plugin ----------------------------------------------------------------------


async def register_annotation(stack: Stack) -> dict[str, bool]:
    """uuid -> health, as the Node's register annotation says."""
    assert stack.h.kube is not None
    response = await raw(stack.h.kube.core.read_node("node-1", _preload_content=False))
    annotations = orjson.loads(await response.read())["metadata"].get("annotations") or {}
    if keys.NODE_REGISTER not in annotations:
        return {}
    return {d["id"]: d["health"] for d in orjson.loads(annotations[keys.NODE_REGISTER])}


def health_of(stack: Stack) -> dict[str, set[bool]]:
    """GPU uuid -> the health values of its replicas in kubelet's device list."""
    seen: dict[str, set[bool]] = {}
    for device in stack.kubelet.devices(RESOURCE):
        seen.setdefault(device.id.rsplit("-", 1)[0], set()).add(device.healthy)
    return seen


def simulated(stack: Stack) -> SimulatedBackend:
    backend = stack.plugin.backend
    assert isinstance(backend, SimulatedBackend)
    return backend


async def test_a_critical_xid_withdraws_the_gpu_from_kubelet_and_the_scheduler(
    nats_url: str, tmp_path: Path
) -> None:
    async with node_stack(nats_url, tmp_path, []) as stack:
        async with asyncio.timeout(5):
            await stack.plugin.health_watched.wait()
        assert health_of(stack) == {"GPU-a": {True}, "GPU-b": {True}}
        assert await register_annotation(stack) == {"GPU-a": True, "GPU-b": True}

        simulated(stack).inject_xid("GPU-a", 79)

        async with asyncio.timeout(5):
            await stack.kubelet.wait_until(lambda: health_of(stack)["GPU-a"] == {False})
        assert health_of(stack) == {"GPU-a": {False}, "GPU-b": {True}}
        await wait_for(lambda: _equals(register_annotation(stack), {"GPU-a": False, "GPU-b": True}))
        registry = stack.plugin.metrics.registry
        assert sample(registry, "numafit_deviceplugin_unhealthy_gpus") == 1
        assert sample(registry, XID_EVENTS, action="marked_unhealthy") == 1
        # accounting's view (what the scheduler reads) has GPU-a unhealthy too.
        snapshot = await stack.h.client.snapshot("node-1")
        devices = {d["id"]: d["health"] for d in snapshot["nodes"][0]["devices"]}
        assert devices == {"GPU-a": False, "GPU-b": True}
        # kubelet no longer hands GPU-a out: under policy single-numa-node a container
        # pinned to NUMA 1 (GPU-a's) has no GPU left there.
        free_on_numa_1 = [d for d in stack.kubelet.devices(RESOURCE) if 1 in d.numa_nodes]
        assert free_on_numa_1 and not any(d.healthy for d in free_on_numa_1)


async def test_an_application_xid_changes_nothing(nats_url: str, tmp_path: Path) -> None:
    async with node_stack(nats_url, tmp_path, []) as stack:
        async with asyncio.timeout(5):
            await stack.plugin.health_watched.wait()
        sent = stack.plugin.servicer.version
        registrations = stack.kubelet.registration_count(RESOURCE)

        simulated(stack).inject_xid("GPU-b", 13)

        registry = stack.plugin.metrics.registry
        await wait_for(lambda: sample(registry, XID_EVENTS, action="ignored") == 1)
        assert health_of(stack) == {"GPU-a": {True}, "GPU-b": {True}}
        assert await register_annotation(stack) == {"GPU-a": True, "GPU-b": True}
        assert stack.plugin.servicer.version == sent  # no new ListAndWatch message
        assert stack.kubelet.registration_count(RESOURCE) == registrations
        assert sample(registry, "numafit_deviceplugin_unhealthy_gpus") == 0


async def test_an_xid_file_marks_the_gpu_of_a_running_plugin_process(
    nats_url: str, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="nf-"))
    topology = tmp_path / "gpus.yaml"
    topology.write_text(
        "gpus:\n"
        "  - {uuid: GPU-a, model: NVIDIA A100-SXM4-40GB, memory: 40000, numa: 1}\n"
        "  - {uuid: GPU-b, model: NVIDIA A100-SXM4-40GB, memory: 40000, numa: 0}\n"
    )
    xids = tmp_path / "xids"
    async with harness(nats_url, tmp_path, [("node", bare_node())]) as h:
        kubelet = KubeletEmulator(KubeletConfig(directory=directory, cpus={0: 8, 1: 8}))
        await kubelet.start()
        try:
            plugin = spawn(
                processes,
                "deviceplugin",
                "--node",
                "node-1",
                "--topology",
                str(topology),
                "--xid-file",
                str(xids),
                "--device-plugin-dir",
                str(directory),
                "--nats-url",
                nats_url,
                "--metrics-host",
                "127.0.0.1",
                "--metrics-port",
                str(free_port()),
                log=tmp_path / "plugin.log",
            )
            async with asyncio.timeout(30):
                await kubelet.wait_for_devices(RESOURCE, 20)

            async def register() -> dict[str, bool]:
                snapshot = await h.client.snapshot("node-1")
                return {d["id"]: d["health"] for d in snapshot["nodes"][0]["devices"] or []}

            await wait_for(lambda: _equals(register(), {"GPU-a": True, "GPU-b": True}), 10)
            with xids.open("a") as handle:
                handle.write("GPU-b 13\nGPU-a 79\n")

            def gpu_a_unhealthy() -> bool:
                replicas = [d for d in kubelet.devices(RESOURCE) if d.id.startswith("GPU-a-")]
                return bool(replicas) and not any(d.healthy for d in replicas)

            async with asyncio.timeout(10):
                await kubelet.wait_until(gpu_a_unhealthy)
            assert all(d.healthy for d in kubelet.devices(RESOURCE) if d.id.startswith("GPU-b-"))
            await wait_for(lambda: _equals(register(), {"GPU-a": False, "GPU-b": True}), 10)
            plugin.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(plugin.wait, 30) == 0
        finally:
            await kubelet.stop()
    log = (tmp_path / "plugin.log").read_text()
    assert "GPU unhealthy" in log and "application XID" in log


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)
