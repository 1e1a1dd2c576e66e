"""Discovery of real GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

``pynvml`` is imported lazily so the package imports on machines without the
NVIDIA driver (CI, the simulator); only constructing :class:`NvmlBackend`
touches the library, and a missing library or driver becomes one clear
:class:`DiscoveryError`. The module object can be injected, which is how tests
exercise this code without a GPU, and so can the sysfs root used for the NUMA
fallback NVIDIA's own device plugin relies on.

Health follows NVIDIA's device plugin: one event set (``nvmlEventSetCreate``), every GPU
registered for ``nvmlEventTypeXidCriticalError`` (``nvmlDeviceRegisterEvents``; a GPU that
answers NotSupported stays healthy, with one log line), then ``nvmlEventSetWait_v2`` with a
short timeout, called again and again from a worker thread (a Timeout is no event). An event
names its device (``device``) and XID (``eventData``); a failed wait, or an event whose device
NVML cannot name, concerns every GPU.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from svc_deviceplugin.discovery.errors import DiscoveryError
from svc_deviceplugin.discovery.model import NO_NUMA, GpuInfo, HealthEvent

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["NvmlApi", "NvmlBackend", "NvmlHealthWatch", "pci_sysfs_name"]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_NUMA_UNSET = 0xFFFFFFFF  # an unsigned -1 some drivers hand back


class _MemoryInfo(Protocol):
    @property
    def total(self) -> int: ...


class _PciInfo(Protocol):
    @property
    def busId(self) -> str | bytes: ...


class _EventData(Protocol):
    """``c_nvmlEventData_t`` as ``nvmlEventSetWait_v2`` returns it."""

    @property
    def device(self) -> object: ...
    @property
    def eventType(self) -> int: ...
    @property
    def eventData(self) -> int: ...


class NvmlApi(Protocol):
    """The part of ``pynvml`` this backend calls (``nvmlDeviceGetNumaNodeId`` is optional)."""

    @property
    def NVMLError(self) -> type[Exception]: ...
    @property
    def NVMLError_NotSupported(self) -> type[Exception]: ...
    @property
    def NVMLError_FunctionNotFound(self) -> type[Exception]: ...
    @property
    def NVMLError_Timeout(self) -> type[Exception]: ...
    @property
    def nvmlEventTypeXidCriticalError(self) -> int: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _MemoryInfo: ...
    def nvmlDeviceGetMigMode(self, handle: object) -> Sequence[int]: ...
    def nvmlDeviceGetPciInfo(self, handle: object) -> _PciInfo: ...
    def nvmlEventSetCreate(self) -> object: ...
    def nvmlDeviceRegisterEvents(
        self, handle: object, eventTypes: int, eventSet: object
    ) -> None: ...
    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> _EventData: ...
    def nvmlEventSetFree(self, eventSet: object) -> None: ...


class NvmlBackend:
    """GPUs as NVML reports them. NVML is initialised here and shut down by :meth:`close`.

    :meth:`list_gpus` reports every GPU healthy: it says what exists. Health comes from XID
    events, through :meth:`watch_health` (close the watch before the backend).
    """

    def __init__(self, nvml: NvmlApi | None = None, *, sysfs_root: Path = Path("/sys")) -> None:
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._sysfs_root = sysfs_root
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML is not available: {exc}") from exc
        self._open = True
        logger.debug("nvml initialised")

    def list_gpus(self) -> list[GpuInfo]:
        """Query every GPU; a failing NVML call becomes :class:`DiscoveryError`."""
        if not self._open:
            raise DiscoveryError("NVML backend is closed")
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML device count failed: {exc}") from exc
        gpus = []
        for index in range(count):
            try:
                gpus.append(self._describe(index))
            except nvml.NVMLError as exc:
                raise DiscoveryError(f"NVML query of GPU {index} failed: {exc}") from exc
        logger.info("nvml discovery done", extra={"gpu_count": len(gpus)})
        return gpus

    def watch_health(self) -> NvmlHealthWatch:
        """An event set with every GPU registered for XID critical errors."""
        if not self._open:
            raise DiscoveryError("NVML backend is closed")
        nvml = self._nvml
        devices: list[tuple[str, object]] = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                devices.append((_text(nvml.nvmlDeviceGetUUID(handle)), handle))
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML device query for health events failed: {exc}") from exc
        return NvmlHealthWatch(nvml, devices)

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            logger.warning("nvml shutdown failed", extra={"error": str(exc)})

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _describe(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        return GpuInfo(
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            index=index,
            model=_text(nvml.nvmlDeviceGetName(handle)),
            memory_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB,
            numa=self._numa_node(handle),
            mig_enabled=self._mig_enabled(handle),
            healthy=True,
        )

    def _mig_enabled(self, handle: object) -> bool:
        nvml = self._nvml
        try:
            current = nvml.nvmlDeviceGetMigMode(handle)[0]
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return False  # a GPU without MIG support
        return current == _MIG_ENABLED

    def _numa_node(self, handle: object) -> int:
        """NVML's NUMA node id when the library has it, else sysfs by PCI bus id."""
        nvml = self._nvml
        get_numa = cast(
            "Callable[[object], int] | None", getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
        )
        if get_numa is not None:
            try:
                return _normalise_numa(get_numa(handle))
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
                pass  # older driver: fall back to sysfs
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        return self._sysfs_numa_node(bus_id)

    def _sysfs_numa_node(self, bus_id: str) -> int:
        path = self._sysfs_root / "bus" / "pci" / "devices" / pci_sysfs_name(bus_id) / "numa_node"
        try:
            text = path.read_text(encoding="ascii").strip()
        except OSError as exc:
            logger.warning("numa node unreadable", extra={"path": str(path), "error": str(exc)})
            return NO_NUMA
        try:
            return _normalise_numa(int(text))
        except ValueError:
            logger.warning("numa node malformed", extra={"path": str(path), "value": text})
            return NO_NUMA


