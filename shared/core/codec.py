"""HAMi's annotation encodings, byte-compatible both ways (reference (c)).

Device lists:   container_entry := { uuid "," type "," mem "," cores ":" }
                pod_value       := { container_entry ";" }
Entries are positional (init containers first); empty entries are kept because dropping one
shifts every later container (HAMi #2899). Decoding a pod value keeps the trailing empty entry
that the final ';' produces, exactly as HAMi does; readers index by position against the spec.
Rewrites replace one container's piece in the raw string and keep every other byte.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

import orjson

from shared.core.errors import AnnotationError
from shared.core.keys import INT32_MAX
from shared.core.model import ContainerDevice, ContainerEntry, DeviceInfo

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

_GO_INT = re.compile(r"^[+-]?[0-9]+$")


def _int32(text: str, what: str, segment: str) -> int:
    # strconv.ParseInt(s, 10, 32): optional sign, ASCII digits, no spaces or underscores.
    if not _GO_INT.match(text):
        raise AnnotationError(f"device {segment!r}: {what} {text!r} is not an integer")
    value = int(text)
    if value < 0:
        raise AnnotationError(f"device {segment!r}: {what} {text!r} is negative")
    if value > INT32_MAX:
        raise AnnotationError(f"device {segment!r}: {what} {text!r} overflows int32")
    return value


def encode_container(entry: Iterable[ContainerDevice]) -> str:
    """`UUID,Type,mem,cores:` per device; an empty entry is the empty string."""
    return "".join(f"{d.uuid},{d.type},{d.usedmem},{d.usedcores}:" for d in entry)


def encode_pod(entries: Iterable[Iterable[ContainerDevice]]) -> str:
    """One `;`-terminated piece per container position."""
    return "".join(encode_container(e) + ";" for e in entries)


def decode_container(text: str) -> ContainerEntry:
    """Decode one container's piece; every device gets `idx=-1`, `slots=0`."""
    devices: list[ContainerDevice] = []
    for segment in text.split(":"):
        if not segment:
            continue
        if "," not in segment:
            raise AnnotationError(f"device {segment!r} has no ',' separated fields")
        fields = segment.split(",")
        if len(fields) < 4:
            raise AnnotationError(f"device {segment!r} has {len(fields)} fields, needs 4")
        uuid, vendor, mem, cores = fields[:4]  # extra fields are ignored, as in HAMi
        if not uuid:
            raise AnnotationError(f"device {segment!r} has an empty UUID")
        if not vendor:
            raise AnnotationError(f"device {segment!r} has an empty type")
        devices.append(
            ContainerDevice(
                uuid, vendor, _int32(mem, "memory", segment), _int32(cores, "cores", segment)
            )
        )
    return tuple(devices)


DECODED_CACHE = 4096
"""Pod values whose decoding is remembered: each value is decoded several times in its life
(every reader tracks the pod, every write's response and watch event re-tracks it)."""
DECODED_CACHE_LENGTH = 2048
"""Longer values are decoded afresh each time, so the cache stays small whatever it is fed."""


def decode_pod(text: str) -> list[ContainerEntry]:
    """Decode a pod value keeping every piece, the trailing empty one included."""
    if len(text) > DECODED_CACHE_LENGTH:
        return _decode_pieces(text)
    return list(_decoded(text))


def _decode_pieces(text: str) -> list[ContainerEntry]:
    return [decode_container(piece) for piece in text.split(";")]


@functools.lru_cache(maxsize=DECODED_CACHE)
def _decoded(text: str) -> tuple[ContainerEntry, ...]:
    # Entries are tuples of frozen devices: sharing them between callers is safe. A value
    # that does not decode raises, and exceptions are not remembered.
    return tuple(_decode_pieces(text))


def rewrite_entry(raw: str, index: int, entry: Iterable[ContainerDevice]) -> str:
    """Replace container `index`'s piece in `raw`, preserving every other byte.

    A missing or blank target piece is an error: the caller must never resurrect an entry that
    Allocate already consumed.
    """
    pieces = raw.split(";")
    if index < 0 or index >= len(pieces):
        raise AnnotationError(f"entry {index} is out of range ({len(pieces)} pieces)")
    if not pieces[index].strip():
        raise AnnotationError(f"entry {index} is blank")
    pieces[index] = encode_container(entry)
    return ";".join(pieces)


def only_entry_changed(old: str, new: str, index: int) -> bool:
    """Whether pod value `new` differs from `old` in container `index`'s piece at most: the
    same number of pieces and every other piece byte for byte the same (all that a refit's
    move may change)."""
    old_pieces, new_pieces = old.split(";"), new.split(";")
    return len(old_pieces) == len(new_pieces) and all(
        a == b for i, (a, b) in enumerate(zip(old_pieces, new_pieces, strict=True)) if i != index
    )


def blank_entry(raw: str, index: int) -> str:
    """Blank container `index`'s piece (Allocate consumed it); separators survive."""
    pieces = raw.split(";")
    if index < 0 or index >= len(pieces):
        raise AnnotationError(f"entry {index} is out of range ({len(pieces)} pieces)")
    pieces[index] = ""
    return ";".join(pieces)


# --- node annotations -------------------------------------------------------------------


