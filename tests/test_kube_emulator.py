"""The Kubernetes API emulator, driven by the real kubernetes_asyncio client.

Every API test goes through a kubeconfig the emulator wrote and the client's own
`config.load_kube_config`, so what passes here is what numafit's services will meet. Waits are
bounded by asyncio.timeout on the condition itself; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import aiohttp
import orjson
import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration, CoreV1Api

from shared.testing.kube_emulator import AdmissionDenied, AdmissionRequest, KubeEmulator, main
from shared.testing.kube_emulator.patching import (
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from shared.testing.kube_emulator.selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

    from shared.testing.kube_emulator.objects import JSONDict

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 1.5  # upper bound for any single wait on a condition in these tests


# --- fixtures and helpers --------------------------------------------------------------------


@asynccontextmanager
async def api_client(emulator: KubeEmulator, tmp_path: Path) -> AsyncIterator[ApiClient]:
    """An ApiClient configured only from the kubeconfig the emulator wrote."""
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    configuration = Configuration()
    await config.load_kube_config(config_file=str(path), client_configuration=configuration)
    async with ApiClient(configuration=configuration) as api:
        yield api


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def api(emulator: KubeEmulator, tmp_path: Path) -> AsyncIterator[ApiClient]:
    async with api_client(emulator, tmp_path) as connected:
        yield connected


@pytest.fixture
def core(api: ApiClient) -> CoreV1Api:
    return CoreV1Api(api)


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    containers: tuple[str, ...] = ("main",),
) -> client.V1Pod:
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name=c, image="busybox") for c in containers]
        ),
    )


def binding(pod_name: str, node: str, **metadata: Any) -> client.V1Binding:
    return client.V1Binding(
        metadata=client.V1ObjectMeta(name=pod_name, **metadata),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )


def status_of(error: ApiException) -> JSONDict:
    body: JSONDict = orjson.loads(error.body or b"{}")
    return body


def message_of(error: ApiException) -> str:
    return str(status_of(error)["message"])


async def collect_events(
    core: CoreV1Api, count: int, **watch_kwargs: Any
) -> list[tuple[str, JSONDict]]:
    """The first `count` events of a pod watch in namespace default, as (type, raw object)."""
    seen: list[tuple[str, JSONDict]] = []
    async with watch.Watch() as stream, asyncio.timeout(WAIT_S):
        async for event in stream.stream(
            core.list_namespaced_pod, "default", timeout_seconds=10, **watch_kwargs
        ):
            seen.append((event["type"], event["raw_object"]))
            if len(seen) == count:
                break
    return seen


async def merge_patch_pod(core: CoreV1Api, name: str, patch: JSONDict) -> client.V1Pod:
    """A JSON merge patch (a dict body alone is sent as a strategic merge patch)."""
    # The stubs lack _content_type, which the client accepts and sends as Content-Type.
    return await core.patch_namespaced_pod(  # type: ignore[call-arg]
        name, "default", patch, _content_type="application/merge-patch+json"
    )


async def awaited(awaitable: Awaitable[T]) -> T:
    """A coroutine for create_task: the client's methods return plain awaitables."""
    return await awaitable


def names_of(pod_list: Any) -> list[str]:
    return sorted(item.metadata.name for item in pod_list.items)


# --- pods: create, get, list, selectors ------------------------------------------------------


async def test_create_assigns_identity_defaults_and_a_pending_status(core: CoreV1Api) -> None:
    manifest = pod("gpu")
    manifest.spec.containers[0].resources = client.V1ResourceRequirements(
        limits={"nvidia.com/gpu": "1"}
    )
    manifest.status = client.V1PodStatus(phase="Running")  # the API server discards it

    created = await core.create_namespaced_pod("default", manifest)
    fetched = await core.read_namespaced_pod("gpu", "default")

    assert created.metadata.uid and len(created.metadata.uid) == 36
    assert created.metadata.creation_timestamp is not None
    assert int(created.metadata.resource_version) > 0
    assert created.status.phase == "Pending"
    assert created.spec.scheduler_name == "default-scheduler"
    assert created.spec.containers[0].resources.requests == {"nvidia.com/gpu": "1"}
    assert fetched.to_dict() == created.to_dict()


async def test_get_missing_and_create_duplicate_answer_real_status_objects(
    core: CoreV1Api,
) -> None:
    await core.create_namespaced_pod("default", pod("once"))

    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_pod("nobody", "default")
    with pytest.raises(ApiException) as duplicate:
        await core.create_namespaced_pod("default", pod("once"))

    assert missing.value.status == 404
    assert status_of(missing.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "nobody" not found',
        "reason": "NotFound",
        "details": {"name": "nobody", "kind": "pods"},
        "code": 404,
    }
    assert duplicate.value.status == 409
    assert status_of(duplicate.value)["reason"] == "AlreadyExists"


async def test_invalid_pods_are_refused_with_422(core: CoreV1Api) -> None:
    no_image = pod("no-image")
    no_image.spec.containers = [client.V1Container(name="main")]

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod("default", no_image)
    with pytest.raises(ApiException) as bad_name:
        await core.create_namespaced_pod("default", pod("Not_A_Name"))

    assert refused.value.status == 422
    assert message_of(refused.value) == (
        'Pod "no-image" is invalid: spec.containers[0].image: Required value'
    )
    assert bad_name.value.status == 422
    assert status_of(bad_name.value)["reason"] == "Invalid"


