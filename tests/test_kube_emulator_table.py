"""Server-side printing (meta.k8s.io Table) and metadata-only reads, over HTTP and unit by unit.

The expected cells are kubectl's documented output for each situation (a crash-looping
container reads CrashLoopBackOff, a pod being deleted Terminating, 200 seconds 3m20s).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest

from shared.testing.kube_emulator import KubeEmulator
from shared.testing.kube_emulator.resources import NODES, PODS, RESOURCE_QUOTAS
from shared.testing.kube_emulator.table import human_duration, table
from tests.test_kube_emulator_dry_run import WAIT_S, Raw, pod_body

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from shared.testing.kube_emulator.objects import JSONDict

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
KUBECTL_ACCEPT = f"{TABLE},application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
POD_PATH = "/api/v1/namespaces/default/pods"
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def raw(emulator: KubeEmulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(emulator, session)


# --- over HTTP -----------------------------------------------------------------------------------


async def test_a_list_as_table_has_kubectls_pod_columns(raw: Raw) -> None:
    await raw.ok("POST", POD_PATH, pod_body("a"))
    await raw.ok("POST", POD_PATH, pod_body("b"))

    answer = await raw.ok("GET", POD_PATH, headers={"Accept": KUBECTL_ACCEPT})

    assert answer["kind"] == "Table"
    assert answer["apiVersion"] == "meta.k8s.io/v1"
    columns = [(c["name"], c["priority"]) for c in answer["columnDefinitions"]]
    assert columns == [
        ("Name", 0),
        ("Ready", 0),
        ("Status", 0),
        ("Restarts", 0),
        ("Age", 0),
        ("IP", 1),
        ("Node", 1),
        ("Nominated Node", 1),
        ("Readiness Gates", 1),
    ]
    assert [row["cells"][:4] for row in answer["rows"]] == [
        ["a", "0/1", "Pending", "0"],
        ["b", "0/1", "Pending", "0"],
    ]
    # Metadata is the default object: what kubectl needs for -A and --show-labels.
    assert answer["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert answer["rows"][0]["object"]["metadata"]["labels"] == {"app": "a"}


@pytest.mark.parametrize(("include", "expected"), [("None", None), ("Object", "Pod")])
async def test_include_object_chooses_what_rows_carry(
    raw: Raw, include: str, expected: str | None
) -> None:
    await raw.ok("POST", POD_PATH, pod_body("a"))

    answer = await raw.ok(
        "GET", POD_PATH, headers={"Accept": TABLE}, params={"includeObject": include}
    )

    row = answer["rows"][0]
    assert (row.get("object") or {}).get("kind") == expected
    if expected:
        assert row["object"]["spec"]["containers"][0]["image"] == "busybox"


async def test_one_object_and_other_kinds_as_tables(raw: Raw) -> None:
    await raw.ok("POST", POD_PATH, pod_body("a"))
    await raw.ok("POST", "/api/v1/nodes", {"metadata": {"name": "n1"}})
    await raw.ok(
        "POST",
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
        {
            "apiVersion": "topology.node.k8s.io/v1alpha2",
            "kind": "NodeResourceTopology",
            "metadata": {"name": "n1"},
            "zones": [],
        },
    )

    one = await raw.ok("GET", f"{POD_PATH}/a", headers={"Accept": TABLE})
    nodes = await raw.ok("GET", "/api/v1/nodes", headers={"Accept": TABLE})
    namespaces = await raw.ok("GET", "/api/v1/namespaces", headers={"Accept": TABLE})
    topologies = await raw.ok(
        "GET",
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
        headers={"Accept": TABLE},
    )

    assert [row["cells"][0] for row in one["rows"]] == ["a"]
    assert [c["name"] for c in nodes["columnDefinitions"] if c["priority"] == 0] == [
        "Name",
        "Status",
        "Roles",
        "Age",
        "Version",
    ]
    assert nodes["rows"][0]["cells"][:3] == ["n1", "Unknown", "<none>"]
    assert [c["name"] for c in namespaces["columnDefinitions"]] == ["Name", "Status", "Age"]
    assert [row["cells"][:2] for row in namespaces["rows"]] == [
        ["default", "Active"],
        ["kube-system", "Active"],
    ]
    assert [c["name"] for c in topologies["columnDefinitions"]] == ["Name", "Age"]


async def test_a_watch_as_table_sends_rows(raw: Raw, emulator: KubeEmulator) -> None:
    revision = await raw.revision()

    async with (
        asyncio.timeout(WAIT_S),
        raw.session.get(
            emulator.url + POD_PATH,
            params={"watch": "true", "resourceVersion": revision},
            headers={"Accept": TABLE},
        ) as stream,
    ):
        await raw.ok("POST", POD_PATH, pod_body("w"))
        event = orjson.loads(await stream.content.readline())

    assert event["type"] == "ADDED"
    assert event["object"]["kind"] == "Table"
    assert event["object"]["rows"][0]["cells"][:3] == ["w", "0/1", "Pending"]


async def test_metadata_only_lists(raw: Raw) -> None:
    await raw.ok("POST", POD_PATH, pod_body("a"))

    listed = await raw.ok(
        "GET",
        POD_PATH,
        headers={"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"},
    )
    one = await raw.ok(
        "GET",
        f"{POD_PATH}/a",
        headers={"Accept": "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"},
    )

    assert listed["kind"] == "PartialObjectMetadataList"
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a"]
    assert one["kind"] == "PartialObjectMetadata"
    assert "spec" not in one


async def test_unservable_accept_headers_and_options_are_refused(raw: Raw) -> None:
    only_html, _, _ = await raw.call("GET", POD_PATH, headers={"Accept": "text/html"})
    other_group, _, _ = await raw.call(
        "GET", POD_PATH, headers={"Accept": "application/json;as=Table;v=v1;g=example.com"}
    )
    bad_include, answer, _ = await raw.call(
        "GET", POD_PATH, headers={"Accept": TABLE}, params={"includeObject": "All"}
    )

    assert only_html == 406
    assert other_group == 406
    assert bad_include == 400
    assert "includeObject" in answer["message"]


# --- cells ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (45, "45s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (25 * 60, "25m"),
        (3 * 3600 - 1, "179m"),
        (5 * 3600 + 10 * 60, "5h10m"),
        (20 * 3600, "20h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (40 * 86400, "40d"),
        ((2 * 365 + 30) * 86400, "2y30d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_durations_read_as_in_kubectl(seconds: int, shown: str) -> None:
    assert human_duration(seconds) == shown


def _pod(status: JSONDict, **spec: Any) -> JSONDict:
    return {
        "metadata": {"name": "p", "creationTimestamp": "2026-01-02T03:00:00Z"},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}], **spec},
        "status": status,
    }


def _cells(pod: JSONDict) -> list[Any]:
    cells: list[Any] = table(PODS, [pod], "1", "None", now=NOW)["rows"][0]["cells"]
    return cells


def _running(name: str, ready: bool, restarts: int = 0, **last: Any) -> JSONDict:
    status: JSONDict = {
        "name": name,
        "ready": ready,
        "restartCount": restarts,
        "state": {"running": {"startedAt": "2026-01-02T03:00:00Z"}},
    }
    if last:
        status["lastState"] = {"terminated": last}
    return status


def test_a_running_pod_with_restarts() -> None:
    pod = _pod(
        {
            "phase": "Running",
            "podIP": "10.0.0.9",
            "containerStatuses": [
                _running("a", True),
                _running("b", False, 3, exitCode=1, finishedAt="2026-01-02T03:02:05Z"),
            ],
        },
        nodeName="n1",
    )

    assert _cells(pod) == [
        "p",
        "1/2",
        "Running",
        "3 (2m ago)",
        "4m5s",
        "10.0.0.9",
        "n1",
        "<none>",
        "<none>",
    ]


@pytest.mark.parametrize(
    ("status", "extra", "shown"),
    [
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "a", "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
                ],
            },
            {},
            "CrashLoopBackOff",
        ),
        (
            {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "i", "state": {"waiting": {"reason": "PodInitializing"}}}
                ],
            },
            {"initContainers": [{"name": "i"}]},
            "Init:0/1",
        ),
        (
            {
                "phase": "Pending",
                "initContainerStatuses": [{"name": "i", "state": {"terminated": {"exitCode": 2}}}],
            },
            {"initContainers": [{"name": "i"}]},
            "Init:ExitCode:2",
        ),
        (
            {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 137, "signal": 9}}}
                ],
            },
            {},
            "Signal:9",
        ),
        (
            {
                "phase": "Succeeded",
                "containerStatuses": [
                    {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                ],
            },
            {},
            "Completed",
        ),
        ({"phase": "Pending"}, {"schedulingGates": [{"name": "g"}]}, "SchedulingGated"),
        ({"phase": "Failed", "reason": "Evicted"}, {}, "Evicted"),
    ],
)
def test_pod_status_words(status: JSONDict, extra: JSONDict, shown: str) -> None:
    assert _cells(_pod(status, **extra))[2] == shown


def test_a_pod_being_deleted_is_terminating() -> None:
    pod = _pod({"phase": "Running"})
    pod["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:00Z"

    assert _cells(pod)[2] == "Terminating"


def test_readiness_gates_count_true_conditions() -> None:
    pod = _pod(
        {"phase": "Running", "conditions": [{"type": "g1", "status": "True"}]},
        readinessGates=[{"conditionType": "g1"}, {"conditionType": "g2"}],
    )

    assert _cells(pod)[-1] == "1/2"


def test_node_and_quota_cells() -> None:
    node = {
        "metadata": {
            "name": "n1",
            "creationTimestamp": "2025-12-31T03:04:05Z",
            "labels": {
                "node-role.kubernetes.io/control-plane": "",
                "node-role.kubernetes.io/gpu": "",
            },
        },
        "spec": {"unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian"},
        },
    }
    quota = {
        "metadata": {"name": "q", "creationTimestamp": "2026-01-02T03:04:05Z"},
        "status": {
            "hard": {"pods": "10", "limits.memory": "4Gi", "requests.nvidia.com/gpu": "2"},
            "used": {"pods": "3"},
        },
    }

    node_cells = table(NODES, [node], "1", "None", now=NOW)["rows"][0]["cells"]
    quota_cells = table(RESOURCE_QUOTAS, [quota], "1", "None", now=NOW)["rows"][0]["cells"]

    assert node_cells == [
        "n1",
        "NotReady,SchedulingDisabled",
        "control-plane,gpu",
        "2d",
        "v1.33.0",
        "10.0.0.1",
        "<none>",
        "Debian",
        "<unknown>",
        "<unknown>",
    ]
    assert quota_cells == [
        "q",
        "0s",
        "pods: 3/10, requests.nvidia.com/gpu: 0/2",
        "limits.memory: 0/4Gi",
    ]
