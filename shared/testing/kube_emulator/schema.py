"""A small type model of the served kinds, and a compact notation to write types by hand in.

schema_catalog.py fills it from the Kubernetes API's own definitions (as kubernetes-validate
ships them) and writes in the notation only what those do not hold (NodeResourceTopology, a
CRD). One description serves four readers: the OpenAPI v2 and v3 documents kubectl validates and
explains with (openapi.py), the server's own field validation and pruning (field_validation.py),
and server-side apply's list semantics (apply.py). A field's type is written as a short string:

    string  int32  int64  boolean  double  byte      primitives (byte: base64 in a string)
    Name  or  pkg.Name                                 a named type (same package, then meta, core)
    []T                                                an atomic list: replaced as a whole
    []T@set                                            a list of unique scalars (finalizers)
    []T@key1,key2=default                              a list map: items identified by the keys
    {}T                                                a map with string keys

A named object is either closed (every field listed; anything else is an unknown field, pruned
or refused like the API server does) or open (x-kubernetes-preserve-unknown-fields: its listed
fields are typed, the rest is kept as sent). Kubernetes' own definitions are closed throughout;
open stays in the model for a CRD that preserves unknown fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping


@dataclass(frozen=True, slots=True)
class Primitive:
    type: Literal["string", "integer", "boolean", "number"]
    format: str = ""
    go: str = ""
    """The Go type a decode error names (`json: cannot unmarshal ... of type int32`)."""


@dataclass(frozen=True, slots=True)
class Ref:
    target: str
    """The id of a named type in the catalog (`core.PodSpec`)."""


@dataclass(frozen=True, slots=True)
class ListOf:
    items: TypeExpr
    list_type: Literal["atomic", "set", "map"] = "atomic"
    keys: tuple[str, ...] = ()
    key_defaults: Mapping[str, str] = field(default_factory=dict)
    """Key fields the API server defaults (a container port's protocol is TCP)."""
    patch_strategy: str = ""
    """The list's strategic-merge-patch strategy as the OpenAPI documents state it (`merge`)."""
    patch_merge_key: str = ""
    """The field a strategic merge patch matches items by, where it merges them."""


@dataclass(frozen=True, slots=True)
class MapOf:
    values: TypeExpr


TypeExpr = Primitive | Ref | ListOf | MapOf

PRIMITIVES: dict[str, Primitive] = {
    "string": Primitive("string", go="string"),
    "byte": Primitive("string", "byte", go="[]uint8"),
    "int32": Primitive("integer", "int32", go="int32"),
    "int64": Primitive("integer", "int64", go="int64"),
    "boolean": Primitive("boolean", go="bool"),
    "double": Primitive("number", "double", go="float64"),
}


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: TypeExpr
    description: str = ""


@dataclass(frozen=True, slots=True)
class ObjectType:
    """A named object: a struct of the API, or the top-level schema of a kind."""

    id: str
    definition: str
    """Its OpenAPI definition name (`io.k8s.api.core.v1.Pod`)."""
    go_name: str
    description: str
    fields: Mapping[str, Field]
    required: tuple[str, ...] = ()
    open: bool = False
    gvk: tuple[str, str, str] | None = None
    """(group, version, kind) for the top-level schema of a served kind."""


@dataclass(frozen=True, slots=True)
class ScalarType:
    """A named type that is not a struct on the wire (Quantity, Time, IntOrString, FieldsV1)."""

    id: str
    definition: str
    go_name: str
    description: str
    accepts: frozenset[str]
    """The JSON types a value may have (a quantity may be written as a number)."""
    v2: Mapping[str, object]
    v3: Mapping[str, object]


NamedType = ObjectType | ScalarType

FieldSpec = str | tuple[str, str]
"""A field's type expression, optionally with its description."""


class SchemaError(ValueError):
    """A malformed entry in the catalog, or a definition it cannot read, found at import."""


@dataclass
class Package:
    catalog: Catalog
    name: str
    prefix: str
    """The OpenAPI definition prefix (`io.k8s.api.core.v1`)."""
    go_alias: str

    def struct(
        self,
        name: str,
        description: str,
        fields: Mapping[str, FieldSpec],
        *,
        required: tuple[str, ...] = (),
        open: bool = False,
        gvk: tuple[str, str, str] | None = None,
    ) -> None:
        self.catalog.pending.append((self, name, description, fields, required, open, gvk))

    def scalar(
        self,
        name: str,
        description: str,
        accepts: frozenset[str],
        v2: Mapping[str, object],
        v3: Mapping[str, object] | None = None,
    ) -> None:
        type_id = f"{self.name}.{name}"
        self.catalog.types[type_id] = ScalarType(
            type_id,
            f"{self.prefix}.{name}",
            f"{self.go_alias}.{name}",
            description,
            accepts,
            v2,
            v2 if v3 is None else v3,
        )


class Catalog:
    """Every named type, by id (`pkg.Name`); built once, at import, by schema_catalog.py."""

    def __init__(self) -> None:
        self.types: dict[str, NamedType] = {}
        self._by_gvk: dict[tuple[str, str, str], ObjectType] = {}
        self.pending: list[
            tuple[
                Package,
                str,
                str,
                Mapping[str, FieldSpec],
                tuple[str, ...],
                bool,
                tuple[str, str, str] | None,
            ]
        ] = []

    def package(self, name: str, prefix: str, go_alias: str) -> Package:
        return Package(self, name, prefix, go_alias)

    def define(self, named: NamedType) -> None:
        """A type already resolved (read from the API's definitions, not written by hand)."""
        self.types[named.id] = named
        if isinstance(named, ObjectType) and named.gvk is not None:
            self._by_gvk[named.gvk] = named

    def finish(self) -> None:
        """Resolve every pending object's field types; raises SchemaError on a dangling name."""
        names = {f"{package.name}.{name}" for package, name, *_ in self.pending} | set(self.types)
        for package, name, description, specs, required, is_open, gvk in self.pending:
            fields = {}
            for field_name, spec in specs.items():
                text, doc = (spec, "") if isinstance(spec, str) else spec
                fields[field_name] = Field(field_name, _parse(text, package.name, names), doc)
            for key in required:
                if key not in fields:
                    raise SchemaError(f"{package.name}.{name}: required {key!r} is not a field")
            type_id = f"{package.name}.{name}"
            self.types[type_id] = ObjectType(
                type_id,
                f"{package.prefix}.{name}",
                f"{package.go_alias}.{name}",
                description,
                fields,
                required,
                is_open,
                gvk,
            )
            if gvk is not None:
                self._by_gvk[gvk] = self.struct(type_id)
        self.pending.clear()

    def get(self, type_id: str) -> NamedType:
        return self.types[type_id]

    def struct(self, type_id: str) -> ObjectType:
        found = self.types[type_id]
        assert isinstance(found, ObjectType)
        return found

    def by_gvk(self, group: str, version: str, kind: str) -> ObjectType | None:
        """The top-level schema of a served kind."""
        return self._by_gvk.get((group, version, kind))

    def go_name(self, expr: TypeExpr) -> str:
        if isinstance(expr, Primitive):
            return expr.go
        if isinstance(expr, Ref):
            return self.types[expr.target].go_name
        if isinstance(expr, ListOf):
            return "[]" + self.go_name(expr.items)
        return "map[string]" + self.go_name(expr.values)


_SEARCH = ("meta", "core", "resource", "intstr")


def _parse(text: str, package: str, names: set[str]) -> TypeExpr:
    if text.startswith("[]"):
        item, _, semantics = text[2:].partition("@")
        items = _parse(item, package, names)
        if not semantics:
            return ListOf(items)
        if semantics == "set":
            return ListOf(items, "set", patch_strategy="merge")
        keys, defaults = [], {}
        for part in semantics.split(","):
            key, _, default = part.partition("=")
            keys.append(key)
            if default:
                defaults[key] = default
        return ListOf(items, "map", tuple(keys), defaults, "merge", keys[0])
    if text.startswith("{}"):
        return MapOf(_parse(text[2:], package, names))
    if text in PRIMITIVES:
        return PRIMITIVES[text]
    candidates = [text] if "." in text else [f"{package}.{text}", *(f"{p}.{text}" for p in _SEARCH)]
    for candidate in candidates:
        if candidate in names:
            return Ref(candidate)
    raise SchemaError(f"{package}: unknown type {text!r}")
