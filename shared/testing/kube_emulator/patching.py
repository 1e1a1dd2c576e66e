"""The three PATCH flavours the API server accepts for built-in types, as pure functions.

- JSON merge patch (RFC 7386): the `json-merge-patch` library's `merge`.
- JSON patch (RFC 6902): the `jsonpatch` library (add, remove, replace, move, copy, test).
- Strategic merge patch: written here, as no maintained Python library implements it (upstream
  it lives in Go, in apimachinery, and reads the list semantics from the Go types' struct tags;
  Python clients only send such patches). It is merge patch plus the list semantics of the
  core/v1 types' patch strategies: a table names the lists that merge by a key (containers by
  `name`, conditions by `type`, ...) and the primitive lists that merge as sets (finalizers).
  Every other list is replaced. The `$patch: delete|replace` and `$deleteFromPrimitiveList/`
  directives are honoured; ordering directives (`$setElementOrder/`, `$retainKeys`) are
  accepted and ignored.

Each function takes ownership of its arguments (callers pass copies) and returns the result;
a patch that cannot apply raises `PatchError`, whichever library refused it.
"""

from __future__ import annotations

from typing import Any

import json_merge_patch
import jsonpatch
import jsonpointer

from .objects import JSONDict, copy_json


class PatchError(ValueError):
    """A patch that cannot be applied to the object; the API server answers 422."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (`target` is merged into in place when it is an object)."""
    return json_merge_patch.merge(target, patch)


# Lists of core/v1 objects with patchStrategy "merge": field name -> patchMergeKey.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "resourceClaims": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
}

# Lists of scalars with patchStrategy "merge": the patch's items are added as to a set.
SET_LISTS = frozenset({"finalizers"})

_DELETE_FROM = "$deleteFromPrimitiveList/"


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch over core/v1 objects (see the module docstring for the scope)."""
    if not isinstance(patch, dict):
        return patch
    directive = patch.get("$patch")
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise PatchError(f"unknown patch directive in a map: $patch: {directive}")
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(_DELETE_FROM):
            field = key[len(_DELETE_FROM) :]
            doomed = set(map(_hashable, value)) if isinstance(value, list) else set()
            kept = [item for item in result.get(field) or [] if _hashable(item) not in doomed]
            result[field] = kept
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            if value.get("$patch") == "delete":
                result.pop(key, None)
            else:
                result[key] = strategic_merge_patch(result.get(key), value)
        elif isinstance(value, list) and key in MERGE_KEYS:
            current = result.get(key)
            result[key] = _merge_keyed_list(
                current if isinstance(current, list) else [], value, MERGE_KEYS[key]
            )
        elif isinstance(value, list) and key in SET_LISTS:
            current = result.get(key)
            merged = list(current) if isinstance(current, list) else []
            merged += [item for item in value if item not in merged]
            result[key] = merged
        else:
            result[key] = _strip_directives(value)
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            _strip_directives(item)
            for item in patch
            if not (isinstance(item, dict) and item.get("$patch") == "replace")
        ]
    result = list(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map: {item} does not contain declared merge key: {merge_key}")
        index = next(
            (
                position
                for position, existing in enumerate(result)
                if isinstance(existing, dict) and existing.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append(_strip_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return value


def _hashable(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else repr(value)


def json_patch(document: JSONDict, operations: list[Any]) -> Any:
    """RFC 6902 JSON patch, applied in place; an operation that cannot apply fails the whole
    patch (the caller drops the partly patched copy)."""
    try:
        return jsonpatch.apply_patch(document, operations, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise PatchError(f"invalid JSON patch: {exc}") from None


def copy_value(value: Any) -> Any:
    return copy_json({"v": value})["v"]
