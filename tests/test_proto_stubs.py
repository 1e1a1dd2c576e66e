"""The device plugin API stubs: up to date with api.proto, and wire-compatible with kubelet.

Kubelet only understands the exact field numbers and method paths of v1beta1,
so they are pinned here from the published API rather than trusted to the
hand-written .proto; and the generated stubs are checked in, so a stale stub
must fail the build instead of drifting silently.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proto.v1beta1 import api_pb2

REPO = Path(__file__).resolve().parents[1]
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable, "-m", "grpc_tools.protoc", "-I", ".",
            f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
            "proto/v1beta1/api.proto",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )  # fmt: skip

    for name in GENERATED:
        fresh = (tmp_path / "proto" / "v1beta1" / name).read_bytes()
        committed = (REPO / "proto" / "v1beta1" / name).read_bytes()
        assert committed == fresh, f"proto/v1beta1/{name} is out of date: run `make proto`"


def test_grpc_module_imports_the_package_qualified_messages() -> None:
    source = (REPO / "proto" / "v1beta1" / "api_pb2_grpc.py").read_text()

    assert "from proto.v1beta1 import api_pb2" in source


def test_file_identity() -> None:
    descriptor = api_pb2.DESCRIPTOR

    assert descriptor.package == "v1beta1"
    assert 'syntax = "proto3";' in (REPO / "proto" / "v1beta1" / "api.proto").read_text()
    assert descriptor.GetOptions().go_package == "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"


# FieldDescriptorProto.Type numbers (descriptor.proto); stable, like any wire number.
_INT64 = 3
_INT32 = 5
_BOOL = 8
_STRING = 9
_MESSAGE = 11

# message -> [(field, number, type, repeated)], from the published v1beta1 API.
MESSAGES: dict[str, list[tuple[str, int, int, bool]]] = {
    "DevicePluginOptions": [
        ("pre_start_required", 1, _BOOL, False),
        ("get_preferred_allocation_available", 2, _BOOL, False),
    ],
    "RegisterRequest": [
        ("version", 1, _STRING, False),
        ("endpoint", 2, _STRING, False),
        ("resource_name", 3, _STRING, False),
        ("options", 4, _MESSAGE, False),
    ],
    "Empty": [],
    "ListAndWatchResponse": [("devices", 1, _MESSAGE, True)],
    "TopologyInfo": [("nodes", 1, _MESSAGE, True)],
    "NUMANode": [("ID", 1, _INT64, False)],
    "Device": [
        ("ID", 1, _STRING, False),
        ("health", 2, _STRING, False),
        ("topology", 3, _MESSAGE, False),
    ],
    "PreStartContainerRequest": [("devices_ids", 1, _STRING, True)],
    "PreStartContainerResponse": [],
    "PreferredAllocationRequest": [("container_requests", 1, _MESSAGE, True)],
    "ContainerPreferredAllocationRequest": [
        ("available_deviceIDs", 1, _STRING, True),
        ("must_include_deviceIDs", 2, _STRING, True),
        ("allocation_size", 3, _INT32, False),
    ],
    "PreferredAllocationResponse": [("container_responses", 1, _MESSAGE, True)],
    "ContainerPreferredAllocationResponse": [("deviceIDs", 1, _STRING, True)],
    "AllocateRequest": [("container_requests", 1, _MESSAGE, True)],
    "ContainerAllocateRequest": [("devices_ids", 1, _STRING, True)],
    "CDIDevice": [("name", 1, _STRING, False)],
    "AllocateResponse": [("container_responses", 1, _MESSAGE, True)],
    "ContainerAllocateResponse": [
        ("envs", 1, _MESSAGE, True),
        ("mounts", 2, _MESSAGE, True),
        ("devices", 3, _MESSAGE, True),
        ("annotations", 4, _MESSAGE, True),
        ("cdi_devices", 5, _MESSAGE, True),
    ],
    "Mount": [
        ("container_path", 1, _STRING, False),
        ("host_path", 2, _STRING, False),
        ("read_only", 3, _BOOL, False),
    ],
    "DeviceSpec": [
        ("container_path", 1, _STRING, False),
        ("host_path", 2, _STRING, False),
        ("permissions", 3, _STRING, False),
    ],
}


def test_every_message_is_defined_and_nothing_else() -> None:
    assert set(api_pb2.DESCRIPTOR.message_types_by_name) == set(MESSAGES)


@pytest.mark.parametrize("message", sorted(MESSAGES))
def test_message_fields_match_the_published_api(message: str) -> None:
    fields = api_pb2.DESCRIPTOR.message_types_by_name[message].fields

    actual = [(f.name, f.number, f.type, f.is_repeated) for f in fields]

    assert sorted(actual) == sorted(MESSAGES[message])


def test_field_numbers_kubelet_relies_on() -> None:
    device = api_pb2.Device.DESCRIPTOR.fields_by_name
    preferred = api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR.fields_by_name

    assert (device["ID"].number, device["health"].number, device["topology"].number) == (1, 2, 3)
    assert preferred["allocation_size"].number == 3
    assert api_pb2.NUMANode.DESCRIPTOR.fields_by_name["ID"].number == 1


def test_maps_are_string_to_string() -> None:
    response = api_pb2.ContainerAllocateResponse(envs={"A": "1"}, annotations={"k": "v"})

    assert dict(response.envs) == {"A": "1"}
    assert dict(response.annotations) == {"k": "v"}


def test_services_and_method_paths() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    plugin = services["DevicePlugin"]

    assert set(services) == {"Registration", "DevicePlugin"}
    assert [m.full_name for m in services["Registration"].methods] == [
        "v1beta1.Registration.Register"
    ]
    assert [(m.name, m.input_type.name, m.output_type.name) for m in plugin.methods] == [
        ("GetDevicePluginOptions", "Empty", "DevicePluginOptions"),
        ("ListAndWatch", "Empty", "ListAndWatchResponse"),
        ("GetPreferredAllocation", "PreferredAllocationRequest", "PreferredAllocationResponse"),
        ("Allocate", "AllocateRequest", "AllocateResponse"),
        ("PreStartContainer", "PreStartContainerRequest", "PreStartContainerResponse"),
    ]
    streaming = {m.name for m in plugin.methods if m.server_streaming or m.client_streaming}
    assert streaming == {"ListAndWatch"}
    assert not plugin.methods_by_name["ListAndWatch"].client_streaming


def test_grpc_method_paths_in_generated_module() -> None:
    source = (REPO / "proto" / "v1beta1" / "api_pb2_grpc.py").read_text()

    for path in (
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    ):
        assert f"'{path}'" in source