def _field(item: dict[str, Any], key: str, kind: type, position: int, default: Any = None) -> Any:
    if key not in item:
        if default is None:
            raise AnnotationError(f"register entry {position} lacks {key!r}")
        return default
    value = item[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise AnnotationError(f"register entry {position}: {key!r} must be an integer")
    if kind is not int and not isinstance(value, kind):
        raise AnnotationError(f"register entry {position}: {key!r} must be a {kind.__name__}")
    return value


def parse_register(text: str) -> tuple[DeviceInfo, ...]:
    """Parse `hami.io/node-nvidia-register`: HAMi's JSON list, or the legacy comma form."""
    stripped = text.strip()
    if not stripped.startswith("["):
        return _parse_legacy_register(stripped)
    try:
        items = orjson.loads(stripped)
    except orjson.JSONDecodeError as exc:
        raise AnnotationError(f"register annotation is not valid JSON: {exc}") from exc
    return parse_register_items(items)


def parse_register_items(items: Any) -> tuple[DeviceInfo, ...]:
    """Validate register items already decoded from JSON."""
    if not isinstance(items, list):
        raise AnnotationError("register annotation must be a JSON list")
    devices: list[DeviceInfo] = []
    for position, item in enumerate(items):
        if not isinstance(item, dict):
            raise AnnotationError(f"register entry {position} is not an object")
        device = DeviceInfo(
            id=_field(item, "id", str, position),
            index=_field(item, "index", int, position, position),
            count=_field(item, "count", int, position),
            devmem=_field(item, "devmem", int, position),
            devcore=_field(item, "devcore", int, position),
            type=_field(item, "type", str, position),
            numa=_field(item, "numa", int, position, 0),
            mode=_field(item, "mode", str, position, "hami-core"),
            health=_field(item, "health", bool, position, True),
        )
        _check_device(device, position)
        devices.append(device)
    _check_unique(devices)
    return tuple(devices)


_GO_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_GO_BOOL.update(
    {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
)


def parse_go_bool(text: str) -> bool | None:
    """strconv.ParseBool: None when the text is not a Go boolean."""
    return _GO_BOOL.get(text)


def _parse_legacy_register(text: str) -> tuple[DeviceInfo, ...]:
    # Legacy form: devices separated by ':', fields by ',':
    # id,count,devmem,devcore,type,numa,health[,index,mode]
    devices: list[DeviceInfo] = []
    for position, segment in enumerate(s for s in text.split(":") if s):
        fields = segment.split(",")
        if len(fields) not in (7, 9):
            raise AnnotationError(
                f"register entry {position} {segment!r} has {len(fields)} fields; "
                "expected a JSON list or the legacy 7/9-field form"
            )
        health = parse_go_bool(fields[6])
        if health is None:
            raise AnnotationError(f"register entry {position}: health {fields[6]!r} not a bool")
        try:
            device = DeviceInfo(
                id=fields[0],
                count=int(fields[1]),
                devmem=int(fields[2]),
                devcore=int(fields[3]),
                type=fields[4],
                numa=int(fields[5]),
                health=health,
                index=int(fields[7]) if len(fields) == 9 else position,
                mode=fields[8] if len(fields) == 9 else "hami-core",
            )
        except ValueError as exc:
            raise AnnotationError(f"register entry {position} {segment!r}: {exc}") from exc
        _check_device(device, position)
        devices.append(device)
    _check_unique(devices)
    return tuple(devices)


def _check_device(device: DeviceInfo, position: int) -> None:
    if not device.id:
        raise AnnotationError(f"register entry {position} has an empty id")
    for name in ("count", "devmem", "devcore"):
        if getattr(device, name) < 0:
            raise AnnotationError(f"register entry {position}: {name} is negative")


def _check_unique(devices: Sequence[DeviceInfo]) -> None:
    seen: set[str] = set()
    for device in devices:
        if device.id in seen:
            raise AnnotationError(f"register lists GPU {device.id!r} twice")
        seen.add(device.id)


def register_item(d: DeviceInfo) -> dict[str, Any]:
    """One GPU as a JSON register item."""
    return {
        "id": d.id,
        "index": d.index,
        "count": d.count,
        "devmem": d.devmem,
        "devcore": d.devcore,
        "type": d.type,
        "numa": d.numa,
        "mode": d.mode,
        "health": d.health,
    }


def encode_register(devices: Iterable[DeviceInfo]) -> str:
    """HAMi's JSON register form (what the device plugin publishes through accounting)."""
    return orjson.dumps([register_item(d) for d in devices]).decode()


def parse_uuid_list(text: str | None) -> frozenset[str]:
    """Comma-separated UUIDs, entries trimmed, empty entries dropped (cordon, use/nouse lists)."""
    if not text:
        return frozenset()
    return frozenset(item.strip() for item in text.split(",") if item.strip())


# --- kubelet device IDs -----------------------------------------------------------------


def physical_id(device_id: str, known: frozenset[str] | None = None) -> str:
    """Reduce a kubelet device ID (replica, annotated or MIG form) to its physical GPU UUID.

    HAMi's rules: `a::b` -> `a`; `a[...]` -> `a`; an ID with exactly six dashes whose last dash
    segment is an integer drops that `-<n>`. numafit adds one rule first: when `known` (the
    plugin's own GPU UUIDs) contains the ID minus a trailing `-<n>`, that is the answer, so short
    simulated UUIDs such as `GPU-a` map correctly too.
    """
    if "::" in device_id:
        return device_id.split("::", 1)[0]
    if "[" in device_id:
        return device_id.split("[", 1)[0]
    head, dash, tail = device_id.rpartition("-")
    if dash and tail.isdigit() and tail.isascii():
        if known is not None and head in known:
            return head
        if device_id.count("-") == 6:
            return head
    return device_id


def unique_physical_ids(
    device_ids: Iterable[str], known: frozenset[str] | None = None
) -> list[str]:
    """De-duplicated physical IDs in first-seen order (the refit's `allowedDeviceUUIDs`)."""
    seen: dict[str, None] = {}
    for device_id in device_ids:
        seen.setdefault(physical_id(device_id, known))
    return list(seen)
