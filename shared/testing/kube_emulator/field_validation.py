"""Server-side field validation: unknown fields, wrongly typed values, and CRD schemas.

The API server decodes every body into its Go types, so a field the type lacks never reaches
storage: with `fieldValidation=Strict` the request fails (400, `strict decoding error: unknown
field "spec.containers[0].resourcs"`), with `Warn` (the default) it succeeds with one `Warning`
header per dropped field, with `Ignore` it is dropped silently. A value of the wrong JSON type
fails decoding whatever the directive (`json: cannot unmarshal string into Go struct field ...`).
For a custom resource the schema is the validation: wrong types and missing required fields are
422 Invalid. All of this is read from schema_catalog.py (Kubernetes' own definitions for the
built-in kinds); an open type, should the catalog have one, keeps what it does not list.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import errors
from .errors import FieldError, KubeError
from .schema import ListOf, MapOf, ObjectType, Primitive, Ref, ScalarType
from .schema_catalog import CATALOG

if TYPE_CHECKING:
    from .objects import JSONDict
    from .resources import ResourceKind
    from .schema import TypeExpr

Directive = Literal["Ignore", "Warn", "Strict"]
DIRECTIVES: tuple[Directive, ...] = ("Ignore", "Strict", "Warn")


@dataclass(frozen=True, slots=True)
class Mismatch:
    """A value whose JSON type its field does not take."""

    path: str
    """With indices, as field errors print it (`spec.containers[0].ports[0].containerPort`)."""
    go_field: str
    """As Go's decoder prints it (`ContainerPort.spec.containers.ports.containerPort`)."""
    json_type: str
    expected: str
    go_type: str


@dataclass
class Findings:
    unknown: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    """Values of the right JSON type that still do not decode (bad base64)."""


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# What Go's decoder calls a JSON value's type in its errors.
_GO_JSON_NAMES = {
    "boolean": "bool",
    "integer": "number",
    "number": "number",
    "string": "string",
    "array": "array",
    "object": "object",
}


def _fits(expected: str, json_type: str) -> bool:
    return json_type == expected or (expected == "number" and json_type == "integer")


class _Walker:
    """One pass over an object. The path is kept as a stack of segments (`.name`, `[0]`) and
    joined only when something is wrong: most objects are fine, and this runs on every write."""

    def __init__(self, prune: bool) -> None:
        self.prune = prune
        self.findings = Findings()
        self._segments: list[str] = []
        self._structs: list[str] = []

    def _path(self, last: str = "") -> str:
        return "".join([*self._segments, last]).lstrip(".")

    def _go_field(self) -> str:
        """The field as Go's decoder names it: innermost struct, then the dotted JSON path."""
        dotted = "".join(s for s in self._segments if s.startswith("."))
        return self._structs[-1] + dotted

    def walk(self, value: Any, expr: TypeExpr) -> None:
        if value is None:
            return  # null decodes to the zero value anywhere
        if isinstance(expr, Primitive):
            json_type = _json_type(value)
            if not _fits(expr.type, json_type):
                self._mismatch(json_type, expr.type, expr.go)
            elif expr.format == "byte" and not _is_base64(value):
                self.findings.undecodable.append(f"{self._path()}: illegal base64 data")
        elif isinstance(expr, ListOf):
            if not isinstance(value, list):
                self._mismatch(_json_type(value), "array", CATALOG.go_name(expr))
                return
            for index, item in enumerate(value):
                self._segments.append(f"[{index}]")
                self.walk(item, expr.items)
                self._segments.pop()
        elif isinstance(expr, MapOf):
            if not isinstance(value, dict):
                self._mismatch(_json_type(value), "object", CATALOG.go_name(expr))
                return
            for key, item in value.items():
                self._segments.append(f"[{key}]")
                self.walk(item, expr.values)
                self._segments.pop()
        else:
            self._named(value, expr)

    def _named(self, value: Any, expr: Ref) -> None:
        named = CATALOG.get(expr.target)
        if isinstance(named, ScalarType):
            json_type = _json_type(value)
            if json_type not in named.accepts:
                expected = "string" if "string" in named.accepts else sorted(named.accepts)[0]
                self._mismatch(json_type, expected, named.go_name)
            return
        if not isinstance(value, dict):
            self._mismatch(_json_type(value), "object", named.go_name)
            return
        self.object(value, named)

    def object(self, value: JSONDict, named: ObjectType) -> None:
        for key in named.required:
            if value.get(key) is None:
                self.findings.missing.append(self._path("." + key))
        self._structs.append(named.go_name.rpartition(".")[2])
        fields = named.fields
        for key in list(value):
            spec = fields.get(key)
            if spec is not None:
                self._segments.append("." + key)
                self.walk(value[key], spec.type)
                self._segments.pop()
            elif not named.open:
                self.findings.unknown.append(self._path("." + key))
                if self.prune:
                    del value[key]
        self._structs.pop()

    def _mismatch(self, json_type: str, expected: str, go_type: str) -> None:
        self.findings.mismatches.append(
            Mismatch(self._path(), self._go_field(), json_type, expected, go_type)
        )


def schema_of(kind: ResourceKind) -> ObjectType | None:
    return CATALOG.by_gvk(kind.group, kind.version, kind.kind)


def inspect(kind: ResourceKind, obj: JSONDict, *, prune: bool) -> Findings:
    """What is wrong with `obj` as this kind; with prune, unknown fields are removed from it."""
    schema = schema_of(kind)
    walker = _Walker(prune)
    if schema is not None:
        walker.object(obj, schema)
    return walker.findings


def validate(kind: ResourceKind, obj: JSONDict, directive: Directive) -> list[str]:
    """Check a request's object as the API server's decoder would, dropping unknown fields;
    raises KubeError for what the server refuses, returns the Warning texts it would send."""
    findings = inspect(kind, obj, prune=True)
    meta = obj.get("metadata")
    name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
    if kind.custom and (findings.mismatches or findings.missing):
        problems = [FieldError(path, "required") for path in findings.missing]
        problems += [
            FieldError(
                m.path,
                "invalid",
                f'{m.path} in body must be of type {m.expected}: "{m.json_type}"',
                m.json_type,
            )
            for m in findings.mismatches
        ]
        raise errors.invalid(kind.kind, name, problems, kind.group)
    if findings.undecodable:
        raise _undecodable(kind, findings.undecodable[0])
    if findings.mismatches:
        first = findings.mismatches[0]
        raise _undecodable(
            kind,
            f"json: cannot unmarshal {_GO_JSON_NAMES[first.json_type]} into Go struct field "
            f"{first.go_field} of type {first.go_type}",
        )
    unknown = [f'unknown field "{path}"' for path in findings.unknown]
    if not unknown or directive == "Ignore":
        return []
    if directive == "Strict":
        raise _undecodable(kind, "strict decoding error: " + ", ".join(unknown))
    return unknown


def prune(kind: ResourceKind, obj: JSONDict) -> None:
    """Drop unknown fields silently (what admission webhooks' patches added, say)."""
    inspect(kind, obj, prune=True)


def _undecodable(kind: ResourceKind, why: str) -> KubeError:
    return errors.bad_request(
        f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: {why}'
    )
