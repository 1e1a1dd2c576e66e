"""The OpenAPI v2 document as gnostic's `openapi.v2.Document` protobuf message.

kubectl asks for /openapi/v2 as `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`
and parses the answer as that message whatever its Content-Type says, so JSON will not do. Only
what openapi.py emits is encoded: the document's info, paths (operations with their query, path
and body parameters, responses and vendor extensions) and definitions (schemas with type,
format, description, $ref, items, properties, additionalProperties, required and vendor
extensions). Field numbers are gnostic's OpenAPIv2.proto. Vendor extensions travel as YAML text
(`Any.yaml`); JSON is YAML, so they are written as JSON.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import orjson

from . import openapi
from .protowire import boolean, length_delimited, string

if TYPE_CHECKING:
    from .objects import JSONDict

CONTENT_TYPE = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"


def _named_any(number: int, name: str, value: Any) -> bytes:
    # NamedAny{name = 1, value = 2: Any{yaml = 2}}
    yaml_text = orjson.dumps(value).decode()
    return length_delimited(number, string(1, name) + length_delimited(2, string(2, yaml_text)))


def _extensions(number: int, document: JSONDict) -> bytes:
    return b"".join(
        _named_any(number, key, value) for key, value in document.items() if key.startswith("x-")
    )


def schema(document: JSONDict) -> bytes:
    """A Schema message."""
    out = bytearray()
    if "$ref" in document:
        out += string(1, document["$ref"])
    if "format" in document:
        out += string(2, document["format"])
    if "description" in document:
        out += string(4, document["description"])
    for name in document.get("required", ()):
        out += string(19, name)
    extra = document.get("additionalProperties")
    if isinstance(extra, dict):
        out += length_delimited(21, length_delimited(1, schema(extra)))
    elif isinstance(extra, bool):
        out += length_delimited(21, boolean(2, extra))
    if "type" in document:
        out += length_delimited(22, string(1, document["type"]))
    if "items" in document:
        out += length_delimited(23, length_delimited(1, schema(document["items"])))
    properties = document.get("properties")
    if properties:
        named = b"".join(
            length_delimited(1, string(1, name) + length_delimited(2, schema(value)))
            for name, value in properties.items()
        )
        out += length_delimited(25, named)
    out += _extensions(31, document)
    return bytes(out)


def _parameter(parameter: JSONDict) -> bytes:
    """A ParametersItem{parameter = 1: Parameter{body = 1 | non_body = 2}}."""
    where = parameter["in"]
    if where == "body":
        body = (
            string(2, parameter["name"])
            + string(3, where)
            + boolean(4, bool(parameter.get("required")))
            + length_delimited(5, schema(parameter["schema"]))
        )
        return length_delimited(1, length_delimited(1, body))
    # Query (NonBodyParameter field 3) and path (field 4) sub-schemas share their first fields:
    # required = 1, in = 2, description = 3, name = 4; then type is 6 for query, 5 for path.
    fields = (
        boolean(1, bool(parameter.get("required")))
        + string(2, where)
        + string(3, parameter.get("description", ""))
        + string(4, parameter["name"])
        + string(6 if where == "query" else 5, parameter.get("type", "string"))
    )
    sub_schema = 3 if where == "query" else 4
    return length_delimited(1, length_delimited(2, length_delimited(sub_schema, fields)))


def _responses(responses: JSONDict) -> bytes:
    # Responses{response_code = 1: NamedResponseValue{name, value: ResponseValue{response = 1:
    # Response{description = 1, schema = 2: SchemaItem{schema = 1}}}}}
    out = bytearray()
    for code, response in responses.items():
        body = string(1, response.get("description", ""))
        if "schema" in response:
            body += length_delimited(2, length_delimited(1, schema(response["schema"])))
        out += length_delimited(1, string(1, code) + length_delimited(2, length_delimited(1, body)))
    return bytes(out)


def _operation(operation: JSONDict) -> bytes:
    out = bytearray()
    for content_type in operation.get("produces", ()):
        out += string(6, content_type)
    for content_type in operation.get("consumes", ()):
        out += string(7, content_type)
    out += string(5, operation["operationId"])
    for parameter in operation.get("parameters", ()):
        out += length_delimited(8, _parameter(parameter))
    if "responses" in operation:
        out += length_delimited(9, _responses(operation["responses"]))
    out += _extensions(13, operation)
    return bytes(out)


# PathItem fields by HTTP verb.
_VERBS = {"get": 2, "put": 3, "post": 4, "delete": 5, "patch": 8}


def document(spec: JSONDict) -> bytes:
    """A Document message for an OpenAPI v2 document shaped like openapi.v2_json()."""
    info = spec["info"]
    out = bytearray(string(1, spec["swagger"]))
    out += length_delimited(2, string(1, info["title"]) + string(2, info["version"]))
    paths = bytearray()
    for path, item in spec["paths"].items():
        operations = b"".join(
            length_delimited(_VERBS[verb], _operation(operation))
            for verb, operation in item.items()
        )
        paths += length_delimited(2, string(1, path) + length_delimited(2, operations))
    out += length_delimited(8, bytes(paths))
    definitions = b"".join(
        length_delimited(1, string(1, name) + length_delimited(2, schema(value)))
        for name, value in spec["definitions"].items()
    )
    out += length_delimited(9, definitions)
    return bytes(out)


@functools.cache
def v2_protobuf() -> bytes:
    return document(openapi.v2_json())
