"""Simulated GPUs from a topology file, for tests and ``numafit simulate``.

The file is YAML or JSON: either a list of GPUs or a mapping ``{gpus: [...]}``;
each GPU is ``{uuid, model, memory (MiB), numa, index?, mig?, healthy?, cores?, count?}``
(``count``: replica slots of that GPU, default the plugin's ``--replicas``).
Validation is strict (unknown keys, wrong types and duplicates are refused)
because a typo in a simulated topology would otherwise silently change what a
scenario proves. Errors name the file, the item and the key.

Health events are injected, the way NVML would report an XID:

- in process, :meth:`SimulatedBackend.inject_xid` (``backend.inject_xid("GPU-a", 79)``);
- from outside a running plugin, an *XID file* (``--xid-file PATH``, env
  ``NUMAFIT_XID_FILE``): every complete line appended to it is one event,
  ``<uuid> <xid>`` (``*`` for the uuid: an event NVML could not attribute, so every GPU);
  blank lines and ``#`` comments are skipped, a malformed line is logged and skipped. The
  file need not exist when the plugin starts; lines present when it starts count too.
"""

from __future__ import annotations

import json
import logging
import queue
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml

from shared.subjects import shown
from svc_deviceplugin.discovery.errors import TopologyError
from svc_deviceplugin.discovery.model import NO_NUMA, GpuInfo, HealthEvent

__all__ = ["SimulatedBackend", "SimulatedHealthWatch", "parse_gpus", "parse_topology"]

logger = logging.getLogger(__name__)

_REQUIRED = ("uuid", "model", "memory", "numa")
_OPTIONAL = ("index", "mig", "healthy", "cores", "count")
_FILE_POLL_S = 0.05
"""How often the XID file is looked at while a wait runs."""
EVERY_GPU = "*"
"""The uuid of an XID-file line that concerns every GPU."""


class SimulatedBackend:
    """A fixed set of GPUs, with XID events injected in process or through an XID file."""

    def __init__(self, gpus: Iterable[GpuInfo], *, xid_file: Path | str | None = None) -> None:
        self._gpus = sorted(gpus, key=lambda gpu: gpu.index)
        self._events: queue.SimpleQueue[HealthEvent] = queue.SimpleQueue()
        self.xid_file = Path(xid_file) if xid_file is not None else None

    @classmethod
    def from_file(cls, path: Path | str, *, xid_file: Path | str | None = None) -> SimulatedBackend:
        """Load a ``.json`` file as JSON and anything else as YAML."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TopologyError(f"{path}: cannot read topology: {exc.strerror or exc}") from exc
        fmt = "json" if path.suffix.lower() == ".json" else "yaml"
        return cls(
            parse_topology(_decode(text, fmt, str(path)), source=str(path)), xid_file=xid_file
        )

    @classmethod
    def from_text(
        cls, text: str, *, fmt: str = "yaml", source: str = "topology"
    ) -> SimulatedBackend:
        """Parse ``text`` as ``fmt`` (``yaml`` or ``json``)."""
        return cls(parse_topology(_decode(text, fmt, source), source=source))

    def list_gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def inject_xid(self, uuid: str | None, xid: int) -> None:
        """Report XID ``xid`` on GPU ``uuid`` (None: on a GPU that cannot be named, so every
        GPU), as NVML's event set would. Thread-safe."""
        if uuid is not None and uuid not in {gpu.uuid for gpu in self._gpus}:
            raise ValueError(f"no simulated GPU {uuid!r}")
        if xid < 0:
            raise ValueError("an XID is a non-negative integer")
        self._events.put(HealthEvent(uuid, xid, f"XID {xid} (injected)"))

    def watch_health(self) -> SimulatedHealthWatch:
        return SimulatedHealthWatch(self._events, self.xid_file)

    def close(self) -> None:
        return None


class SimulatedHealthWatch:
    """Injected events, in order: those of :meth:`SimulatedBackend.inject_xid` and the XID
    file's lines."""

    def __init__(self, events: queue.SimpleQueue[HealthEvent], xid_file: Path | None) -> None:
        self._events = events
        self._file = xid_file
        self._offset = 0

    def wait(self, timeout_ms: int) -> HealthEvent | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            self._read_file()
            left = deadline - time.monotonic()
            step = left if self._file is None else min(left, _FILE_POLL_S)
            try:
                return self._events.get(timeout=max(step, 0.0))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return None

    def close(self) -> None:
        return None

    def _read_file(self) -> None:
        if self._file is None:
            return
        try:
            with self._file.open("rb") as handle:
                handle.seek(0, 2)
                if handle.tell() < self._offset:
                    self._offset = 0  # truncated: start over
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning(
                "XID file unreadable", extra={"path": str(self._file), "error": str(exc)}
            )
            return
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        for raw in data[:complete].decode("utf-8", "replace").splitlines():
            event = _parse_xid_line(raw)
            if event is not None:
                self._events.put(event)


