"""GPU discovery: simulated topologies (YAML, JSON, validation) and NVML against a fake module."""

from __future__ import annotations

import ctypes.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from svc_deviceplugin.discovery import (
    NO_NUMA,
    DiscoveryError,
    GpuInfo,
    NvmlBackend,
    SimulatedBackend,
    TopologyError,
    inventory_lines,
    pci_sysfs_name,
)

TOPOLOGY_YAML = """\
gpus:
  - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 0}
  - {uuid: GPU-b, model: NVIDIA H100, memory: 81920, numa: 1, index: 3, healthy: false}
  - {uuid: GPU-c, model: NVIDIA A100, memory: 40960, numa: -1, mig: true, cores: 50}
"""


def test_simulated_backend_reads_yaml_mapping(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(TOPOLOGY_YAML)

    gpus = SimulatedBackend.from_file(path).list_gpus()

    assert gpus == [
        GpuInfo("GPU-a", 0, "NVIDIA H100", 81920, 0, mig_enabled=False, healthy=True),
        GpuInfo("GPU-c", 2, "NVIDIA A100", 40960, NO_NUMA, True, True, cores=50),
        GpuInfo("GPU-b", 3, "NVIDIA H100", 81920, 1, mig_enabled=False, healthy=False),
    ]


def test_simulated_backend_reads_json_list(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(json.dumps([{"uuid": "GPU-x", "model": "L4", "memory": 23034, "numa": 1}]))

    backend = SimulatedBackend.from_file(path)
    backend.close()

    assert backend.list_gpus() == [GpuInfo("GPU-x", 0, "L4", 23034, 1, False, True, 100)]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("gpus: 3", "node.yaml: gpus: must be a list of GPUs, got int 3"),
        ("{gpus: [], nodes: []}", "node.yaml: unknown key(s) nodes; expected only 'gpus'"),
        ("[oops]", "node.yaml[0]: must be a mapping, got string 'oops'"),
        (
            "[{uuid: GPU-a, model: m, memory: 1, numa: 0, colour: red}]",
            "node.yaml[0] (GPU-a): unknown key(s) colour; allowed: uuid, model, memory, numa,",
        ),
        ("[{uuid: GPU-a, model: m, numa: 0}]", "node.yaml[0] (GPU-a): missing key(s) memory"),
        (
            "[{uuid: GPU-a, model: m, memory: 80G, numa: 0}]",
            "node.yaml[0] (GPU-a): key 'memory' must be an integer, got string '80G'",
        ),
        (
            "[{uuid: GPU-a, model: m, memory: 1, numa: -2}]",
            "node.yaml[0] (GPU-a): key 'numa' must be >= -1, got -2",
        ),
        (
            "[{uuid: GPU-a, model: m, memory: 1, numa: 0, cores: 101}]",
            "node.yaml[0] (GPU-a): key 'cores' must be between 1 and 100, got 101",
        ),
        (
            "[{uuid: GPU-a, model: m, memory: 1, numa: 0, mig: 'yes'}]",
            "node.yaml[0] (GPU-a): key 'mig' must be true or false, got string 'yes'",
        ),
        (
            "[{uuid: '', model: m, memory: 1, numa: 0}]",
            "node.yaml[0]: key 'uuid' must be a non-empty string, got string ''",
        ),
        (
            "[{uuid: GPU-a, model: m, memory: 1, numa: 0}, "
            "{uuid: GPU-a, model: m, memory: 1, numa: 0}]",
            "node.yaml[1] (GPU-a): duplicate uuid",
        ),
        (
            "[{uuid: GPU-a, model: m, memory: 1, numa: 0}, {uuid: GPU-b, model: m, memory: 1, "
            "numa: 0, index: 0}]",
            "node.yaml[1] (GPU-b): duplicate index 0",
        ),
        ("gpus: [\n  - {", "node.yaml: invalid YAML:"),
    ],
)
def test_simulated_topology_errors_name_item_and_key(document: str, message: str) -> None:
    with pytest.raises(TopologyError) as caught:
        SimulatedBackend.from_text(document, source="node.yaml")

    assert str(caught.value).startswith(message)