async def test_generate_name_makes_a_unique_name(core: CoreV1Api) -> None:
    manifest = pod("")
    manifest.metadata = client.V1ObjectMeta(generate_name="worker-")

    first = await core.create_namespaced_pod("default", manifest)
    second = await core.create_namespaced_pod("default", manifest)

    assert first.metadata.name.startswith("worker-")
    assert len(first.metadata.name) == len("worker-") + 5
    assert first.metadata.name != second.metadata.name


async def test_list_filters_by_field_selectors(core: CoreV1Api) -> None:
    for name in ("a", "b", "c"):
        await core.create_namespaced_pod("default", pod(name))
    await core.create_namespaced_pod("other", pod("d"))
    bound = await core.create_namespaced_pod_binding(
        "b", "default", binding("b", "node-1"), _preload_content=False
    )
    cast("aiohttp.ClientResponse", bound).release()
    await core.patch_namespaced_pod_status("c", "default", {"status": {"phase": "Running"}})

    async def listed(selector: str, namespace: str | None = "default") -> list[str]:
        if namespace is None:
            return names_of(await core.list_pod_for_all_namespaces(field_selector=selector))
        return names_of(await core.list_namespaced_pod(namespace, field_selector=selector))

    assert await listed("spec.nodeName=node-1") == ["b"]
    assert await listed("spec.nodeName=") == ["a", "c"]
    assert await listed("spec.nodeName!=node-1,status.phase==Pending") == ["a"]
    assert await listed("status.phase=Running") == ["c"]
    assert await listed("metadata.name=a") == ["a"]
    assert await listed("spec.schedulerName=default-scheduler") == ["a", "b", "c"]
    assert await listed("metadata.namespace=other", None) == ["d"]
    assert await listed("", None) == ["a", "b", "c", "d"]

    with pytest.raises(ApiException) as unsupported:
        await listed("spec.bogus=1")
    assert unsupported.value.status == 400
    assert message_of(unsupported.value) == "field label not supported: spec.bogus"


async def test_list_filters_by_label_selectors(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("web", labels={"app": "web", "tier": "1"}))
    await core.create_namespaced_pod("default", pod("db", labels={"app": "db", "gpu": "yes"}))
    await core.create_namespaced_pod("default", pod("bare"))

    async def listed(selector: str) -> list[str]:
        return names_of(await core.list_namespaced_pod("default", label_selector=selector))

    assert await listed("app=web") == ["web"]
    assert await listed("app==db") == ["db"]
    assert await listed("app!=web") == ["bare", "db"]  # absent counts as "not equal"
    assert await listed("app in (web, db)") == ["db", "web"]
    assert await listed("app notin (web)") == ["bare", "db"]
    assert await listed("gpu") == ["db"]
    assert await listed("!gpu") == ["bare", "web"]
    assert await listed("app,!gpu,tier>0") == ["web"]

    with pytest.raises(ApiException) as malformed:
        await listed("app in web")
    assert malformed.value.status == 400


async def test_list_reports_the_store_revision_and_namespaces_appear_on_first_use(
    core: CoreV1Api,
) -> None:
    created = await core.create_namespaced_pod("team-a", pod("p"))

    pods = await core.list_pod_for_all_namespaces()
    namespaces = await core.list_namespace()
    team = await core.read_namespace("team-a")

    assert pods.metadata.resource_version == created.metadata.resource_version
    assert {"default", "kube-system", "team-a"} <= {n.metadata.name for n in namespaces.items}
    assert team.status.phase == "Active"


# --- patch, update, delete ---------------------------------------------------------------------


async def test_merge_patch_with_stale_resource_version_conflicts_and_changes_nothing(
    core: CoreV1Api,
) -> None:
    created = await core.create_namespaced_pod("default", pod("p", annotations={"k": "v0"}))
    stale = created.metadata.resource_version
    await core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"k": "v1"}}})
    before = await core.read_namespaced_pod("p", "default")

    with pytest.raises(ApiException) as conflict:
        await merge_patch_pod(
            core, "p", {"metadata": {"resourceVersion": stale, "annotations": {"k": "lost"}}}
        )
    after_conflict = await core.read_namespaced_pod("p", "default")
    fresh = await merge_patch_pod(
        core,
        "p",
        {
            "metadata": {
                "resourceVersion": before.metadata.resource_version,
                "annotations": {"k": "v2"},
            }
        },
    )

    assert conflict.value.status == 409
    assert status_of(conflict.value)["reason"] == "Conflict"
    assert message_of(conflict.value) == (
        'Operation cannot be fulfilled on pods "p": the object has been modified; please apply '
        "your changes to the latest version and try again"
    )
    assert after_conflict.to_dict() == before.to_dict()
    assert fresh.metadata.annotations == {"k": "v2"}
    assert int(fresh.metadata.resource_version) > int(before.metadata.resource_version)


