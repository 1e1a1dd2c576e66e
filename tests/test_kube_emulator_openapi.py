"""The OpenAPI documents: what kubectl looks up in them, checked the way kubectl looks.

kubectl finds a kind's PATCH operation by its x-kubernetes-group-version-kind and checks for a
`fieldValidation` (and, when older, `dryRun`) query parameter before trusting the server to
validate; `explain` follows $refs from the kind's schema. The v2 document is read back with the
protobuf runtime (google.protobuf), from a description of the gnostic messages written here,
so the emulator's hand-written encoder is checked by an independent decoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest
import yaml

# The protobuf runtime ships no type information (and the project installs no stubs for it).
from google.protobuf import (  # type: ignore[import-untyped]
    descriptor_pb2,
    descriptor_pool,
    message_factory,
)

from shared.testing.kube_emulator import KubeEmulator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


async def _get(
    session: aiohttp.ClientSession, url: str, accept: str = "application/json"
) -> tuple[int, bytes]:
    async with session.get(url, headers={"Accept": accept}) as response:
        return response.status, await response.read()


async def _json(session: aiohttp.ClientSession, url: str) -> Any:
    status, body = await _get(session, url)
    assert status == 200, body
    return orjson.loads(body)


async def _served(session: aiohttp.ClientSession, base: str) -> list[tuple[str, str, str, str]]:
    """(group, version, kind, plural) of every top-level resource discovery lists."""
    served = []
    group_versions = ["v1"] + [
        v["groupVersion"]
        for g in (await _json(session, f"{base}/apis"))["groups"]
        for v in g["versions"]
    ]
    for group_version in group_versions:
        prefix = "/api/" if group_version == "v1" else "/apis/"
        listed = await _json(session, base + prefix + group_version)
        group, _, version = group_version.rpartition("/")
        for resource in listed["resources"]:
            if "/" not in resource["name"]:
                served.append((group, version, resource["kind"], resource["name"]))
    return served


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


async def test_v3_has_a_document_per_served_group_version(
    emulator: KubeEmulator, session: aiohttp.ClientSession
) -> None:
    index = await _json(session, f"{emulator.url}/openapi/v3")

    assert {"api/v1", "apis/events.k8s.io/v1", "apis/topology.node.k8s.io/v1alpha2"} <= set(
        index["paths"]
    )
    for entry in index["paths"].values():
        document = await _json(session, emulator.url + entry["serverRelativeURL"])
        assert document["openapi"].startswith("3.")
        schemas = document["components"]["schemas"]
        for ref in _refs(document):
            assert ref.removeprefix("#/components/schemas/") in schemas, ref
    missing, _ = await _get(session, f"{emulator.url}/openapi/v3/apis/nothing.example/v1")
    assert missing == 404


async def test_every_served_kind_declares_server_side_validation_and_dry_run(
    emulator: KubeEmulator, session: aiohttp.ClientSession
) -> None:
    index = await _json(session, f"{emulator.url}/openapi/v3")

    for group, version, kind, plural in await _served(session, emulator.url):
        path = f"apis/{group}/{version}" if group else f"api/{version}"
        document = await _json(session, emulator.url + index["paths"][path]["serverRelativeURL"])
        gvk = {"group": group, "version": version, "kind": kind}
        patches = [
            item["patch"]
            for item in document["paths"].values()
            if "patch" in item and item["patch"]["x-kubernetes-group-version-kind"] == gvk
        ]
        assert patches, f"no PATCH operation for {kind} ({plural})"
        for patch in patches:
            names = {p["name"] for p in patch["parameters"] if p["in"] == "query"}
            assert {"fieldValidation", "dryRun", "fieldManager", "force"} <= names
        schemas = [
            s
            for s in document["components"]["schemas"].values()
            if gvk in s.get("x-kubernetes-group-version-kind", [])
        ]
        assert len(schemas) == 1, kind
        assert {"apiVersion", "kind", "metadata"} <= set(schemas[0]["properties"])


async def test_the_pod_schema_is_real_where_typos_happen(
    emulator: KubeEmulator, session: aiohttp.ClientSession
) -> None:
    index = await _json(session, f"{emulator.url}/openapi/v3")
    document = await _json(session, emulator.url + index["paths"]["api/v1"]["serverRelativeURL"])
    schemas = document["components"]["schemas"]

    container = schemas["io.k8s.api.core.v1.Container"]
    spec = schemas["io.k8s.api.core.v1.PodSpec"]

    for closed in (container, spec, schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]):
        assert "x-kubernetes-preserve-unknown-fields" not in closed
    assert {"name", "image", "command", "args", "env", "ports", "resources"} <= set(
        container["properties"]
    )
    assert {"containers", "nodeName", "tolerations", "nodeSelector", "volumes"} <= set(
        spec["properties"]
    )
    containers = spec["properties"]["containers"]
    assert containers["x-kubernetes-list-type"] == "map"
    assert containers["x-kubernetes-list-map-keys"] == ["name"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    # Statuses too are Kubernetes' own definitions, closed as the API server's are.
    status = schemas["io.k8s.api.core.v1.PodStatus"]
    assert "x-kubernetes-preserve-unknown-fields" not in status
    assert {"phase", "conditions", "containerStatuses", "qosClass"} <= set(status["properties"])


# --- v2 as protobuf, decoded independently -------------------------------------------------------

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL

# A subset of gnostic's openapiv2/OpenAPIv2.proto: message -> (field, number, type, repeated).
_GNOSTIC: dict[str, list[tuple[str, int, Any, bool]]] = {
    "Document": [
        ("swagger", 1, _STRING, False),
        ("info", 2, "Info", False),
        ("paths", 8, "Paths", False),
        ("definitions", 9, "Definitions", False),
    ],
    "Info": [("title", 1, _STRING, False), ("version", 2, _STRING, False)],
    "Paths": [("path", 2, "NamedPathItem", True)],
    "NamedPathItem": [("name", 1, _STRING, False), ("value", 2, "PathItem", False)],
    "PathItem": [
        ("get", 2, "Operation", False),
        ("put", 3, "Operation", False),
        ("post", 4, "Operation", False),
        ("delete", 5, "Operation", False),
        ("patch", 8, "Operation", False),
    ],
    "Operation": [
        ("operation_id", 5, _STRING, False),
        ("parameters", 8, "ParametersItem", True),
        ("vendor_extension", 13, "NamedAny", True),
    ],
    "ParametersItem": [("parameter", 1, "Parameter", False)],
    "Parameter": [
        ("body_parameter", 1, "BodyParameter", False),
        ("non_body_parameter", 2, "NonBodyParameter", False),
    ],
    "BodyParameter": [("name", 2, _STRING, False), ("schema", 5, "Schema", False)],
    "NonBodyParameter": [
        ("query_parameter_sub_schema", 3, "QueryParameter", False),
        ("path_parameter_sub_schema", 4, "PathParameter", False),
    ],
    "QueryParameter": [
        ("required", 1, _BOOL, False),
        ("in", 2, _STRING, False),
        ("name", 4, _STRING, False),
        ("type", 6, _STRING, False),
    ],
    "PathParameter": [
        ("required", 1, _BOOL, False),
        ("in", 2, _STRING, False),
        ("name", 4, _STRING, False),
        ("type", 5, _STRING, False),
    ],
    "Definitions": [("additional_properties", 1, "NamedSchema", True)],
    "NamedSchema": [("name", 1, _STRING, False), ("value", 2, "Schema", False)],
    "Schema": [
        ("_ref", 1, _STRING, False),
        ("format", 2, _STRING, False),
        ("description", 4, _STRING, False),
        ("required", 19, _STRING, True),
        ("additional_properties", 21, "AdditionalPropertiesItem", False),
        ("type", 22, "TypeItem", False),
        ("items", 23, "ItemsItem", False),
        ("properties", 25, "Properties", False),
        ("vendor_extension", 31, "NamedAny", True),
    ],
    "AdditionalPropertiesItem": [("schema", 1, "Schema", False), ("boolean", 2, _BOOL, False)],
    "TypeItem": [("value", 1, _STRING, True)],
    "ItemsItem": [("schema", 1, "Schema", True)],
    "Properties": [("additional_properties", 1, "NamedSchema", True)],
    "NamedAny": [("name", 1, _STRING, False), ("value", 2, "Any", False)],
    "Any": [("yaml", 2, _STRING, False)],
}


def _document_class() -> Any:
    file = descriptor_pb2.FileDescriptorProto(
        name="gnostic_subset.proto", package="openapi.v2", syntax="proto3"
    )
    for name, fields in _GNOSTIC.items():
        message = file.message_type.add(name=name)
        for field_name, number, field_type, repeated in fields:
            field = message.field.add(
                name=field_name, number=number, label=_REPEATED if repeated else _OPTIONAL
            )
            if isinstance(field_type, str):
                field.type = _MESSAGE
                field.type_name = f".openapi.v2.{field_type}"
            else:
                field.type = field_type
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("openapi.v2.Document"))


def _schema_json(schema: Any) -> dict[str, Any]:
    """A decoded Schema message back in OpenAPI's JSON shape (the parts the emulator writes)."""
    out: dict[str, Any] = {}
    if schema._ref:
        out["$ref"] = schema._ref
    if schema.format:
        out["format"] = schema.format
    if schema.description:
        out["description"] = schema.description
    if schema.required:
        out["required"] = list(schema.required)
    if schema.HasField("additional_properties"):
        out["additionalProperties"] = _schema_json(schema.additional_properties.schema)
    if schema.type.value:
        (out["type"],) = schema.type.value
    if schema.items.schema:
        (item,) = schema.items.schema
        out["items"] = _schema_json(item)
    if schema.properties.additional_properties:
        out["properties"] = {
            p.name: _schema_json(p.value) for p in schema.properties.additional_properties
        }
    for extension in schema.vendor_extension:
        out[extension.name] = yaml.safe_load(extension.value.yaml)
    return out