def test_simulated_topology_reports_invalid_json_and_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "node.json"
    broken.write_text("{gpus: []}")

    with pytest.raises(TopologyError, match=r"node\.json: invalid JSON"):
        SimulatedBackend.from_file(broken)
    with pytest.raises(TopologyError, match="cannot read topology"):
        SimulatedBackend.from_file(tmp_path / "absent.yaml")


def test_inventory_lines_show_a_table_and_summary() -> None:
    gpus = SimulatedBackend.from_text(TOPOLOGY_YAML).list_gpus()

    assert inventory_lines(gpus) == [
        "INDEX  UUID   MODEL        MEMORY(MiB)  NUMA  MIG       HEALTH     CORES",
        "0      GPU-a  NVIDIA H100  81920        0     disabled  healthy    100",
        "2      GPU-c  NVIDIA A100  40960        -     enabled   healthy    50",
        "3      GPU-b  NVIDIA H100  81920        1     disabled  unhealthy  100",
        "3 GPU(s), 1 unhealthy, 204800 MiB total, NUMA nodes: 0, 1",
    ]
    assert inventory_lines([]) == ["no GPUs discovered"]


# ---------------------------------------------------------------- NVML against a fake module


class FakeNvmlError(Exception):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


class FakeFunctionNotFound(FakeNvmlError):
    pass


class FakeLibraryNotFound(FakeNvmlError):
    pass


class FakeTimeout(FakeNvmlError):
    pass


@dataclass
class FakeGpu:
    uuid: str
    name: str
    memory_bytes: int
    bus_id: str | bytes
    numa: int | None = None  # None: nvmlDeviceGetNumaNodeId raises NotSupported
    mig: list[int] | None = None  # None: nvmlDeviceGetMigMode raises NotSupported


@dataclass
class FakeMemory:
    total: int


@dataclass
class FakePci:
    busId: str | bytes


@dataclass
class FakeNvml:
    """Stands in for the ``pynvml`` module: same function and exception names."""

    gpus: list[FakeGpu] = field(default_factory=list)
    init_error: Exception | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = FakeNvmlError
    NVMLError_NotSupported = FakeNotSupported
    NVMLError_FunctionNotFound = FakeFunctionNotFound
    NVMLError_Timeout = FakeTimeout
    nvmlEventTypeXidCriticalError = 0x8

    # XID events are not faked here (tests/deviceplugin/test_health.py covers them).
    def nvmlEventSetCreate(self) -> object:
        raise FakeNotSupported("Not Supported")

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: object) -> None:
        raise FakeNotSupported("Not Supported")

    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> NoReturn:
        raise FakeNotSupported("Not Supported")

    def nvmlEventSetFree(self, eventSet: object) -> None:
        raise FakeNotSupported("Not Supported")

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        return _gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        return _gpu(handle).name.encode()  # older bindings returned bytes

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> FakeMemory:
        return FakeMemory(_gpu(handle).memory_bytes)

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        mig = _gpu(handle).mig
        if mig is None:
            raise FakeNotSupported("Not Supported")
        return mig

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        numa = _gpu(handle).numa
        if numa is None:
            raise FakeNotSupported("Not Supported")
        return numa

    def nvmlDeviceGetPciInfo(self, handle: object) -> FakePci:
        return FakePci(_gpu(handle).bus_id)


def _gpu(handle: object) -> FakeGpu:
    assert isinstance(handle, FakeGpu)
    return handle


GIB = 1024**3


def _sysfs(tmp_path: Path, entries: dict[str, str]) -> Path:
    for name, numa in entries.items():
        device = tmp_path / "bus" / "pci" / "devices" / name
        device.mkdir(parents=True)
        (device / "numa_node").write_text(f"{numa}\n")
    return tmp_path


