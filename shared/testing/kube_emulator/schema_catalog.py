"""The schemas of the served kinds: Kubernetes' own, read from kubernetes-validate, and the
NodeResourceTopology CRD's, written here.

The built-in kinds (pods, nodes, namespaces, quotas, config maps, both Event versions,
bindings) and every type they reach come from the API definitions kubernetes-validate ships for
the version the emulator reports (discovery.KUBERNETES_VERSION), in JSON Schema form: fields,
descriptions, required fields, formats and list semantics are the API server's, and every type
is closed, as the API server's are. Written by hand, because those definitions do not hold it:

- NodeResourceTopology: a CRD (of the NFD topology-updater), not a built-in type;
- the OpenAPI form of the named scalars (Quantity, IntOrString, Time, ...): the JSON Schema
  conversion turned them into `oneOf`s of nullable types, where kubectl reads the API server's
  `format: int-or-string` or `x-kubernetes-int-or-string`;
- the defaults of list-map keys (a container port's protocol is TCP): the conversion drops
  defaults, and server-side apply needs them to tell list items apart.

Should a kubernetes-validate release stop shipping KUBERNETES_VERSION, the import fails here:
move KUBERNETES_VERSION to a version it ships.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import orjson

from .discovery import KUBERNETES_VERSION
from .schema import (
    PRIMITIVES,
    Catalog,
    Field,
    ListOf,
    MapOf,
    ObjectType,
    Primitive,
    Ref,
    SchemaError,
    TypeExpr,
)

CATALOG = Catalog()

# The API packages the served kinds reach: definition prefix -> (catalog package, Go alias).
_PACKAGES = {
    "io.k8s.api.core.v1": ("core", "v1"),
    "io.k8s.api.events.v1": ("events", "v1"),
    "io.k8s.apimachinery.pkg.apis.meta.v1": ("meta", "v1"),
    "io.k8s.apimachinery.pkg.api.resource": ("resource", "resource"),
    "io.k8s.apimachinery.pkg.util.intstr": ("intstr", "intstr"),
}
SERVED = (
    "io.k8s.api.core.v1.Pod",
    "io.k8s.api.core.v1.Node",
    "io.k8s.api.core.v1.Namespace",
    "io.k8s.api.core.v1.ResourceQuota",
    "io.k8s.api.core.v1.ConfigMap",
    "io.k8s.api.core.v1.Binding",
    "io.k8s.api.core.v1.Event",
    "io.k8s.api.events.v1.Event",
)
"""The built-in kinds the emulator serves (Binding: the body of pods/binding)."""

# The named scalars, in the form the API server's OpenAPI documents give them:
# definition -> (JSON types a value may have, v2 schema, v3 schema).
_SCALARS: dict[str, tuple[frozenset[str], dict[str, object], dict[str, object]]] = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": (
        frozenset({"string", "integer", "number"}),
        {"type": "string"},
        {"oneOf": [{"type": "string"}, {"type": "number"}]},
    ),
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": (
        frozenset({"string", "integer"}),
        {"type": "string", "format": "int-or-string"},
        {"x-kubernetes-int-or-string": True},
    ),
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": (
        frozenset({"string"}),
        {"type": "string", "format": "date-time"},
        {"type": "string", "format": "date-time"},
    ),
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": (
        frozenset({"string"}),
        {"type": "string", "format": "date-time"},
        {"type": "string", "format": "date-time"},
    ),
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": (
        frozenset({"object"}),
        {"type": "object"},
        {"type": "object"},
    ),
    # The body of every PATCH operation (not reached from a kind's fields).
    "io.k8s.apimachinery.pkg.apis.meta.v1.Patch": (
        frozenset({"object", "array"}),
        {"type": "object"},
        {"type": "object"},
    ),
}

_DESCRIPTIONS = {
    "io.k8s.apimachinery.pkg.api.resource.Quantity": (
        "A fixed-point number with an optional SI or binary suffix, such as 100m, 2 or 4Gi."
    ),
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": "Either an integer or a string.",
}
"""Descriptions of the scalars whose definitions lost theirs in the conversion (a `oneOf`)."""

_KEY_DEFAULTS = {"io.k8s.api.core.v1.ContainerPort": {"protocol": "TCP"}}
"""Defaults of list-map key fields, by the item's definition."""

# (JSON type, format) -> the primitive of schema.py.
_PRIMITIVE_NAMES = {
    ("string", None): "string",
    ("string", "byte"): "byte",
    ("integer", "int32"): "int32",
    ("integer", "int64"): "int64",
    ("integer", None): "int64",
    ("boolean", None): "boolean",
    ("number", "double"): "double",
    ("number", None): "double",
}


def _definitions() -> dict[str, Any]:
    """kubernetes-validate's definitions for KUBERNETES_VERSION, by definition name. Read as
    package data: the package itself is not imported (its validator pulls in jsonschema,
    which the emulator does not use)."""
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        raise SchemaError("kubernetes-validate is not installed: the emulator reads its schemas")
    major, minor = KUBERNETES_VERSION
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "kubernetes-json-schema"
        / f"v{major}.{minor}.0-local"
        / "_definitions.json"
    )
    if not path.is_file():
        raise SchemaError(f"kubernetes-validate ships no schemas of Kubernetes {major}.{minor}")
    definitions: dict[str, Any] = orjson.loads(path.read_bytes())["$defs"]
    return definitions


def _split(definition: str) -> tuple[str, str, str]:
    """(catalog package, Go alias, name) of a definition name."""
    prefix, _, name = definition.rpartition(".")
    if prefix not in _PACKAGES:
        raise SchemaError(f"{definition}: a package the catalog does not know")
    package, alias = _PACKAGES[prefix]
    return package, alias, name