class NvmlHealthWatch:
    """XID critical-error events of a set of GPUs, one NVML event set.

    Devices whose registration fails with anything but NotSupported are reported unhealthy
    by the first calls to :meth:`wait` (NVIDIA's device plugin does the same).
    """

    def __init__(self, nvml: NvmlApi, devices: Sequence[tuple[str, object]]) -> None:
        self._nvml = nvml
        self._pending: deque[HealthEvent] = deque()
        self._lock = threading.Lock()
        try:
            self._set: object | None = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"NVML event set cannot be created: {exc}") from exc
        watched = 0
        for uuid, handle in devices:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
            except nvml.NVMLError_NotSupported:
                logger.warning(
                    "GPU does not support XID events; its health is not watched",
                    extra={"uuid": uuid},
                )
            except nvml.NVMLError as exc:
                self._pending.append(
                    HealthEvent(uuid, None, f"XID events cannot be watched: {exc}")
                )
            else:
                watched += 1
        logger.info("watching XID events", extra={"gpus": watched, "of": len(devices)})

    def wait(self, timeout_ms: int) -> HealthEvent | None:
        nvml = self._nvml
        if self._pending:
            return self._pending.popleft()
        with self._lock:
            if self._set is None:
                raise DiscoveryError("NVML health watch is closed")
            try:
                data = nvml.nvmlEventSetWait_v2(self._set, timeout_ms)
            except nvml.NVMLError_Timeout:
                return None
            except nvml.NVMLError as exc:
                # Like NVIDIA's plugin: no way to tell which GPU, so it concerns every one.
                # Pause for the timeout so that a lasting failure does not spin.
                time.sleep(timeout_ms / 1000)
                return HealthEvent(None, None, f"waiting for NVML events failed: {exc}")
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                return None  # only XID critical errors are registered
            xid = int(data.eventData)
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError as exc:
                return HealthEvent(None, xid, f"XID {xid} on a GPU NVML cannot name: {exc}")
        return HealthEvent(uuid, xid, f"XID {xid}")

    def close(self) -> None:
        with self._lock:
            event_set, self._set = self._set, None
            if event_set is None:
                return
            try:
                self._nvml.nvmlEventSetFree(event_set)
            except self._nvml.NVMLError as exc:
                logger.warning("nvml event set free failed", extra={"error": str(exc)})


def pci_sysfs_name(bus_id: str) -> str:
    """NVML's bus id as sysfs names the device: ``00000000:3B:00.0`` -> ``0000:3b:00.0``."""
    domain, sep, rest = bus_id.strip().rstrip("\x00").partition(":")
    if sep and len(domain) == 8:
        domain = domain[4:]
    return f"{domain}{sep}{rest}".lower()


def _normalise_numa(node: int) -> int:
    return NO_NUMA if node < 0 or node == _NUMA_UNSET else node


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _import_pynvml() -> NvmlApi:
    try:
        return cast("NvmlApi", importlib.import_module("pynvml"))
    except ImportError as exc:
        raise DiscoveryError(f"NVML is not available: {exc}") from exc
