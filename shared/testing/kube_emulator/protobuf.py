"""Request bodies in `application/vnd.kubernetes.protobuf`, turned into the JSON they stand for.

kubectl's generators (`create namespace`, `create quota`, `create configmap`) build typed
objects and send them as protobuf; client-go does not retry with JSON when a server refuses
that, so the emulator reads them. A body is the 4-byte magic `k8s\\x00` and a runtime.Unknown
{typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2, contentEncoding = 3, contentType = 4}
whose `raw` is the kind's own message. The messages below are described by field number (from
k8s.io/api's generated.proto); a kind or field outside them is answered 415, so nothing is ever
silently dropped. Like Go's JSON encoder (omitempty), zero values of plain fields are left out;
pointer fields (marked `optional`) keep them.
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from .protowire import LENGTH, VARINT, WireError, fields, signed64

if TYPE_CHECKING:
    from .objects import JSONDict

CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


class ProtobufError(ValueError):
    """A body that is not a well-formed Kubernetes protobuf message (400)."""


class UnsupportedProtobuf(ValueError):
    """A well-formed body the emulator cannot translate (415): str() says which part."""


@dataclass(frozen=True, slots=True)
class F:
    """One field: its JSON name and how its value is read.

    `type` is a scalar (string, bytes, int, bool), a special (time, quantity, fieldsV1), or a
    message name; `repeated` makes a list, `map_of` a map<string, map_of>."""

    name: str
    type: str
    repeated: bool = False
    map_of: str = ""
    optional: bool = False


Message = dict[int, F]

MESSAGES: dict[str, Message] = {
    "TypeMeta": {1: F("apiVersion", "string"), 2: F("kind", "string")},
    "ObjectMeta": {
        1: F("name", "string"),
        2: F("generateName", "string"),
        3: F("namespace", "string"),
        4: F("selfLink", "string"),
        5: F("uid", "string"),
        6: F("resourceVersion", "string"),
        7: F("generation", "int"),
        8: F("creationTimestamp", "time"),
        9: F("deletionTimestamp", "time"),
        10: F("deletionGracePeriodSeconds", "int", optional=True),
        11: F("labels", "map", map_of="string"),
        12: F("annotations", "map", map_of="string"),
        13: F("ownerReferences", "OwnerReference", repeated=True),
        14: F("finalizers", "string", repeated=True),
        17: F("managedFields", "ManagedFieldsEntry", repeated=True),
    },
    "OwnerReference": {
        1: F("kind", "string"),
        3: F("name", "string"),
        4: F("uid", "string"),
        5: F("apiVersion", "string"),
        6: F("controller", "bool", optional=True),
        7: F("blockOwnerDeletion", "bool", optional=True),
    },
    "ManagedFieldsEntry": {
        1: F("manager", "string"),
        2: F("operation", "string"),
        3: F("apiVersion", "string"),
        4: F("time", "time"),
        6: F("fieldsType", "string"),
        7: F("fieldsV1", "fieldsV1"),
        8: F("subresource", "string"),
    },
    "ObjectReference": {
        1: F("kind", "string"),
        2: F("namespace", "string"),
        3: F("name", "string"),
        4: F("uid", "string"),
        5: F("apiVersion", "string"),
        6: F("resourceVersion", "string"),
        7: F("fieldPath", "string"),
    },
    "Namespace": {
        1: F("metadata", "ObjectMeta"),
        2: F("spec", "NamespaceSpec"),
        3: F("status", "NamespaceStatus"),
    },
    "NamespaceSpec": {1: F("finalizers", "string", repeated=True)},
    "NamespaceStatus": {
        1: F("phase", "string"),
        2: F("conditions", "NamespaceCondition", repeated=True),
    },
    "NamespaceCondition": {
        1: F("type", "string"),
        2: F("status", "string"),
        4: F("lastTransitionTime", "time"),
        5: F("reason", "string"),
        6: F("message", "string"),
    },
    "ResourceQuota": {
        1: F("metadata", "ObjectMeta"),
        2: F("spec", "ResourceQuotaSpec"),
        3: F("status", "ResourceQuotaStatus"),
    },
    "ResourceQuotaSpec": {
        1: F("hard", "map", map_of="quantity"),
        2: F("scopes", "string", repeated=True),
        3: F("scopeSelector", "ScopeSelector"),
    },
    "ScopeSelector": {1: F("matchExpressions", "ScopedResourceSelectorRequirement", repeated=True)},
    "ScopedResourceSelectorRequirement": {
        1: F("scopeName", "string"),
        2: F("operator", "string"),
        3: F("values", "string", repeated=True),
    },
    "ResourceQuotaStatus": {
        1: F("hard", "map", map_of="quantity"),
        2: F("used", "map", map_of="quantity"),
    },
    "ConfigMap": {
        1: F("metadata", "ObjectMeta"),
        2: F("data", "map", map_of="string"),
        3: F("binaryData", "map", map_of="bytes"),
        4: F("immutable", "bool", optional=True),
    },
    "Binding": {1: F("metadata", "ObjectMeta"), 2: F("target", "ObjectReference")},
}

# The kinds (apiVersion, kind) whose bodies can be read, and their message.
KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ResourceQuota"): "ResourceQuota",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Binding"): "Binding",
}


def decode(body: bytes) -> JSONDict:
    """The JSON object a Kubernetes protobuf body encodes, kind and apiVersion first."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf prefix")
    try:
        envelope: dict[int, bytes] = {}
        for wire in fields(body[len(MAGIC) :]):
            if wire.number not in (1, 2, 3, 4) or not isinstance(wire.value, bytes):
                raise UnsupportedProtobuf(f"field {wire.number} of Unknown is not understood")
            envelope[wire.number] = wire.value
        type_meta = _message(envelope.get(1, b""), "TypeMeta")
        api_version, kind = str(type_meta.get("apiVersion", "")), str(type_meta.get("kind", ""))
        if envelope.get(3) or envelope.get(4):
            raise UnsupportedProtobuf("contentEncoding and contentType must be empty")
        message = KINDS.get((api_version, kind))
        if message is None:
            raise UnsupportedProtobuf(
                f"the emulator cannot read {kind or 'an object'} ({api_version or 'no version'}) "
                "in protobuf; send it as JSON"
            )
        obj = _message(envelope.get(2, b""), message)
    except WireError as error:
        raise ProtobufError(f"malformed protobuf body: {error}") from None
    return {"kind": kind, "apiVersion": api_version, **obj}