def _type_id(definition: str) -> str:
    package, _, name = _split(definition)
    return f"{package}.{name}"


def _target(schema: dict[str, Any]) -> str:
    return str(schema["$ref"]).rpartition("/")[2]


def _json_type(schema: dict[str, Any], where: str) -> str:
    """The JSON type a property schema names (`["string", "null"]` is a string)."""
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else list(declared or [])
    types = [t for t in types if t != "null"]
    if len(types) != 1:
        raise SchemaError(f"{where}: no single type in {schema}")
    return str(types[0])


def _expr(schema: dict[str, Any], where: str, pending: list[str]) -> TypeExpr:
    """The type expression of a property schema; the definitions it names join `pending`."""
    if "$ref" in schema:
        pending.append(_target(schema))
        return Ref(_type_id(_target(schema)))
    json_type = _json_type(schema, where)
    if json_type == "array":
        items = schema["items"]
        list_type = schema.get("x-kubernetes-list-type", "atomic")
        if list_type not in ("atomic", "set", "map"):
            raise SchemaError(f"{where}: list type {list_type!r}")
        keys = tuple(schema.get("x-kubernetes-list-map-keys", ()))
        defaults = _KEY_DEFAULTS.get(_target(items), {}) if "$ref" in items else {}
        return ListOf(
            _expr(items, f"{where}[]", pending),
            list_type,
            keys,
            {k: v for k, v in defaults.items() if k in keys},
            schema.get("x-kubernetes-patch-strategy", ""),
            schema.get("x-kubernetes-patch-merge-key", ""),
        )
    if json_type == "object":
        values = schema.get("additionalProperties")
        if not isinstance(values, dict):
            raise SchemaError(f"{where}: an object with neither a definition nor values")
        return MapOf(_expr(values, f"{where}{{}}", pending))
    name = _PRIMITIVE_NAMES.get((json_type, schema.get("format")))
    if name is None:
        raise SchemaError(f"{where}: no primitive for {json_type} {schema.get('format')}")
    primitive: Primitive = PRIMITIVES[name]
    return primitive


def _load(definitions: dict[str, Any]) -> None:
    """Every type the served kinds reach, and the named scalars, into CATALOG."""
    served = set(SERVED)
    pending = [*SERVED, *_SCALARS]
    done: set[str] = set()
    while pending:
        definition = pending.pop()
        if definition in done:
            continue
        done.add(definition)
        source = definitions[definition]
        package, alias, name = _split(definition)
        type_id = f"{package}.{name}"
        description = str(source.get("description") or _DESCRIPTIONS.get(definition, ""))
        if definition in _SCALARS:
            accepts, v2, v3 = _SCALARS[definition]
            package_of = CATALOG.package(package, definition.rpartition(".")[0], alias)
            package_of.scalar(name, description, accepts, v2, v3)
            continue
        if "properties" not in source:
            raise SchemaError(f"{definition}: neither an object nor a known scalar")
        fields = {
            key: Field(
                key,
                _expr(prop, f"{definition}.{key}", pending),
                str(prop.get("description", "")),
            )
            for key, prop in source["properties"].items()
        }
        gvk = None
        if definition in served:
            (entry,) = source["x-kubernetes-group-version-kind"]
            gvk = (entry["group"], entry["version"], entry["kind"])
        CATALOG.define(
            ObjectType(
                type_id,
                definition,
                f"{alias}.{name}",
                description,
                fields,
                tuple(source.get("required", ())),
                gvk=gvk,
            )
        )


_load(_definitions())

# --- NodeResourceTopology (a CRD upstream: its schema is its only validation) -----------------

nrt = CATALOG.package("nrt", "io.k8s.node.topology.v1alpha2", "v1alpha2")
_API_VERSION = ("string", "The versioned schema of this representation of an object.")
_KIND = ("string", "The REST resource this object represents, in CamelCase.")
_METADATA = ("meta.ObjectMeta", "Standard object metadata.")

nrt.struct(
    "NodeResourceTopology",
    "The NUMA zones of a node and the resources available in each.",
    {
        "apiVersion": _API_VERSION,
        "kind": _KIND,
        "metadata": _METADATA,
        "topologyPolicies": ("[]string", "Deprecated: the node's topology manager policy."),
        "zones": ("[]Zone", "The node's zones (NUMA nodes)."),
        "attributes": ("[]AttributeInfo", "Node-wide attributes (topologyManagerPolicy...)."),
    },
    required=("zones",),
    gvk=("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology"),
)
nrt.struct(
    "Zone",
    "One topology zone, such as a NUMA node.",
    {
        "name": ("string", "The zone's name, such as node-0."),
        "type": ("string", "The zone's kind, such as Node."),
        "parent": ("string", "The enclosing zone, if any."),
        "costs": ("[]CostInfo", "Distances to the other zones."),
        "attributes": ("[]AttributeInfo", "Attributes of the zone."),
        "resources": ("[]ResourceInfo", "The resources in the zone."),
    },
    required=("name", "type"),
)
nrt.struct(
    "CostInfo",
    "The distance to another zone.",
    {"name": "string", "value": "int64"},
    required=("name", "value"),
)
nrt.struct(
    "AttributeInfo",
    "A named attribute.",
    {"name": "string", "value": "string"},
    required=("name", "value"),
)
nrt.struct(
    "ResourceInfo",
    "The amounts of one resource in a zone.",
    {
        "name": ("string", "The resource's name (cpu, memory, nvidia.com/gpu...)."),
        "capacity": ("resource.Quantity", "All of it."),
        "allocatable": ("resource.Quantity", "What pods may use."),
        "available": ("resource.Quantity", "What is not in use."),
    },
    required=("name", "capacity", "allocatable", "available"),
)

CATALOG.finish()
