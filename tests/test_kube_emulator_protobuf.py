"""Protobuf request bodies (`application/vnd.kubernetes.protobuf`), as kubectl sends them.

The three bodies below are byte for byte what kubectl 1.32 sent for `create namespace
capture-ns`, `create configmap capture-cm --from-literal=greeting=hello --from-literal=x=1` and
`create quota capture-q --hard=cpu=2,pods=3,nvidia.com/gpu=1 --scopes=NotTerminating`
(captured with -v=9). Anything the emulator cannot translate is 415, never a silent loss, and
bytes that are not protobuf at all are 400.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
import pytest

from shared.testing.kube_emulator import KubeEmulator
from tests.test_kube_emulator_dry_run import Raw

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

PROTOBUF = "application/vnd.kubernetes.protobuf"

NAMESPACE = bytes.fromhex(
    "6b3873000a0f0a02763112094e616d65737061636512220a1a0a0a636170747572652d6e7312001a0022002a"
    "0032003800420012001a020a001a002200"
)
CONFIG_MAP = bytes.fromhex(
    "6b3873000a0f0a0276311209436f6e6669674d617012370a1a0a0a636170747572652d636d12001a0022002a"
    "0032003800420012110a086772656574696e67120568656c6c6f12060a01781201311a002200"
)
QUOTA = bytes.fromhex(
    "6b3873000a130a027631120d5265736f7572636551756f7461125f0a190a09636170747572652d7112001a00"
    "22002a0032003800420012400a0a0a0363707512030a01320a150a0e6e76696469612e636f6d2f6770751203"
    "0a01310a0b0a04706f647312030a0133120e4e6f745465726d696e6174696e671a001a002200"
)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (numbers under 16, payloads under 128 bytes: each
    of tag and length is then one byte)."""
    assert number < 16
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def _envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return b"k8s\x00" + _field(1, type_meta) + _field(2, raw)


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def raw(emulator: KubeEmulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(emulator, session)


async def test_kubectls_namespace_is_created(raw: Raw) -> None:
    status, created, _ = await raw.call(
        "POST", "/api/v1/namespaces", raw=NAMESPACE, content_type=PROTOBUF
    )

    assert status == 201
    assert created["metadata"]["name"] == "capture-ns"
    stored = await raw.ok("GET", "/api/v1/namespaces/capture-ns")
    assert stored["status"] == {"phase": "Active"}
    assert stored["spec"] == {"finalizers": ["kubernetes"]}


async def test_kubectls_config_map_and_quota_are_created(raw: Raw) -> None:
    await raw.ok(
        "POST", "/api/v1/namespaces/default/configmaps", raw=CONFIG_MAP, content_type=PROTOBUF
    )
    await raw.ok(
        "POST", "/api/v1/namespaces/default/resourcequotas", raw=QUOTA, content_type=PROTOBUF
    )

    config_map = await raw.ok("GET", "/api/v1/namespaces/default/configmaps/capture-cm")
    quota = await raw.ok("GET", "/api/v1/namespaces/default/resourcequotas/capture-q")
    assert config_map["data"] == {"greeting": "hello", "x": "1"}
    assert quota["spec"] == {
        "hard": {"cpu": "2", "pods": "3", "nvidia.com/gpu": "1"},
        "scopes": ["NotTerminating"],
    }
    # Zero values of plain fields are left out, as Go's JSON encoding leaves them out.
    assert set(quota["metadata"]) == {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    }


async def test_a_binding_in_protobuf_binds(raw: Raw) -> None:
    await raw.ok(
        "POST",
        "/api/v1/namespaces/default/pods",
        {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
    )
    binding = _field(1, _field(1, b"p")) + _field(2, _field(1, b"Node") + _field(3, b"n1"))

    status, answer, _ = await raw.call(
        "POST",
        "/api/v1/namespaces/default/pods/p/binding",
        raw=_envelope("v1", "Binding", binding),
        content_type=PROTOBUF,
    )

    assert status == 201, answer
    assert (await raw.ok("GET", "/api/v1/namespaces/default/pods/p"))["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (_envelope("v1", "Pod", _field(1, _field(1, b"p"))), "cannot read Pod"),
        (_envelope("v1", "Namespace", _field(9, b"x")), "field 9 of Namespace"),
        (_envelope("v1", "Namespace", _field(1, _field(15, b"x"))), "field 15 of ObjectMeta"),
    ],
)
async def test_what_cannot_be_translated_is_415(raw: Raw, body: bytes, why: str) -> None:
    status, answer, _ = await raw.call(
        "POST", "/api/v1/namespaces", raw=body, content_type=PROTOBUF
    )

    assert status == 415
    assert answer["reason"] == "UnsupportedMediaType"
    assert why in answer["message"]


@pytest.mark.parametrize(
    "body",
    [
        b"not protobuf",
        NAMESPACE[:-9],  # cut inside a field
        b"k8s\x00\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # an 11-byte varint
        _envelope("v1", "Namespace", _field(1, _field(1, b"\xff\xfe"))),  # not UTF-8
    ],
)
async def test_malformed_protobuf_is_400(raw: Raw, body: bytes) -> None:
    status, answer, _ = await raw.call(
        "POST", "/api/v1/namespaces", raw=body, content_type=PROTOBUF
    )

    assert status == 400
    assert answer["reason"] == "BadRequest"


async def test_other_body_media_types_are_415_and_yaml_is_read(raw: Raw) -> None:
    xml, _, _ = await raw.call(
        "POST", "/api/v1/namespaces", raw=b"<Namespace/>", content_type="application/xml"
    )
    yaml_status, created, _ = await raw.call(
        "POST",
        "/api/v1/namespaces",
        raw=b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: from-yaml\n",
        content_type="application/yaml",
    )

    assert xml == 415
    assert yaml_status == 201
    assert created["metadata"]["name"] == "from-yaml"