async def test_merge_patch_null_removes_a_key(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p", annotations={"keep": "1", "drop": "2"}))

    patched = await merge_patch_pod(core, "p", {"metadata": {"annotations": {"drop": None}}})

    assert patched.metadata.annotations == {"keep": "1"}


async def test_strategic_merge_patch_merges_annotations_and_containers_by_name(
    core: CoreV1Api,
) -> None:
    await core.create_namespaced_pod(
        "default", pod("p", annotations={"a": "1"}, containers=("first", "second"))
    )

    # A dict body is sent as application/strategic-merge-patch+json by the client.
    patched = await core.patch_namespaced_pod(
        "p",
        "default",
        {
            "metadata": {"annotations": {"b": "2"}},
            "spec": {"containers": [{"name": "second", "image": "busybox:2"}]},
        },
    )

    assert patched.metadata.annotations == {"a": "1", "b": "2"}
    assert [(c.name, c.image) for c in patched.spec.containers] == [
        ("first", "busybox"),
        ("second", "busybox:2"),
    ]


async def test_json_patch_applies_operations_in_order(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p", labels={"old": "1"}))

    patched = await core.patch_namespaced_pod(
        "p",
        "default",
        [
            {"op": "add", "path": "/metadata/labels/new", "value": "2"},
            {"op": "remove", "path": "/metadata/labels/old"},
            {"op": "test", "path": "/metadata/labels/new", "value": "2"},
        ],
    )
    with pytest.raises(ApiException) as failed:
        await core.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/labels/new", "value": "3"}]
        )

    assert patched.metadata.labels == {"new": "2"}
    assert failed.value.status == 422


async def test_unsupported_patch_type_is_415(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p"))

    with pytest.raises(ApiException) as refused:
        await core.patch_namespaced_pod(  # type: ignore[call-arg]
            "p", "default", {"a": 1}, _content_type="application/json"
        )

    assert refused.value.status == 415


async def test_put_honours_the_resource_version_precondition(core: CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("p"))
    created.metadata.labels = {"first": "write"}
    updated = await core.replace_namespaced_pod("p", "default", created)

    created.metadata.labels = {"second": "write"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as conflict:
        await core.replace_namespaced_pod("p", "default", created)
    unchanged = await core.read_namespaced_pod("p", "default")

    assert updated.metadata.labels == {"first": "write"}
    assert conflict.value.status == 409
    assert unchanged.metadata.labels == {"first": "write"}
    assert unchanged.metadata.uid == created.metadata.uid


async def test_writing_back_an_unchanged_object_is_not_a_write(core: CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("p", labels={"x": "1"}))

    same = await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})

    assert same.metadata.resource_version == created.metadata.resource_version


async def test_main_resource_writes_cannot_change_status_or_the_node(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p"))

    ignored = await core.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}})
    with pytest.raises(ApiException) as forbidden:
        await core.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "node-1"}})

    assert ignored.status.phase == "Pending"
    assert forbidden.value.status == 422
    assert "pod updates may not change fields" in message_of(forbidden.value)


async def test_delete_returns_the_object_and_honours_preconditions(core: CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("p"))

    with pytest.raises(ApiException) as wrong_uid:
        await core.delete_namespaced_pod(
            "p",
            "default",
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid")),
        )
    deleted = await core.delete_namespaced_pod("p", "default", grace_period_seconds=30)
    with pytest.raises(ApiException) as gone:
        await core.read_namespaced_pod("p", "default")

    assert wrong_uid.value.status == 409
    assert deleted.metadata.uid == created.metadata.uid
    assert gone.value.status == 404


# --- watch ---------------------------------------------------------------------------------------


async def test_watch_from_a_list_revision_sees_every_change_in_order(core: CoreV1Api) -> None:
    listed = await core.list_namespaced_pod("default")
    await core.create_namespaced_pod("default", pod("p"))
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"step": "2"}}})
    await core.delete_namespaced_pod("p", "default")

    events = await collect_events(core, 3, resource_version=listed.metadata.resource_version)

    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED", "DELETED"]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions == sorted(versions)
    assert versions[0] > int(listed.metadata.resource_version)
    assert events[1][1]["metadata"]["labels"] == {"step": "2"}
    assert events[1][1]["kind"] == "Pod"


async def test_watch_follows_changes_made_while_it_is_open(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p"))
    seen: list[str] = []

    async with watch.Watch() as stream, asyncio.timeout(WAIT_S):
        # Without a resourceVersion, a watch starts with the current objects as ADDED.
        async for event in stream.stream(core.list_namespaced_pod, "default", timeout_seconds=10):
            seen.append(event["type"])
            if event["type"] == "ADDED":
                await core.patch_namespaced_pod(
                    "p", "default", {"metadata": {"labels": {"x": "1"}}}
                )
            else:
                assert event["object"].metadata.labels == {"x": "1"}
                break

    assert seen == ["ADDED", "MODIFIED"]


async def test_a_selective_watch_sees_objects_enter_and_leave_its_selection(
    core: CoreV1Api,
) -> None:
    listed = await core.list_namespaced_pod("default", label_selector="app=web")
    await core.create_namespaced_pod("default", pod("p", labels={"app": "web"}))
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "db"}}})
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"other": "x"}}})
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "web"}}})

    events = await collect_events(
        core, 3, resource_version=listed.metadata.resource_version, label_selector="app=web"
    )

    # The change while it was outside the selection is not seen at all.
    assert [kind for kind, _ in events] == ["ADDED", "DELETED", "ADDED"]
    assert events[1][1]["metadata"]["labels"] == {"app": "web"}  # its last matching state


