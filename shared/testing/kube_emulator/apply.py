"""Server-side apply (PATCH `application/apply-patch+yaml`) and the managedFields it keeps.

What is emulated, and how far:

- An apply creates the object when it is missing, and otherwise merges the applied
  configuration into it: maps key by key, list maps (containers by name, ports by
  containerPort and protocol, ...) item by item, sets member by member, anything else replaced.
- The manager (`fieldManager`, required) then owns exactly the fields it applied. A field it
  applied last time and no longer does is removed from the object, unless another manager also
  owns it: applying a smaller configuration deletes what was dropped, as upstream does.
- Applying a value to a field another manager owns with a different value is a conflict:
  409 with upstream's wording and one FieldManagerConflict cause per field, unless `force=true`,
  which takes the field over. Equal values are shared, not conflicts.
- Once an object has managedFields, every other write records them too: the writer
  (`fieldManager`, or its User-Agent's product name) takes the fields it changed from whoever
  owned them, under an Update entry. Objects nobody ever applied carry no managedFields (unlike
  upstream, which records them on every write); when one is first applied, its existing fields
  are attributed to the manager `before-first-apply`, as upstream attributes fields written
  before managedFields existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson

from . import errors
from .errors import KubeError
from .fieldsets import (
    ITEM,
    Leaves,
    Path,
    child_type,
    from_fields_v1,
    item_segment,
    object_leaves,
    remove,
    to_fields_v1,
)
from .objects import JSONDict, copy_json, metadata
from .schema import ListOf, Ref
from .schema_catalog import CATALOG

if TYPE_CHECKING:
    from .resources import ResourceKind
    from .schema import TypeExpr

CONTENT_TYPE = "application/apply-patch+yaml"
BEFORE_FIRST_APPLY = "before-first-apply"

Operation = Literal["Apply", "Update"]


@dataclass
class Entry:
    manager: str
    operation: str
    api_version: str
    time: str
    fields: set[Path] = field(default_factory=set)
    subresource: str = ""

    def to_json(self) -> JSONDict:
        entry: JSONDict = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            entry["subresource"] = self.subresource
        return entry


def read_entries(obj: JSONDict) -> list[Entry]:
    raw = metadata(obj).get("managedFields")
    entries = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("manager"), str):
            entries.append(
                Entry(
                    item["manager"],
                    str(item.get("operation", "Update")),
                    str(item.get("apiVersion", "")),
                    str(item.get("time", "")),
                    from_fields_v1(item.get("fieldsV1")),
                    str(item.get("subresource", "")),
                )
            )
    return entries


def write_entries(obj: JSONDict, entries: list[Entry]) -> None:
    kept = [entry.to_json() for entry in entries if entry.fields]
    if kept:
        metadata(obj)["managedFields"] = kept
    else:
        metadata(obj).pop("managedFields", None)


def _entry(entries: list[Entry], manager: str, operation: str, subresource: str) -> Entry | None:
    for entry in entries:
        if (entry.manager, entry.operation, entry.subresource) == (manager, operation, subresource):
            return entry
    return None


def _type_id(kind: ResourceKind) -> str | None:
    schema = CATALOG.by_gvk(kind.group, kind.version, kind.kind)
    return None if schema is None else schema.id


def _status_part(kind: ResourceKind, subresource: str) -> bool | None:
    """Which part of the object a write owns: the status, all but the status, or all."""
    if subresource == "status":
        return True
    return False if kind.has_status else None


# --- apply ---------------------------------------------------------------------------------------


def _merge(live: Any, applied: Any, expr: TypeExpr | None) -> Any:
    if isinstance(applied, dict):
        result = live if isinstance(live, dict) else {}
        for key, value in applied.items():
            if value is None:
                result.pop(key, None)
            else:
                result[key] = _merge(result.get(key), value, child_type(expr, key))
        return result
    if (
        isinstance(applied, list)
        and isinstance(live, list)
        and isinstance(expr, ListOf)
        and expr.list_type != "atomic"
    ):
        result_list = list(live)
        for item in applied:
            segment = item_segment(item, expr)
            index = next(
                (
                    i
                    for i, existing in enumerate(result_list)
                    if segment is not None and item_segment(existing, expr) == segment
                ),
                None,
            )
            if index is None:
                result_list.append(item)
            elif expr.list_type == "map":
                result_list[index] = _merge(result_list[index], item, expr.items)
        return result_list
    return applied


def _format_path(path: Path) -> str:
    """A field path as upstream's conflict messages print it: .spec.containers[name="a"].image"""
    out = []
    for segment in path:
        if segment.startswith("f:"):
            out.append("." + segment[2:])
        elif segment.startswith("k:"):
            key = orjson.loads(segment[2:])
            out.append(
                "[" + ",".join(f"{k}={orjson.dumps(v).decode()}" for k, v in key.items()) + "]"
            )
        else:
            out.append(f"[={segment[2:]}]")
    return "".join(out)