async def test_v2_protobuf_is_the_json_document_in_gnostic_form(
    emulator: KubeEmulator, session: aiohttp.ClientSession
) -> None:
    status, encoded = await _get(
        session,
        f"{emulator.url}/openapi/v2",
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    )
    as_json = await _json(session, f"{emulator.url}/openapi/v2")

    assert status == 200
    document = _document_class().FromString(encoded)
    assert document.swagger == "2.0"
    decoded = {
        named.name: _schema_json(named.value)
        for named in document.definitions.additional_properties
    }
    assert decoded == as_json["definitions"]
    pod = decoded["io.k8s.api.core.v1.Pod"]
    assert pod["x-kubernetes-group-version-kind"] == [{"group": "", "kind": "Pod", "version": "v1"}]
    paths = {p.name: p.value for p in document.paths.path}
    patch = paths["/api/v1/namespaces/{namespace}/pods/{name}"].patch
    query = {
        p.parameter.non_body_parameter.query_parameter_sub_schema.name
        for p in patch.parameters
        if p.parameter.HasField("non_body_parameter")
    }
    assert {"dryRun", "fieldValidation", "fieldManager", "force"} <= query
    (gvk,) = [e for e in patch.vendor_extension if e.name == "x-kubernetes-group-version-kind"]
    assert yaml.safe_load(gvk.value.yaml) == {"group": "", "kind": "Pod", "version": "v1"}
    assert set(as_json["paths"]) == set(paths)