async def test_watch_from_a_compacted_revision_gets_410_gone(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    created = await core.create_namespaced_pod("default", pod("p"))
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    emulator.compact()

    with pytest.raises(ApiException) as expired:
        await collect_events(core, 1, resource_version=created.metadata.resource_version)

    assert expired.value.status == 410
    assert "too old resource version" in str(expired.value.reason)


async def test_history_is_bounded(tmp_path: Path) -> None:
    async with (
        KubeEmulator(history_limit=3) as emulator,
        api_client(emulator, tmp_path) as api,
    ):
        core = CoreV1Api(api)
        first = await core.create_namespaced_pod("default", pod("p0"))
        for index in range(1, 5):
            await core.create_namespaced_pod("default", pod(f"p{index}"))
        latest = await core.list_namespaced_pod("default")

        with pytest.raises(ApiException) as expired:
            await collect_events(core, 1, resource_version=first.metadata.resource_version)
        await core.delete_namespaced_pod("p4", "default")
        recent = await collect_events(core, 1, resource_version=latest.metadata.resource_version)

    assert expired.value.status == 410
    assert recent[0][0] == "DELETED"


async def test_a_quiet_watch_gets_bookmarks_when_it_allows_them(tmp_path: Path) -> None:
    async with (
        KubeEmulator(bookmark_interval_s=0.02) as emulator,
        api_client(emulator, tmp_path) as api,
    ):
        core = CoreV1Api(api)
        listed = await core.list_namespaced_pod("default")
        events = await collect_events(
            core,
            1,
            resource_version=listed.metadata.resource_version,
            allow_watch_bookmarks=True,
        )

    assert events == [
        (
            "BOOKMARK",
            {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": listed.metadata.resource_version},
            },
        )
    ]


async def test_a_watch_ends_at_its_timeout(core: CoreV1Api) -> None:
    seen = []
    async with watch.Watch() as stream, asyncio.timeout(WAIT_S + 1):
        async for event in stream.stream(
            core.list_namespaced_pod, "default", resource_version="1", timeout_seconds=1
        ):
            seen.append(event)

    assert seen == []


# --- pods/binding and pods/status ---------------------------------------------------------------


async def test_binding_sets_the_node_and_copies_annotations_and_labels(core: CoreV1Api) -> None:
    created = await core.create_namespaced_pod("default", pod("p", annotations={"mine": "1"}))
    to_node_1 = binding(
        "p",
        "node-1",
        uid=created.metadata.uid,
        annotations={"hami.io/bind-phase": "allocating"},
        labels={"topology.kubernetes.io/zone": "z1"},
    )

    # The client cannot read the Status the server answers with as a V1Binding, hence raw.
    raw = await core.create_namespaced_pod_binding(
        "p", "default", to_node_1, _preload_content=False
    )
    response = cast("aiohttp.ClientResponse", raw)
    answer = await response.json()
    bound = await core.read_namespaced_pod("p", "default")
    with pytest.raises(ApiException) as rebind:
        await core.create_namespaced_pod_binding("p", "default", to_node_1)

    assert response.status == 201
    assert answer == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    assert bound.spec.node_name == "node-1"
    assert bound.metadata.annotations == {"mine": "1", "hami.io/bind-phase": "allocating"}
    assert bound.metadata.labels == {"topology.kubernetes.io/zone": "z1"}
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    assert rebind.value.status == 409
    assert message_of(rebind.value) == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node '
        '"node-1"'
    )


async def test_binding_through_the_client_model_raises_its_known_value_error(
    core: CoreV1Api,
) -> None:
    await core.create_namespaced_pod("default", pod("p"))

    # kubernetes-asyncio reads the 201 Status as a V1Binding and fails after a successful bind.
    with pytest.raises(ValueError, match="Invalid value for `target`"):
        await core.create_namespaced_pod_binding("p", "default", binding("p", "node-1"))

    assert (await core.read_namespaced_pod("p", "default")).spec.node_name == "node-1"