def _parse_xid_line(raw: str) -> HealthEvent | None:
    line = raw.strip()
    if not line or line.startswith("#"):
        return None
    parts = line.split()
    if len(parts) == 2 and parts[1].isdigit():
        uuid = None if parts[0] == EVERY_GPU else parts[0]
        xid = int(parts[1])
        return HealthEvent(uuid, xid, f"XID {xid} (from the XID file)")
    logger.warning("XID file line skipped: expected '<uuid> <xid>'", extra={"line": shown(line)})
    return None


def parse_topology(document: object, *, source: str = "topology") -> list[GpuInfo]:
    """A decoded topology document (list of GPUs or ``{gpus: [...]}``) as GPUs."""
    if isinstance(document, Mapping):
        unknown = sorted(str(key) for key in document if key != "gpus")
        if unknown:
            raise TopologyError(
                f"{source}: unknown key(s) {', '.join(unknown)}; expected only 'gpus'"
            )
        if "gpus" not in document:
            raise TopologyError(f"{source}: missing key 'gpus'")
        return parse_gpus(document["gpus"], where=f"{source}: gpus")
    return parse_gpus(document, where=source)


def parse_gpus(items: object, *, where: str = "gpus") -> list[GpuInfo]:
    """A list of GPU mappings as GPUs; ``where`` prefixes every error message."""
    if not isinstance(items, Sequence) or isinstance(items, str | bytes):
        raise TopologyError(f"{where}: must be a list of GPUs, got {_kind(items)}")
    gpus = [_parse_gpu(item, position, where) for position, item in enumerate(items)]
    _refuse_duplicates(gpus, where)
    return gpus


def _parse_gpu(item: object, position: int, where: str) -> GpuInfo:
    label = f"{where}[{position}]"
    if not isinstance(item, Mapping):
        raise TopologyError(f"{label}: must be a mapping, got {_kind(item)}")
    if isinstance(item.get("uuid"), str) and item["uuid"]:
        label = f"{label} ({item['uuid']})"
    unknown = sorted(str(key) for key in item if key not in _REQUIRED + _OPTIONAL)
    if unknown:
        allowed = ", ".join(_REQUIRED + _OPTIONAL)
        raise TopologyError(f"{label}: unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    missing = [key for key in _REQUIRED if key not in item]
    if missing:
        raise TopologyError(f"{label}: missing key(s) {', '.join(missing)}")
    return GpuInfo(
        uuid=_text(item, "uuid", label),
        index=_integer(item, "index", label, default=position, minimum=0),
        model=_text(item, "model", label),
        memory_mib=_integer(item, "memory", label, minimum=1),
        numa=_integer(item, "numa", label, minimum=NO_NUMA),
        mig_enabled=_flag(item, "mig", label, default=False),
        healthy=_flag(item, "healthy", label, default=True),
        cores=_integer(item, "cores", label, default=100, minimum=1, maximum=100),
        replicas=_integer(item, "count", label, default=0, minimum=1),
    )


def _text(item: Mapping[object, object], key: str, label: str) -> str:
    value = item[key]
    if not isinstance(value, str) or not value.strip():
        raise TopologyError(f"{label}: key '{key}' must be a non-empty string, got {_kind(value)}")
    return value


def _integer(
    item: Mapping[object, object],
    key: str,
    label: str,
    *,
    default: int | None = None,
    minimum: int,
    maximum: int | None = None,
) -> int:
    if key not in item and default is not None:
        return default
    value = item[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyError(f"{label}: key '{key}' must be an integer, got {_kind(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise TopologyError(f"{label}: key '{key}' must be {bounds}, got {value}")
    return value


def _flag(item: Mapping[object, object], key: str, label: str, *, default: bool) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise TopologyError(f"{label}: key '{key}' must be true or false, got {_kind(value)}")
    return value


def _refuse_duplicates(gpus: Sequence[GpuInfo], where: str) -> None:
    seen_uuids: set[str] = set()
    seen_indexes: set[int] = set()
    for position, gpu in enumerate(gpus):
        if gpu.uuid in seen_uuids:
            raise TopologyError(f"{where}[{position}] ({gpu.uuid}): duplicate uuid")
        if gpu.index in seen_indexes:
            raise TopologyError(f"{where}[{position}] ({gpu.uuid}): duplicate index {gpu.index}")
        seen_uuids.add(gpu.uuid)
        seen_indexes.add(gpu.index)


def _decode(text: str, fmt: str, source: str) -> object:
    if fmt == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyError(f"{source}: invalid JSON: {exc}") from exc
    if fmt == "yaml":
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise TopologyError(f"{source}: invalid YAML: {exc}") from exc
    raise TopologyError(f"{source}: unknown topology format {fmt!r}; expected yaml or json")


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, bool | int | float):
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__
