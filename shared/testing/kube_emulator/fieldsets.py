"""Field sets: which fields of an object a manager owns, in managedFields' FieldsV1 form.

A field is a path of segments as FieldsV1 writes them: `f:name` for a map key, `k:{"name":"x"}`
for the item of a list map (its key fields, as JSON with sorted keys), `v:"x"` for a member of
a set. An object flattens to its leaves (a scalar, an atomic list, an empty map) and its list
items, each with the value found there, so two versions of an object can be compared field by
field. The schema (schema_catalog.py) says which lists are maps, sets or atomic; where it says
nothing (open types), maps are granular and lists atomic, as for the API server's deduced types.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from .schema import ListOf, MapOf, ObjectType, Ref
from .schema_catalog import CATALOG

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .objects import JSONDict
    from .schema import TypeExpr

Path = tuple[str, ...]
Leaves = dict[Path, Any]

ITEM = "\x00item"
"""The value recorded for a list item itself: its presence, not its content."""

# Fields nobody owns: identity, server-written metadata and the bookkeeping itself.
_UNOWNED_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    }
)


def child_type(expr: TypeExpr | None, key: str) -> TypeExpr | None:
    """The type of `key` inside a value of type `expr` (None: not described)."""
    if isinstance(expr, MapOf):
        return expr.values
    if isinstance(expr, Ref):
        named = CATALOG.get(expr.target)
        if isinstance(named, ObjectType) and key in named.fields:
            return named.fields[key].type
    return None


def _dump(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def item_segment(item: Any, expr: ListOf) -> str | None:
    """The segment of one list item (None when it lacks the list's keys)."""
    if expr.list_type == "set":
        return "v:" + _dump(item)
    if not isinstance(item, dict):
        return None
    key = {}
    for name in expr.keys:
        value = item.get(name, expr.key_defaults.get(name))
        if value is None:
            return None
        key[name] = value
    return "k:" + _dump(key)


def leaves(value: Any, expr: TypeExpr | None, prefix: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every leaf and list item under `value`, with the value there."""
    if isinstance(value, dict):
        if not value and prefix:
            yield prefix, {}
        for key, item in value.items():
            yield from leaves(item, child_type(expr, key), (*prefix, "f:" + key))
        return
    if isinstance(value, list) and isinstance(expr, ListOf) and expr.list_type != "atomic":
        for item in value:
            segment = item_segment(item, expr)
            if segment is None:
                yield prefix, value  # not addressable item by item: own the list whole
                return
        for item in value:
            segment = item_segment(item, expr)
            assert segment is not None
            path = (*prefix, segment)
            if expr.list_type == "set":
                yield path, item
            else:
                yield path, ITEM
                yield from leaves(item, expr.items, path)
        return
    yield prefix, value


def object_leaves(obj: JSONDict, type_id: str | None, *, status: bool | None) -> Leaves:
    """The owned fields of a whole object: not apiVersion, kind or system metadata; the status
    only (status=True), everything but the status (False), or both (None)."""
    root = Ref(type_id) if type_id is not None else None
    found: Leaves = {}
    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if status is not None and (key == "status") != status:
            continue
        if key == "metadata" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in _UNOWNED_METADATA}
            if not value:
                continue
        found.update(leaves(value, child_type(root, key), ("f:" + key,)))
    return found


# --- FieldsV1 ------------------------------------------------------------------------------------


def to_fields_v1(paths: set[Path]) -> JSONDict:
    """The FieldsV1 trie of a set of paths: `.` marks a node that is owned and has children."""
    tree: JSONDict = {}
    for path in sorted(paths):
        node = tree
        for segment in path:
            node = node.setdefault(segment, {})
    for path in paths:
        node = tree
        for segment in path:
            node = node[segment]
        if node:
            node["."] = {}
    return tree


def from_fields_v1(tree: object, prefix: Path = ()) -> set[Path]:
    """The paths of a FieldsV1 trie (malformed parts are ignored: clients may write them)."""
    paths: set[Path] = set()
    if not isinstance(tree, dict):
        return paths
    for segment, node in tree.items():
        if segment == ".":
            if prefix:
                paths.add(prefix)
        elif isinstance(node, dict) and node:
            paths |= from_fields_v1(node, (*prefix, segment))
        else:
            paths.add((*prefix, segment))
    return paths


# --- changing objects by path --------------------------------------------------------------------


def remove(obj: JSONDict, path: Path, type_id: str | None) -> None:
    """Remove the field at `path` from `obj`, if it is there."""
    node: Any = obj
    expr: TypeExpr | None = Ref(type_id) if type_id is not None else None
    for position, segment in enumerate(path):
        last = position == len(path) - 1
        if segment.startswith("f:") and isinstance(node, dict):
            key = segment[2:]
            if key not in node:
                return
            if last:
                del node[key]
                return
            node, expr = node[key], child_type(expr, key)
        elif segment[:2] in ("k:", "v:") and isinstance(node, list) and isinstance(expr, ListOf):
            list_type = expr
            index = next(
                (i for i, item in enumerate(node) if item_segment(item, list_type) == segment),
                None,
            )
            if index is None:
                return
            if last:
                del node[index]
                return
            node, expr = node[index], list_type.items
        else:
            return