async def test_binding_preconditions_are_checked(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p"))

    with pytest.raises(ApiException) as stale:
        await core.create_namespaced_pod_binding(
            "p", "default", binding("p", "node-1", uid="someone-else")
        )
    with pytest.raises(ApiException) as no_target:
        await core.create_namespaced_pod_binding("p", "default", binding("p", ""))

    assert stale.value.status == 409
    assert "Precondition failed: UID in precondition" in message_of(stale.value)
    assert no_target.value.status == 422
    assert (await core.read_namespaced_pod("p", "default")).spec.node_name is None


async def test_status_subresource_writes_only_the_status(core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p", labels={"a": "1"}))

    patched = await core.patch_namespaced_pod_status(
        "p",
        "default",
        {"metadata": {"labels": {"a": "ignored"}}, "status": {"phase": "Running"}},
    )
    patched.status.phase = "Succeeded"
    replaced = await core.replace_namespaced_pod_status("p", "default", patched)
    with pytest.raises(ApiException) as stale:
        await core.replace_namespaced_pod_status("p", "default", patched)

    assert patched.status.phase == "Succeeded"
    assert patched.metadata.labels == {"a": "1"}
    assert replaced.status.phase == "Succeeded"
    assert stale.value.status == 409


# --- nodes, events, resource quotas ----------------------------------------------------------


async def test_nodes_create_patch_status_and_select(core: CoreV1Api) -> None:
    node = client.V1Node(
        metadata=client.V1ObjectMeta(name="node-1", labels={"gpu": "true"}),
        status=client.V1NodeStatus(capacity={"nvidia.com/gpu": "8"}),
    )
    created = await core.create_node(node)
    await core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="node-2")))

    annotated = await core.patch_node(
        "node-1", {"metadata": {"annotations": {"hami.io/node-nvidia-register": "[]"}}}
    )
    status = await core.patch_node_status(
        "node-1", {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    )
    selected = await core.list_node(label_selector="gpu=true")
    unschedulable = await core.list_node(field_selector="spec.unschedulable=false")

    assert created.status.capacity == {"nvidia.com/gpu": "8"}  # a node keeps its status
    assert created.metadata.namespace is None
    assert annotated.metadata.annotations == {"hami.io/node-nvidia-register": "[]"}
    assert status.status.allocatable == {"nvidia.com/gpu": "8"}
    assert status.status.capacity == {"nvidia.com/gpu": "8"}
    assert names_of(selected) == ["node-1"]
    assert names_of(unschedulable) == ["node-1", "node-2"]


async def test_events_create_and_list_in_both_api_groups(api: ApiClient) -> None:
    core, events = CoreV1Api(api), client.EventsV1Api(api)
    legacy = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="p.1", namespace="default"),
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="default"),
        reason="Refit",
        message="moved to GPU-b",
        type="Normal",
        source=client.V1EventSource(component="numafit-accounting"),
        count=1,
    )
    modern = client.EventsV1Event(
        metadata=client.V1ObjectMeta(generate_name="p.", namespace="other"),
        event_time=dt.datetime(2025, 1, 1, 0, 0, 0, 123456, tzinfo=dt.UTC),
        reporting_controller="numafit.io/accounting",
        reporting_instance="accounting-0",
        action="Consume",
        reason="AllocationDrift",
        regarding=client.V1ObjectReference(kind="Pod", name="q", namespace="other"),
        note="kubelet allocated other GPUs",
        type="Warning",
    )

    await core.create_namespaced_event("default", legacy)
    created = await events.create_namespaced_event("other", modern)
    in_default = await core.list_namespaced_event("default")
    everywhere = await core.list_event_for_all_namespaces()
    # Only the new-style event: the client refuses to build an EventsV1Event without
    # eventTime, which a legacy event read through events.k8s.io/v1 lacks (as upstream).
    as_v1 = await events.list_namespaced_event("other")
    warnings = await core.list_event_for_all_namespaces(field_selector="type=Warning")

    assert created.note == "kubelet allocated other GPUs"
    assert [e.message for e in in_default.items] == ["moved to GPU-b"]
    assert {e.reason for e in everywhere.items} == {"Refit", "AllocationDrift"}
    assert [(e.note, e.regarding.name) for e in as_v1.items] == [
        ("kubelet allocated other GPUs", "q")
    ]
    assert [e.involved_object.name for e in warnings.items] == ["q"]


async def test_an_event_about_another_namespace_is_invalid(core: CoreV1Api) -> None:
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e"),
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="elsewhere"),
        reason="R",
        message="m",
    )

    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_event("default", event)

    assert refused.value.status == 422


async def test_resource_quotas_create_get_and_list(core: CoreV1Api) -> None:
    quota = client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="gpus"),
        spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "4"}),
    )
    await core.create_namespaced_resource_quota("team-a", quota)
    await core.create_namespaced_resource_quota("team-b", quota)

    fetched = await core.read_namespaced_resource_quota("gpus", "team-a")
    in_a = await core.list_namespaced_resource_quota("team-a")
    everywhere = await core.list_resource_quota_for_all_namespaces()

    assert fetched.spec.hard == {"requests.nvidia.com/gpu": "4"}
    assert [q.metadata.namespace for q in in_a.items] == ["team-a"]
    assert sorted(q.metadata.namespace for q in everywhere.items) == ["team-a", "team-b"]


# --- discovery, malformed requests -------------------------------------------------------------


async def test_discovery_documents(api: ApiClient) -> None:
    version = await client.VersionApi(api).get_code()
    versions = await client.CoreApi(api).get_api_versions()
    resources = await CoreV1Api(api).get_api_resources()
    groups = await client.ApisApi(api).get_api_versions()

    assert version.major == "1"
    assert versions.versions == ["v1"]
    names = {r.name for r in resources.resources}
    assert {"pods", "pods/binding", "pods/status", "nodes", "events", "resourcequotas"} <= names
    assert [g.name for g in groups.groups] == ["events.k8s.io", "topology.node.k8s.io"]


async def test_bad_json_is_400_and_an_unknown_path_is_404(emulator: KubeEmulator) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{emulator.url}/api/v1/namespaces/default/pods",
            data=b"{not json",
            headers={"Content-Type": "application/json"},
        ) as bad:
            bad_body = await bad.json()
        async with session.get(f"{emulator.url}/api/v1/widgets") as unknown:
            unknown_body = await unknown.json()

    assert bad.status == 400
    assert bad_body["reason"] == "BadRequest"
    assert bad_body["message"].startswith("couldn't get version/kind; json parse error")
    assert unknown.status == 404
    assert unknown_body["message"] == "the server could not find the requested resource"


# --- fault injection ---------------------------------------------------------------------------