def _conflict_error(conflicts: list[tuple[Entry, Path]]) -> KubeError:
    by_manager: dict[str, list[str]] = {}
    causes = []
    for entry, path in conflicts:
        who = f'"{entry.manager}"' + (f" using {entry.api_version}" if entry.api_version else "")
        by_manager.setdefault(who, []).append(_format_path(path))
        causes.append(
            {
                "reason": "FieldManagerConflict",
                "message": f"conflict with {who}",
                "field": _format_path(path),
            }
        )
    parts = []
    for who, fields in by_manager.items():
        if len(fields) == 1:
            parts.append(f"conflict with {who}: {fields[0]}")
        else:
            parts.append(f"conflicts with {who}:\n" + "\n".join(f"- {f}" for f in fields))
    count = len(conflicts)
    noun = "conflict" if count == 1 else "conflicts"
    message = f"Apply failed with {count} {noun}: " + "\n".join(parts)
    return KubeError(errors.status_object(409, message, "Conflict", {"causes": causes}))


def apply(
    kind: ResourceKind,
    live: JSONDict | None,
    config: JSONDict,
    *,
    manager: str,
    force: bool,
    subresource: str,
    now: str,
) -> JSONDict:
    """The object after `manager` applies `config` to `live` (None: it does not exist yet),
    with its managedFields updated; raises KubeError 409 on conflicts unless forced."""
    type_id = _type_id(kind)
    part = _status_part(kind, subresource)
    config = copy_json(config)
    if part is False:
        config.pop("status", None)  # the main resource never writes the status
    elif part is True:
        config = {k: v for k, v in config.items() if k in ("apiVersion", "kind", "status")}
    applied = object_leaves(config, type_id, status=part)
    current = copy_json(live) if live is not None else {}
    entries = read_entries(current)
    if live is not None and not entries:
        existing = set(object_leaves(current, type_id, status=None))
        entries = [Entry(BEFORE_FIRST_APPLY, "Update", kind.api_version, now, existing)]
    live_leaves: Leaves = object_leaves(current, type_id, status=part) if live else {}

    conflicts: list[tuple[Entry, Path]] = []
    for path, value in applied.items():
        if value == ITEM or path not in live_leaves or live_leaves[path] == value:
            continue
        conflicts.extend(
            (entry, path) for entry in entries if entry.manager != manager and path in entry.fields
        )
    if conflicts and not force:
        raise _conflict_error(conflicts)
    for entry, path in conflicts:
        entry.fields.discard(path)

    merged = _merge(current, config, Ref(type_id) if type_id else None)
    mine = _entry(entries, manager, "Apply", subresource)
    if mine is None:
        mine = Entry(manager, "Apply", kind.api_version, now, subresource=subresource)
        entries.append(mine)
    others: set[Path] = set().union(*(entry.fields for entry in entries if entry is not mine))
    dropped = mine.fields - set(applied)
    for path in sorted(dropped, key=len, reverse=True):
        # A field someone else also owns stays, and so does an item holding such a field.
        if not any(other[: len(path)] == path for other in others):
            remove(merged, path, type_id)
    assert isinstance(merged, dict)
    # An apply that changes nothing keeps the entry's time, so the object stays identical and
    # the write is no write at all (same resourceVersion, no watch event), as upstream.
    if (
        live is None
        or mine.fields != set(applied)
        or _without_entries(merged) != _without_entries(live)
    ):
        mine.time = now
    mine.fields = set(applied)
    mine.api_version = kind.api_version
    write_entries(merged, entries)
    return merged


def _without_entries(obj: JSONDict) -> JSONDict:
    meta = {k: v for k, v in metadata(obj).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


# --- other writes --------------------------------------------------------------------------------

_MISSING = object()


def track_update(
    kind: ResourceKind,
    old: JSONDict,
    new: JSONDict,
    *,
    manager: str,
    subresource: str,
    now: str,
) -> None:
    """Record a non-apply write in `new`'s managedFields (only once an object has them): the
    writer takes over the fields it changed, and removed fields leave every manager."""
    entries = read_entries(new)
    if not entries:
        return
    type_id = _type_id(kind)
    part = _status_part(kind, subresource)
    before = object_leaves(old, type_id, status=part)
    after = object_leaves(new, type_id, status=part)
    changed = {path for path, value in after.items() if before.get(path, _MISSING) != value}
    removed = set(before) - set(after)
    if not changed and not removed:
        return
    for entry in entries:
        entry.fields -= changed | removed
    mine = _entry(entries, manager, "Update", subresource)
    if mine is None:
        mine = Entry(manager, "Update", kind.api_version, now, subresource=subresource)
        entries.append(mine)
    mine.fields |= changed
    mine.time = now
    write_entries(new, entries)