def test_nvml_backend_describes_each_gpu() -> None:
    nvml = FakeNvml(
        gpus=[
            FakeGpu(
                "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, "00000000:3B:00.0", numa=0, mig=[0, 0]
            ),
            FakeGpu(
                "GPU-1", "NVIDIA H100 80GB HBM3", 80 * GIB, "00000000:86:00.0", numa=1, mig=[1, 1]
            ),
        ]
    )

    with NvmlBackend(nvml, sysfs_root=Path("/nonexistent")) as backend:
        gpus = backend.list_gpus()

    assert gpus == [
        GpuInfo("GPU-0", 0, "NVIDIA H100 80GB HBM3", 81920, 0, mig_enabled=False, healthy=True),
        GpuInfo("GPU-1", 1, "NVIDIA H100 80GB HBM3", 81920, 1, mig_enabled=True, healthy=True),
    ]
    assert nvml.calls == ["init", "shutdown"]


def test_nvml_backend_falls_back_to_sysfs_numa_and_mig_not_supported(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {"0000:3b:00.0": "1", "0000:af:00.0": "-1"})
    nvml = FakeNvml(
        gpus=[
            FakeGpu("GPU-0", "Tesla T4", 16 * GIB, "00000000:3B:00.0"),
            FakeGpu("GPU-1", "Tesla T4", 16 * GIB, b"00000000:AF:00.0\x00"),
            FakeGpu("GPU-2", "Tesla T4", 16 * GIB, "00000000:D8:00.0"),  # no sysfs entry
        ]
    )
    backend = NvmlBackend(nvml, sysfs_root=sysfs)

    gpus = backend.list_gpus()
    backend.close()
    backend.close()

    assert [(gpu.numa, gpu.mig_enabled, gpu.memory_mib) for gpu in gpus] == [
        (1, False, 16384),
        (NO_NUMA, False, 16384),
        (NO_NUMA, False, 16384),
    ]
    assert nvml.calls == ["init", "shutdown"]
    with pytest.raises(DiscoveryError, match="closed"):
        backend.list_gpus()


def test_nvml_backend_uses_sysfs_when_numa_function_is_absent(tmp_path: Path) -> None:
    class OldBindings(FakeNvml):
        def __getattribute__(self, name: str) -> object:
            if name == "nvmlDeviceGetNumaNodeId":
                raise AttributeError(name)
            return super().__getattribute__(name)

    sysfs = _sysfs(tmp_path, {"0000:3b:00.0": "0"})
    nvml = OldBindings(gpus=[FakeGpu("GPU-0", "A10", 24 * GIB, "00000000:3B:00.0", numa=7)])

    with NvmlBackend(nvml, sysfs_root=sysfs) as backend:
        assert backend.list_gpus()[0].numa == 0


def test_nvml_backend_reports_missing_library() -> None:
    nvml = FakeNvml(init_error=FakeLibraryNotFound("NVML Shared Library Not Found"))

    with pytest.raises(
        DiscoveryError, match=r"^NVML is not available: NVML Shared Library Not Found$"
    ):
        NvmlBackend(nvml)


def test_nvml_backend_wraps_query_failures() -> None:
    class Failing(FakeNvml):
        def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
            raise FakeNvmlError("GPU is lost")

    with (
        NvmlBackend(Failing(gpus=[FakeGpu("GPU-0", "A10", GIB, "0:0")])) as backend,
        pytest.raises(DiscoveryError, match="NVML query of GPU 0 failed: GPU is lost"),
    ):
        backend.list_gpus()


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="an NVIDIA driver is installed"
)
def test_real_pynvml_without_driver_is_a_discovery_error() -> None:
    """Without libnvidia-ml the real lazy import path must say NVML is missing."""
    with pytest.raises(DiscoveryError, match=r"^NVML is not available: "):
        NvmlBackend()


@pytest.mark.parametrize(
    ("bus_id", "name"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000001:AF:00.0\x00", "0001:af:00.0"),
    ],
)
def test_pci_sysfs_name(bus_id: str, name: str) -> None:
    assert pci_sysfs_name(bus_id) == name
