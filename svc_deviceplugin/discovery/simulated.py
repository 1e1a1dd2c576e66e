"""Simulated GPUs from a topology file, for tests and ``numafit simulate``.

The file is YAML or JSON: either a list of GPUs or a mapping ``{gpus: [...]}``;
each GPU is ``{uuid, model, memory (MiB), numa, index?, mig?, healthy?, cores?, count?}``
(``count``: replica slots of that GPU, default the plugin's ``--replicas``).
Validation is strict (unknown keys, wrong types and duplicates are refused)
because a typo in a simulated topology would otherwise silently change what a
scenario proves. Errors name the file, the item and the key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import yaml

from svc_deviceplugin.discovery.errors import TopologyError
from svc_deviceplugin.discovery.model import NO_NUMA, GpuInfo

__all__ = ["SimulatedBackend", "parse_gpus", "parse_topology"]

_REQUIRED = ("uuid", "model", "memory", "numa")
_OPTIONAL = ("index", "mig", "healthy", "cores", "count")


class SimulatedBackend:
    """A fixed set of GPUs; nothing to open or close."""

    def __init__(self, gpus: Iterable[GpuInfo]) -> None:
        self._gpus = sorted(gpus, key=lambda gpu: gpu.index)

    @classmethod
    def from_file(cls, path: Path | str) -> SimulatedBackend:
        """Load a ``.json`` file as JSON and anything else as YAML."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TopologyError(f"{path}: cannot read topology: {exc.strerror or exc}") from exc
        fmt = "json" if path.suffix.lower() == ".json" else "yaml"
        return cls.from_text(text, fmt=fmt, source=str(path))

    @classmethod
    def from_text(
        cls, text: str, *, fmt: str = "yaml", source: str = "topology"
    ) -> SimulatedBackend:
        """Parse ``text`` as ``fmt`` (``yaml`` or ``json``)."""
        return cls(parse_topology(_decode(text, fmt, source), source=source))

    def list_gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def close(self) -> None:
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