async def test_an_injected_500_fails_the_matching_request_once(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("p"))
    emulator.faults.add(method="GET", path_regex=r"/pods/p$", status=500, times=1)

    with pytest.raises(ApiException) as failed:
        await core.read_namespaced_pod("p", "default")
    recovered = await core.read_namespaced_pod("p", "default")

    assert failed.value.status == 500
    assert status_of(failed.value)["reason"] == "InternalError"
    assert recovered.metadata.name == "p"
    assert emulator.faults.rules() == []


async def test_an_injected_delay_holds_one_request_and_nothing_else(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("slow"))
    await core.create_namespaced_pod("default", pod("fast"))
    emulator.faults.add(method="GET", path_regex=r"/pods/slow$", delay_s=30, times=1)

    slow = asyncio.create_task(
        awaited(core.read_namespaced_pod("slow", "default", _request_timeout=0.3))
    )
    fast = await core.read_namespaced_pod("fast", "default")
    fast_finished_first = not slow.done()
    with pytest.raises(TimeoutError):
        await slow

    assert fast.metadata.name == "fast"
    assert fast_finished_first
    assert (await core.read_namespaced_pod("slow", "default")).metadata.name == "slow"


async def test_an_injected_conflict_on_patch(emulator: KubeEmulator, core: CoreV1Api) -> None:
    await core.create_namespaced_pod("default", pod("p"))
    emulator.faults.add(method="PATCH", path_regex="/pods/p", status=409, times=1)

    with pytest.raises(ApiException) as conflict:
        await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "b"}}})

    assert conflict.value.status == 409
    assert status_of(conflict.value)["reason"] == "Conflict"


async def test_faults_over_the_admin_endpoint(emulator: KubeEmulator, core: CoreV1Api) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{emulator.url}/_emulator/faults",
            json={"method": "GET", "path_regex": "/api/v1/nodes$", "status": 503, "times": 1},
        ) as added:
            rule = await added.json()
        with pytest.raises(ApiException) as unavailable:
            await core.list_node()
        await core.list_node()
        async with session.post(
            f"{emulator.url}/_emulator/faults", json={"path_regex": "(", "status": 500}
        ) as invalid:
            invalid_status = invalid.status
        async with session.delete(f"{emulator.url}/_emulator/faults") as cleared:
            cleared_body = await cleared.json()

    assert added.status == 201
    assert rule["id"] >= 1
    assert rule["times"] == 1
    assert unavailable.value.status == 503
    assert invalid_status == 400
    assert cleared_body == {"rules": []}


async def read_event(stream: aiohttp.StreamReader) -> JSONDict:
    """The next non-empty line of a raw watch stream, decoded."""
    async with asyncio.timeout(WAIT_S):
        while True:
            line = await stream.readline()
            if not line:
                return {}  # the stream ended
            if line.strip():
                event: JSONDict = orjson.loads(line)
                return event


async def test_expiring_watches_ends_live_ones_with_410_and_forces_a_relist(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    created = await core.create_namespaced_pod("default", pod("p"))
    start = created.metadata.resource_version
    await core.create_namespaced_pod("default", pod("q"))
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{emulator.url}/api/v1/namespaces/default/pods",
            params={"watch": "true", "resourceVersion": start},
        ) as pods_watch,
        session.get(f"{emulator.url}/api/v1/nodes", params={"watch": "true"}) as nodes_watch,
    ):
        # Both watches are registered once their responses started.
        assert pods_watch.status == nodes_watch.status == 200
        replayed = await read_event(pods_watch.content)
        ended = emulator.expire_watches("pods")
        expired = await read_event(pods_watch.content)
        after_error = await read_event(pods_watch.content)
        await core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n1")))
        node_event = await read_event(nodes_watch.content)

    with pytest.raises(ApiException) as rewatch:
        await collect_events(core, 1, resource_version=start)
    listed = await core.list_namespaced_pod("default")
    await core.delete_namespaced_pod("p", "default")
    fresh = await collect_events(core, 1, resource_version=listed.metadata.resource_version)

    assert replayed["type"] == "ADDED" and replayed["object"]["metadata"]["name"] == "q"
    assert ended == 1
    assert expired["type"] == "ERROR"
    assert expired["object"]["code"] == 410 and expired["object"]["reason"] == "Expired"
    assert after_error == {}  # the watch ends after its ERROR event
    assert node_event["type"] == "ADDED"  # other resources' watches go on
    assert rewatch.value.status == 410  # the old revision is gone: only a relist helps
    assert fresh[0][0] == "DELETED"


async def test_expire_watches_over_the_admin_endpoint(emulator: KubeEmulator) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{emulator.url}/_emulator/expire-watches", json={"resource": "pods"}
        ) as expired:
            body = await expired.json()
        async with session.post(f"{emulator.url}/_emulator/expire-watches") as everything:
            everything_status = everything.status
        async with session.post(
            f"{emulator.url}/_emulator/expire-watches", json={"resource": "gadgets"}
        ) as unknown:
            unknown_status = unknown.status

    assert expired.status == 200 and body["expired"] == 0
    assert everything_status == 200
    assert unknown_status == 400


