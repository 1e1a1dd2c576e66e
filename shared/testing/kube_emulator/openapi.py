"""The OpenAPI documents kubectl reads: v3 per group-version, and v2 (JSON or protobuf).

kubectl uses them three ways. `apply`, `create` and `replace` check that the PATCH operation of
the object's kind (found by its `x-kubernetes-group-version-kind`) takes a `fieldValidation`
query parameter; then they leave validation to the server (field_validation.py), and without
one they validate against the v2 definitions themselves. `explain` walks the v3 schemas. Older
kubectl versions check `dryRun` the same way before `--dry-run=server` and `diff`.

Both documents are generated from schema_catalog.py and resources.ALL, once (they are static),
and list only what the emulator serves:

    GET /openapi/v3                   {"paths": {"api/v1": {"serverRelativeURL": ...}, ...}}
    GET /openapi/v3/api/v1            one group-version: its paths and components.schemas
    GET /openapi/v3/apis/{g}/{v}
    GET /openapi/v2                   everything; protobuf when asked for (openapi_proto.py)
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING, Literal

import orjson

from .discovery import KUBERNETES_VERSION
from .resources import ALL, ResourceKind
from .schema import ListOf, MapOf, ObjectType, Primitive, Ref, ScalarType
from .schema_catalog import CATALOG

if TYPE_CHECKING:
    from .objects import JSONDict
    from .schema import Field, TypeExpr

Flavour = Literal["v2", "v3"]

_REF_PREFIX: dict[Flavour, str] = {"v2": "#/definitions/", "v3": "#/components/schemas/"}

# Query parameters per operation: what kubectl's verifiers look for, and what the server takes.
_WRITE_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation")
_OPERATION_PARAMETERS: dict[str, tuple[str, ...]] = {
    "list": (
        "labelSelector",
        "fieldSelector",
        "limit",
        "resourceVersion",
        "timeoutSeconds",
        "watch",
        "allowWatchBookmarks",
    ),
    "get": (),
    "post": _WRITE_PARAMETERS,
    "put": _WRITE_PARAMETERS,
    "patch": (*_WRITE_PARAMETERS, "force"),
    "delete": ("dryRun", "gracePeriodSeconds", "propagationPolicy"),
}
_PARAMETER_DESCRIPTIONS = {
    "dryRun": "All: validate and answer as if the request were made, but store nothing.",
    "fieldManager": "The name of the actor making the change (for managedFields).",
    "fieldValidation": "Ignore, Warn (the default) or Strict: what to do with unknown fields.",
    "force": "Apply requests only: take over fields other managers own.",
    "labelSelector": "Only objects whose labels match.",
    "fieldSelector": "Only objects whose fields match.",
    "limit": "Accepted; every match is returned at once.",
    "resourceVersion": "The version a list or watch starts from.",
    "timeoutSeconds": "When the server ends a watch.",
    "watch": "Stream changes instead of answering a list.",
    "allowWatchBookmarks": "Let the watch send BOOKMARK events.",
    "gracePeriodSeconds": "Accepted; objects are deleted at once.",
    "propagationPolicy": "Accepted; dependents are not collected.",
}
_PARAMETER_TYPES = {
    "limit": "integer",
    "timeoutSeconds": "integer",
    "gracePeriodSeconds": "integer",
    "watch": "boolean",
    "allowWatchBookmarks": "boolean",
    "force": "boolean",
}
_PATCH_TYPES = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
]


# --- schemas -------------------------------------------------------------------------------------


def _ref(flavour: Flavour, target: str) -> JSONDict:
    return {"$ref": _REF_PREFIX[flavour] + CATALOG.get(target).definition}


def type_schema(flavour: Flavour, expr: TypeExpr) -> JSONDict:
    if isinstance(expr, Primitive):
        schema: JSONDict = {"type": expr.type}
        if expr.format:
            schema["format"] = expr.format
        return schema
    if isinstance(expr, Ref):
        return _ref(flavour, expr.target)
    if isinstance(expr, MapOf):
        return {"type": "object", "additionalProperties": type_schema(flavour, expr.values)}
    schema = {"type": "array", "items": type_schema(flavour, expr.items)}
    schema["x-kubernetes-list-type"] = expr.list_type
    if expr.list_type == "map":
        schema["x-kubernetes-list-map-keys"] = list(expr.keys)
    if expr.patch_merge_key:
        schema["x-kubernetes-patch-merge-key"] = expr.patch_merge_key
    if expr.patch_strategy:
        schema["x-kubernetes-patch-strategy"] = expr.patch_strategy
    return schema


def _field_schema(flavour: Flavour, field: Field) -> JSONDict:
    schema = type_schema(flavour, field.type)
    if not field.description:
        return schema
    if "$ref" in schema and flavour == "v3":
        # OpenAPI 3.0 ignores a $ref's siblings: the description needs the allOf wrapper.
        return {"description": field.description, "allOf": [schema]}
    return {"description": field.description, **schema}


def definition(flavour: Flavour, named: ObjectType | ScalarType) -> JSONDict:
    if isinstance(named, ScalarType):
        return {"description": named.description, **(named.v2 if flavour == "v2" else named.v3)}
    schema: JSONDict = {"description": named.description, "type": "object"}
    # v2 readers (kubectl's client-side validation) refuse unknown fields wherever properties
    # are listed, so an open type shows them only in v3, where the extension is understood.
    if not named.open or flavour == "v3":
        schema["properties"] = {
            name: _field_schema(flavour, field) for name, field in named.fields.items()
        }
        if named.required:
            schema["required"] = list(named.required)
    if named.open:
        schema["x-kubernetes-preserve-unknown-fields"] = True
    if named.gvk is not None:
        group, version, kind = named.gvk
        schema["x-kubernetes-group-version-kind"] = [
            {"group": group, "kind": kind, "version": version}
        ]
    return schema


def _reachable(roots: list[str]) -> list[str]:
    """The type ids the roots refer to, transitively, roots included (sorted)."""
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        type_id = pending.pop()
        if type_id in seen:
            continue
        seen.add(type_id)
        named = CATALOG.get(type_id)
        if isinstance(named, ObjectType):
            for field in named.fields.values():
                pending.extend(_refs(field.type))
    return sorted(seen)


def _refs(expr: TypeExpr) -> list[str]:
    if isinstance(expr, Ref):
        return [expr.target]
    if isinstance(expr, ListOf):
        return _refs(expr.items)
    if isinstance(expr, MapOf):
        return _refs(expr.values)
    return []


# --- paths ---------------------------------------------------------------------------------------


def _schema_of(kind: ResourceKind) -> ObjectType:
    found = CATALOG.by_gvk(kind.group, kind.version, kind.kind)
    if found is None:
        raise LookupError(f"no schema for {kind.api_version} {kind.kind}")
    return found


def _prefix(kind: ResourceKind) -> str:
    return "/api/v1" if not kind.group else f"/apis/{kind.group}/{kind.version}"


def _parameter(flavour: Flavour, name: str, where: str = "query") -> JSONDict:
    parameter_type = _PARAMETER_TYPES.get(name, "string")
    parameter: JSONDict = {
        "name": name,
        "in": where,
        "description": _PARAMETER_DESCRIPTIONS.get(name, f"The {name} of the object."),
    }
    if where == "path":
        parameter["required"] = True
    if flavour == "v2":
        parameter["type"] = parameter_type
    else:
        parameter["schema"] = {"type": parameter_type}
    return parameter


def _operation(
    flavour: Flavour,
    verb: str,
    action: str,
    gvk: tuple[str, str, str],
    response: str,
    body: str | None,
    path_parameters: tuple[str, ...],
    operation_id: str,
) -> JSONDict:
    group, version, kind = gvk
    parameters = [_parameter(flavour, name, "path") for name in path_parameters]
    parameters += [_parameter(flavour, name) for name in _OPERATION_PARAMETERS[verb]]
    content_types = _PATCH_TYPES if verb == "patch" else ["application/json"]
    ok = {"description": "OK"}
    operation: JSONDict = {"operationId": operation_id, "parameters": parameters}
    if flavour == "v2":
        if body is not None:
            parameters.append(
                {"name": "body", "in": "body", "required": True, "schema": _ref(flavour, body)}
            )
            operation["consumes"] = content_types
        operation["produces"] = ["application/json"]
        operation["responses"] = {"200": {**ok, "schema": _ref(flavour, response)}}
    else:
        if body is not None:
            operation["requestBody"] = {
                "content": {t: {"schema": _ref(flavour, body)} for t in content_types},
                "required": True,
            }
        operation["responses"] = {
            "200": {**ok, "content": {"application/json": {"schema": _ref(flavour, response)}}}
        }
    operation["x-kubernetes-action"] = action
    operation["x-kubernetes-group-version-kind"] = {
        "group": group,
        "kind": kind,
        "version": version,
    }
    return operation


def _paths(flavour: Flavour, kinds: list[ResourceKind]) -> JSONDict:
    paths: JSONDict = {}
    for kind in kinds:
        schema = _schema_of(kind)
        assert schema.gvk is not None
        gvk, type_id = schema.gvk, schema.id
        base = _prefix(kind)
        scope = "/namespaces/{namespace}" if kind.namespaced else ""
        scope_parameters: tuple[str, ...] = ("namespace",) if kind.namespaced else ()
        item_parameters = ("name", *scope_parameters)
        title = kind.kind
        collection = f"{base}{scope}/{kind.plural}"
        item = f"{collection}/{{name}}"

        def operation(
            verb: str,
            action: str,
            response: str,
            body: str | None,
            parameters: tuple[str, ...],
            operation_id: str,
            gvk: tuple[str, str, str] = gvk,
        ) -> JSONDict:
            return _operation(flavour, verb, action, gvk, response, body, parameters, operation_id)

        paths[collection] = {
            "get": operation("list", "list", type_id, None, scope_parameters, f"list{title}"),
            "post": operation("post", "post", type_id, type_id, scope_parameters, f"create{title}"),
        }
        if kind.namespaced:
            paths[f"{base}/{kind.plural}"] = {
                "get": operation("list", "list", type_id, None, (), f"list{title}ForAllNamespaces")
            }
        paths[item] = {
            "get": operation("get", "get", type_id, None, item_parameters, f"read{title}"),
            "put": operation("put", "put", type_id, type_id, item_parameters, f"replace{title}"),
            "patch": operation(
                "patch", "patch", type_id, "meta.Patch", item_parameters, f"patch{title}"
            ),
            "delete": operation(
                "delete", "delete", type_id, None, item_parameters, f"delete{title}"
            ),
        }
        if "status" in kind.subresources:
            paths[f"{item}/status"] = {
                "get": operation(
                    "get", "get", type_id, None, item_parameters, f"read{title}Status"
                ),
                "put": operation(
                    "put", "put", type_id, type_id, item_parameters, f"replace{title}Status"
                ),
                "patch": operation(
                    "patch",
                    "patch",
                    type_id,
                    "meta.Patch",
                    item_parameters,
                    f"patch{title}Status",
                ),
            }
        if "binding" in kind.subresources:
            paths[f"{item}/binding"] = {
                "post": operation(
                    "post",
                    "post",
                    "core.Binding",
                    "core.Binding",
                    item_parameters,
                    f"create{title}Binding",
                    ("", "v1", "Binding"),
                )
            }
    return paths


def _served_kinds(api_version: str | None = None) -> list[ResourceKind]:
    return [kind for kind in ALL if api_version is None or kind.api_version == api_version]


def _roots(kinds: list[ResourceKind]) -> list[str]:
    roots = [_schema_of(kind).id for kind in kinds]
    if any("binding" in kind.subresources for kind in kinds):
        roots.append("core.Binding")
    return [*roots, "meta.Patch"]


def _info() -> JSONDict:
    major, minor = KUBERNETES_VERSION
    return {"title": "Kubernetes", "version": f"v{major}.{minor}.0"}


# --- documents -----------------------------------------------------------------------------------


def group_versions() -> list[str]:
    """The v3 paths: `api/v1` and `apis/{group}/{version}` for every served group-version."""
    versions = sorted({kind.api_version for kind in ALL})
    return [f"api/{v}" if "/" not in v else f"apis/{v}" for v in versions]


@functools.cache
def v3_document(path: str) -> bytes | None:
    """The v3 document of one group-version path (`api/v1`), serialised, or None."""
    if path not in group_versions():
        return None
    api_version = path.removeprefix("api/").removeprefix("apis/")
    kinds = _served_kinds(api_version)
    schemas = {
        CATALOG.get(type_id).definition: definition("v3", CATALOG.get(type_id))
        for type_id in _reachable(_roots(kinds))
    }
    document = {
        "openapi": "3.0.0",
        "info": _info(),
        "paths": _paths("v3", kinds),
        "components": {"schemas": schemas},
    }
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS)


@functools.cache
def v3_index() -> bytes:
    """The v3 discovery document; each URL carries its document's hash, as upstream does, so
    clients that cache by URL (kubectl does, on disk) see a new URL when the schema changes."""
    paths = {}
    for path in group_versions():
        document = v3_document(path)
        assert document is not None
        digest = hashlib.sha512(document).hexdigest().upper()
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return orjson.dumps({"paths": paths})


@functools.cache
def v2_json() -> JSONDict:
    kinds = _served_kinds()
    definitions = {
        CATALOG.get(type_id).definition: definition("v2", CATALOG.get(type_id))
        for type_id in _reachable(_roots(kinds))
    }
    return {
        "swagger": "2.0",
        "info": _info(),
        "paths": _paths("v2", kinds),
        "definitions": definitions,
    }


@functools.cache
def v2_bytes() -> bytes:
    return orjson.dumps(v2_json(), option=orjson.OPT_SORT_KEYS)