def _message(data: bytes, name: str) -> JSONDict:
    layout = MESSAGES[name]
    out: JSONDict = {}
    for wire in fields(data):
        spec = layout.get(wire.number)
        if spec is None:
            raise UnsupportedProtobuf(
                f"field {wire.number} of {name} is not understood by the emulator; send JSON"
            )
        value = _value(spec, wire.wire_type, wire.value, name)
        if spec.map_of:
            key, item = value
            out.setdefault(spec.name, {})[key] = item
        elif spec.repeated:
            out.setdefault(spec.name, []).append(value)
        else:
            out[spec.name] = value
    # Go's JSON encoding leaves zero values of omitempty fields out; pointers say "set".
    for spec in layout.values():
        if spec.name in out and not spec.optional and out[spec.name] in (None, "", 0, {}):
            del out[spec.name]
    return out


def _value(spec: F, wire_type: int, raw: int | bytes, message: str) -> Any:
    expected = VARINT if spec.type in ("int", "bool") and not spec.map_of else LENGTH
    if wire_type != expected:
        raise ProtobufError(f"field {spec.name} of {message} has the wrong wire type")
    if spec.map_of:
        assert isinstance(raw, bytes)
        entry = {wire.number: wire for wire in fields(raw)}
        key = entry[1].value if 1 in entry else b""
        if not isinstance(key, bytes):
            raise ProtobufError(f"a key of {spec.name} in {message} is not a string")
        value = entry[2].value if 2 in entry else b""
        return _text(key), _scalar(spec.map_of, value, spec.name)
    return _scalar(spec.type, raw, spec.name)


def _scalar(type_name: str, raw: int | bytes, name: str) -> Any:
    if type_name == "int":
        assert isinstance(raw, int)
        return signed64(raw)
    if type_name == "bool":
        assert isinstance(raw, int)
        return bool(raw)
    if not isinstance(raw, bytes):
        raise ProtobufError(f"{name} should be length-delimited")
    if type_name == "string":
        return _text(raw)
    if type_name == "bytes":
        return base64.b64encode(raw).decode()
    if type_name == "quantity":
        return _text(_only_field(raw, 1, name))
    if type_name == "time":
        return _time(raw, name)
    if type_name == "fieldsV1":
        try:
            return orjson.loads(_only_field(raw, 1, name) or b"{}")
        except orjson.JSONDecodeError as error:
            raise ProtobufError(f"{name} is not JSON: {error}") from None
    return _message(raw, type_name)


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ProtobufError("a string field is not UTF-8") from None


def _only_field(raw: bytes, number: int, name: str) -> bytes:
    for wire in fields(raw):
        if wire.number != number or not isinstance(wire.value, bytes):
            raise UnsupportedProtobuf(f"field {wire.number} of {name} is not understood")
        return wire.value
    return b""


def _time(raw: bytes, name: str) -> str | None:
    """A metav1.Time {seconds = 1, nanos = 2}; the zero time is JSON null."""
    seconds = nanos = 0
    for wire in fields(raw):
        if wire.number not in (1, 2) or not isinstance(wire.value, int):
            raise UnsupportedProtobuf(f"field {wire.number} of {name} is not understood")
        if wire.number == 1:
            seconds = signed64(wire.value)
        else:
            nanos = signed64(wire.value)
    if seconds == 0 and nanos == 0:
        return None
    try:
        moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    except (OverflowError, OSError, ValueError):
        raise ProtobufError(f"{name} is out of range") from None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