async def test_a_fault_can_fail_the_relist_but_not_the_watch(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("p"))
    rule = emulator.faults.add(
        method="GET", path_regex=r"/api/v1/pods", watch=False, status=500, times=1
    )

    # A watch matching the path is not affected...
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{emulator.url}/api/v1/pods", params={"watch": "true"}) as watching,
    ):
        first = await read_event(watching.content)
    # ... the next list is, once.
    with pytest.raises(ApiException) as failed:
        await core.list_pod_for_all_namespaces()
    recovered = await core.list_pod_for_all_namespaces()

    assert first["type"] == "ADDED"
    assert failed.value.status == 500
    assert names_of(recovered) == ["p"]
    assert rule.hits == 1 and emulator.faults.rules() == []


async def test_a_delayed_write_can_outlive_its_client(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("kept"))
    await core.create_namespaced_pod("default", pod("dropped"))
    emulator.faults.add(
        method="PATCH", path_regex="/pods/kept$", delay_s=0.3, outlive_client=True, times=1
    )
    emulator.faults.add(method="PATCH", path_regex="/pods/dropped$", delay_s=0.3, times=1)
    labels = {"metadata": {"labels": {"written": "yes"}}}

    for name in ("kept", "dropped"):
        with pytest.raises(TimeoutError):
            # The client gives up (and disconnects) long before the delay is over.
            await core.patch_namespaced_pod(name, "default", labels, _request_timeout=0.05)
    assert emulator.faults.in_flight >= 1
    async with asyncio.timeout(WAIT_S):
        while emulator.faults.in_flight:  # noqa: ASYNC110 - a counter with no notification
            await asyncio.sleep(0.01)
    kept = await core.read_namespaced_pod("kept", "default")
    dropped = await core.read_namespaced_pod("dropped", "default")

    # Like the API server, the write whose client went away still landed...
    assert kept.metadata.labels == {"written": "yes"}
    # ... while a plain delayed request is abandoned with its client.
    assert dropped.metadata.labels is None


async def test_fault_rule_fields_for_watches_and_outliving_clients(
    emulator: KubeEmulator,
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{emulator.url}/_emulator/faults",
            json={"path_regex": "/pods", "status": 410, "watch": True, "times": 1},
        ) as added:
            rule = await added.json()
        async with session.post(
            f"{emulator.url}/_emulator/faults",
            json={"path_regex": "/pods", "status": 500, "outlive_client": True},
        ) as no_delay:
            no_delay_status = no_delay.status
        async with session.post(
            f"{emulator.url}/_emulator/faults",
            json={"path_regex": "/pods", "status": 500, "watch": "yes"},
        ) as wrong_type:
            wrong_type_status = wrong_type.status
        async with session.get(f"{emulator.url}/_emulator/faults") as listed:
            live = await listed.json()

    assert added.status == 201 and rule["watch"] is True and rule["outlive_client"] is False
    assert no_delay_status == 400  # outliving the client only means something for a delay
    assert wrong_type_status == 400
    assert live["in_flight"] == 0 and [r["id"] for r in live["rules"]] == [rule["id"]]


# --- admission -----------------------------------------------------------------------------------


async def test_the_admission_hook_can_refuse_a_pod(emulator: KubeEmulator, core: CoreV1Api) -> None:
    seen: list[AdmissionRequest] = []

    async def refuse_invalid_alignment(request: AdmissionRequest) -> JSONDict | None:
        seen.append(request)
        annotations = request.object["metadata"].get("annotations", {})
        if annotations.get("hami.io/numa-alignment") not in (None, "best-effort", "strict"):
            raise AdmissionDenied(
                "hami.io/numa-alignment must be best-effort or strict",
                webhook="numafit.numafit.io",
            )
        return None

    emulator.admission = refuse_invalid_alignment
    with pytest.raises(ApiException) as denied:
        await core.create_namespaced_pod(
            "default", pod("p", annotations={"hami.io/numa-alignment": "sometimes"})
        )
    with pytest.raises(ApiException) as missing:
        await core.read_namespaced_pod("p", "default")
    admitted = await core.create_namespaced_pod("default", pod("ok"))

    assert denied.value.status == 400
    assert message_of(denied.value) == (
        'admission webhook "numafit.numafit.io" denied the request: '
        "hami.io/numa-alignment must be best-effort or strict"
    )
    assert missing.value.status == 404
    assert admitted.metadata.name == "ok"
    assert [(r.operation, r.name, r.namespace) for r in seen] == [
        ("CREATE", "p", "default"),
        ("CREATE", "ok", "default"),
    ]
    assert "uid" not in seen[0].object["metadata"]  # uids are assigned after admission


