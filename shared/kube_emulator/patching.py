"""The three PATCH flavours the API server accepts for built-in types, as pure functions.

- JSON merge patch (RFC 7386): objects merge recursively, `null` deletes, anything else replaces.
- Strategic merge patch: merge patch plus the list semantics of the core/v1 types' patch
  strategies. Upstream reads them from Go struct tags; here a table names the lists that merge by
  a key (containers by `name`, conditions by `type`, ...) and the primitive lists that merge as
  sets (finalizers). Every other list is replaced. The `$patch: delete|replace` and
  `$deleteFromPrimitiveList/` directives are honoured; ordering directives
  (`$setElementOrder/`, `$retainKeys`) are accepted and ignored.
- JSON patch (RFC 6902): add, remove, replace, move, copy, test.

Each function takes ownership of its arguments (callers pass copies) and returns the result.
"""

from __future__ import annotations

from typing import Any

from .objects import JSONDict, copy_json


class PatchError(ValueError):
    """A patch that cannot be applied to the object; the API server answers 422."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


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
    """RFC 6902 JSON patch; an operation that cannot apply fails the whole patch."""
    result: Any = document
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise PatchError(f"invalid JSON patch operation: {operation}")
        op, path = operation["op"], operation["path"]
        if op in ("add", "replace", "test") and "value" not in operation:
            raise PatchError(f'missing value for JSON patch operation "{op}" at {path}')
        if op == "add":
            result = _add(result, path, copy_value(operation["value"]))
        elif op == "remove":
            _remove(result, path)
        elif op == "replace":
            _remove(result, path)
            result = _add(result, path, copy_value(operation["value"]))
        elif op in ("move", "copy"):
            source = operation.get("from")
            if not isinstance(source, str):
                raise PatchError(f'missing from for JSON patch operation "{op}"')
            value = _get(result, source)
            if op == "move":
                _remove(result, source)
            result = _add(result, path, copy_value(value))
        elif op == "test":
            if _get(result, path) != operation["value"]:
                raise PatchError(f"testing value {path} failed")
        else:
            raise PatchError(f"unexpected JSON patch operation: {op}")
    return result


def copy_value(value: Any) -> Any:
    return copy_json({"v": value})["v"]


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer must start with '/': {path}")
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _parent(document: Any, path: str) -> tuple[Any, str]:
    tokens = _tokens(path)
    if not tokens:
        raise PatchError("the whole document cannot be the target here")
    node = document
    for token in tokens[:-1]:
        node = _step(node, token, path)
    return node, tokens[-1]


def _step(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list):
        return node[_index(node, token, path, allow_end=False)]
    raise PatchError(f"path not found: {path}")


def _index(node: list[Any], token: str, path: str, *, allow_end: bool) -> int:
    if allow_end and token == "-":
        return len(node)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r} in {path}")
    index = int(token)
    if index > len(node) or (index == len(node) and not allow_end):
        raise PatchError(f"array index out of bounds in {path}")
    return index


def _get(document: Any, path: str) -> Any:
    node = document
    for token in _tokens(path):
        node = _step(node, token, path)
    return node


def _add(document: Any, path: str, value: Any) -> Any:
    if path == "":
        return value
    parent, token = _parent(document, path)
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, path, allow_end=True), value)
    else:
        raise PatchError(f"path not found: {path}")
    return document


def _remove(document: Any, path: str) -> None:
    parent, token = _parent(document, path)
    if isinstance(parent, dict) and token in parent:
        del parent[token]
    elif isinstance(parent, list):
        del parent[_index(parent, token, path, allow_end=False)]
    else:
        raise PatchError(f"path not found: {path}")