async def test_the_admission_hook_can_mutate_pods_on_create_and_update(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    async def route_to_numafit(request: AdmissionRequest) -> JSONDict:
        mutated = request.object
        mutated["metadata"].setdefault("labels", {})["admitted"] = request.operation.lower()
        return mutated

    emulator.admission = route_to_numafit
    created = await core.create_namespaced_pod("default", pod("p"))
    updated = await core.patch_namespaced_pod(
        "p", "default", {"metadata": {"annotations": {"a": "b"}}}
    )

    assert created.metadata.labels == {"admitted": "create"}
    assert updated.metadata.labels == {"admitted": "update"}


async def test_an_update_that_loses_a_race_during_admission_is_recomputed(
    emulator: KubeEmulator, core: CoreV1Api
) -> None:
    await core.create_namespaced_pod("default", pod("p"))
    first_update_waiting, release_first_update = asyncio.Event(), asyncio.Event()
    updates: list[JSONDict] = []

    async def slow_first_update(request: AdmissionRequest) -> None:
        if request.operation == "UPDATE":
            updates.append(request.object["metadata"].get("labels", {}))
            if len(updates) == 1:
                first_update_waiting.set()
                await release_first_update.wait()

    emulator.admission = slow_first_update
    slow = asyncio.create_task(
        awaited(core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "1"}}}))
    )
    async with asyncio.timeout(WAIT_S):
        await first_update_waiting.wait()
    await core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"b": "2"}}})
    release_first_update.set()
    async with asyncio.timeout(WAIT_S):
        merged = await slow

    # The slow patch is re-applied to the object the fast one wrote, as GuaranteedUpdate does.
    assert merged.metadata.labels == {"a": "1", "b": "2"}
    assert updates == [{"a": "1"}, {"b": "2"}, {"a": "1", "b": "2"}]


async def test_stopping_the_emulator_ends_open_watches_at_once(emulator: KubeEmulator) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{emulator.url}/api/v1/namespaces?watch=true") as response,
    ):
        first = orjson.loads(await response.content.readline())
        async with asyncio.timeout(WAIT_S):
            await emulator.stop()
            rest = await response.read()

    assert first["type"] == "ADDED"
    assert first["object"]["kind"] == "Namespace"
    assert rest.count(b"\n") == 1  # the other initial namespace, then the end of the stream


# --- the command line ----------------------------------------------------------------------------


def test_cli_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])

    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--port", "--host", "--kubeconfig-out"):
        assert flag in help_text


async def test_cli_serves_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shared.testing.kube_emulator",
        "--port",
        "0",
        "--kubeconfig-out",
        str(kubeconfig),
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(5):
            while (line := await process.stderr.readline()) and (
                orjson.loads(line).get("msg") != "ready"
            ):
                pass
        assert line, "the emulator exited before it was ready"
        configuration = Configuration()
        await config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        async with ApiClient(configuration=configuration) as api:
            created = await CoreV1Api(api).create_namespaced_pod("default", pod("p"))
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(5):
            _, rest = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()

    assert created.metadata.name == "p"
    assert process.returncode == 0
    logged = [orjson.loads(line) for line in rest.splitlines()]
    assert {"msg": "shutting down", "signal": "SIGTERM"}.items() <= logged[0].items()


# --- the pure pieces -----------------------------------------------------------------------------


def test_label_selector_grammar() -> None:
    labels = {"app": "web", "tier": "2", "empty": ""}

    assert parse_label_selector("").matches({})
    assert parse_label_selector("app=web, tier in (1,2)").matches(labels)
    assert parse_label_selector("empty=").matches(labels)
    assert parse_label_selector("tier<3,tier>1").matches(labels)
    assert not parse_label_selector("tier>2").matches(labels)
    assert not parse_label_selector("app notin (web)").matches(labels)
    assert parse_label_selector("example.com/key!=x").matches(labels)
    for malformed in ("app in ()", "app=web,", "=web", "app in (a", "app >x", "a b"):
        with pytest.raises(SelectorError):
            parse_label_selector(malformed)


def test_field_selector_grammar() -> None:
    selector = parse_field_selector(r"metadata.name=a\,b,status.phase!=Failed")

    assert selector.matches({"metadata.name": "a,b", "status.phase": "Running"})
    assert not selector.matches({"metadata.name": "a,b", "status.phase": "Failed"})
    with pytest.raises(SelectorError):
        parse_field_selector("justaword")


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    patch = {"a": "z", "c": {"f": None}}

    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}}
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert merge_patch({"a": "b"}, ["c"]) == ["c"]


def test_strategic_merge_patch_directives() -> None:
    target = {
        "containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}],
        "finalizers": ["x"],
        "tolerations": [{"key": "old"}],
    }
    patch = {
        "containers": [{"name": "a", "$patch": "delete"}, {"name": "c", "image": "3"}],
        "finalizers": ["y"],
        "tolerations": [{"key": "new"}],
        "$setElementOrder/containers": [{"name": "b"}, {"name": "c"}],
    }

    assert strategic_merge_patch(target, patch) == {
        "containers": [{"name": "b", "image": "1"}, {"name": "c", "image": "3"}],
        "finalizers": ["x", "y"],
        "tolerations": [{"key": "new"}],
    }
    with pytest.raises(PatchError):
        strategic_merge_patch({"containers": []}, {"containers": [{"image": "no-name"}]})


def test_json_patch_operations() -> None:
    document = {"a": {"b": [1, 2]}, "c": 1}

    result = json_patch(
        document,
        [
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "move", "from": "/c", "path": "/d"},
            {"op": "copy", "from": "/d", "path": "/e~1f"},
            {"op": "replace", "path": "/a/b/0", "value": 0},
        ],
    )

    assert result == {"a": {"b": [0, 2, 3]}, "d": 1, "e/f": 1}
    for bad in (
        [{"op": "remove", "path": "/missing"}],
        [{"op": "add", "path": "/a/b/9", "value": 1}],
        [{"op": "frobnicate", "path": "/a"}],
    ):
        with pytest.raises(PatchError):
            json_patch({"a": {"b": []}}, bad)
