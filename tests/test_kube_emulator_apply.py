"""Server-side apply: create if absent, own what you apply, drop what you stop applying,
conflict with other managers' different values unless forced, and keep managedFields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from shared.testing.kube_emulator import KubeEmulator
from shared.testing.kube_emulator import apply as server_side_apply
from shared.testing.kube_emulator.resources import PODS
from tests.test_kube_emulator_dry_run import DRY, Raw

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

APPLY = "application/apply-patch+yaml"
POD = "/api/v1/namespaces/default/pods/web"


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def raw(emulator: KubeEmulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(emulator, session)


def config(labels: dict[str, str] | None = None, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "labels": labels if labels is not None else {"app": "web"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", **container}]},
    }


async def apply(raw: Raw, body: Any, manager: str = "ci", **params: str) -> tuple[int, Any]:
    status, answer, _ = await raw.call(
        "PATCH", POD, body, content_type=APPLY, params={"fieldManager": manager, **params}
    )
    return status, answer


def managers(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["manager"], e["operation"]) for e in obj["metadata"].get("managedFields", [])]


async def test_apply_creates_then_changes_nothing_when_repeated(raw: Raw) -> None:
    created_status, created = await apply(raw, config())
    again_status, again = await apply(raw, config())

    assert created_status == 201
    assert again_status == 200
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert managers(created) == [("ci", "Apply")]
    assert created["metadata"]["managedFields"][0]["fieldsV1"] == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}}},
    }
    assert created["spec"]["schedulerName"] == "default-scheduler"  # created like any pod


def test_reapplying_later_changes_nothing_not_even_the_time() -> None:
    created = server_side_apply.apply(
        PODS, None, config(), manager="ci", force=False, subresource="", now="2026-01-01T00:00:00Z"
    )
    again = server_side_apply.apply(
        PODS,
        created,
        config(),
        manager="ci",
        force=False,
        subresource="",
        now="2026-01-01T01:00:00Z",
    )
    changed = server_side_apply.apply(
        PODS,
        created,
        config(image="nginx"),
        manager="ci",
        force=False,
        subresource="",
        now="2026-01-01T02:00:00Z",
    )

    assert again == created
    assert changed["metadata"]["managedFields"][0]["time"] == "2026-01-01T02:00:00Z"


async def test_a_yaml_configuration_is_read_as_yaml(raw: Raw) -> None:
    text = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - {name: main, image: busybox}\n"

    status, answer, _ = await raw.call(
        "PATCH", POD, raw=text, content_type=APPLY, params={"fieldManager": "ci"}
    )

    assert status == 201
    assert answer["spec"]["containers"][0]["image"] == "busybox"


async def test_fields_no_longer_applied_are_removed(raw: Raw) -> None:
    await apply(raw, config({"app": "web", "tier": "gpu"}))

    _, applied = await apply(raw, config({"app": "web"}))

    assert applied["metadata"]["labels"] == {"app": "web"}


async def test_fields_another_manager_also_owns_stay(raw: Raw) -> None:
    await apply(raw, config({"app": "web", "tier": "gpu"}), manager="first")
    await apply(raw, config({"tier": "gpu"}), manager="second")

    _, applied = await apply(raw, config({"app": "web"}), manager="first")

    assert applied["metadata"]["labels"] == {"app": "web", "tier": "gpu"}
    assert managers(applied) == [("first", "Apply"), ("second", "Apply")]


async def test_list_items_merge_by_key(raw: Raw) -> None:
    node = "/api/v1/nodes/n1"
    base = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "b"}}}

    async def apply_status(manager: str, *conditions: dict[str, str]) -> Any:
        body = {**base, "status": {"conditions": list(conditions)}}
        return await raw.ok(
            "PATCH", f"{node}/status", body, content_type=APPLY, params={"fieldManager": manager}
        )

    await raw.ok("PATCH", node, base, content_type=APPLY, params={"fieldManager": "admin"})
    await apply_status("kubelet", {"type": "Ready", "status": "True"})
    await apply_status("detector", {"type": "DiskPressure", "status": "False"})
    updated = await apply_status("kubelet", {"type": "Ready", "status": "False"})

    assert updated["status"]["conditions"] == [
        {"type": "Ready", "status": "False"},
        {"type": "DiskPressure", "status": "False"},
    ]
    assert managers(updated) == [
        ("admin", "Apply"),
        ("kubelet", "Apply"),
        ("detector", "Apply"),
    ]
    assert [e.get("subresource") for e in updated["metadata"]["managedFields"]] == [
        None,
        "status",
        "status",
    ]


async def test_a_list_map_key_the_server_defaults_identifies_the_item(raw: Raw) -> None:
    _, created = await apply(raw, config(ports=[{"containerPort": 80}]))

    owned = created["metadata"]["managedFields"][0]["fieldsV1"]
    container = owned["f:spec"]["f:containers"]['k:{"name":"main"}']
    assert 'k:{"containerPort":80,"protocol":"TCP"}' in container["f:ports"]
    assert created["spec"]["containers"][0]["ports"] == [{"containerPort": 80, "protocol": "TCP"}]


async def test_a_different_value_conflicts_unless_forced(raw: Raw) -> None:
    await apply(raw, config(), manager="first")

    status, refusal = await apply(raw, config({"app": "other"}), manager="second")
    kept = await raw.ok("GET", POD)
    forced_status, forced = await apply(
        raw, config({"app": "other"}), manager="second", force="true"
    )

    assert status == 409
    assert refusal["reason"] == "Conflict"
    assert refusal["message"] == (
        'Apply failed with 1 conflict: conflict with "first" using v1: .metadata.labels.app'
    )
    assert refusal["details"]["causes"] == [
        {
            "reason": "FieldManagerConflict",
            "message": 'conflict with "first" using v1',
            "field": ".metadata.labels.app",
        }
    ]
    assert kept["metadata"]["labels"] == {"app": "web"}
    assert forced_status == 200
    assert forced["metadata"]["labels"] == {"app": "other"}
    owned = {e["manager"]: e["fieldsV1"] for e in forced["metadata"]["managedFields"]}
    assert "f:metadata" not in owned["first"]
    assert owned["second"]["f:metadata"] == {"f:labels": {"f:app": {}}}


async def test_an_equal_value_is_shared_not_a_conflict(raw: Raw) -> None:
    await apply(raw, config(), manager="first")

    status, _ = await apply(raw, config(), manager="second")

    assert status == 200


async def test_other_writes_take_over_the_fields_they_change(raw: Raw) -> None:
    await apply(raw, config())
    await raw.ok(
        "PATCH",
        POD,
        {"metadata": {"labels": {"app": "patched"}}},
        content_type="application/merge-patch+json",
        params={"fieldManager": "patcher"},
    )

    status, refusal = await apply(raw, config())

    assert status == 409
    assert 'conflict with "patcher"' in refusal["message"]


async def test_fields_written_before_the_first_apply_belong_to_before_first_apply(
    raw: Raw,
) -> None:
    await raw.ok("POST", "/api/v1/namespaces/default/pods", config())

    status, refusal = await apply(raw, config(image="nginx"))

    assert status == 409
    assert 'conflict with "before-first-apply"' in refusal["message"]
    assert '.spec.containers[name="main"].image' in refusal["message"]


async def test_a_dry_run_apply_stores_nothing(raw: Raw) -> None:
    revision = await raw.revision()

    status, answer = await apply(raw, config(), **DRY)

    assert status == 201
    assert answer["metadata"]["name"] == "web"
    assert (await raw.call("GET", POD))[0] == 404
    assert await raw.revision() == revision


@pytest.mark.parametrize(
    ("body", "params", "status", "words"),
    [
        (config(), {}, 422, "fieldManager: Required value: is required for apply patch"),
        ({"metadata": {"name": "web"}}, {"fieldManager": "ci"}, 400, "'apiVersion' is missing"),
        (
            {**config(), "kind": "Node"},
            {"fieldManager": "ci"},
            400,
            "the object provided is unrecognized",
        ),
        (
            {**config(), "metadata": {"name": "web", "managedFields": []}},
            {"fieldManager": "ci"},
            400,
            "metadata.managedFields must be nil",
        ),
        (["not", "an", "object"], {"fieldManager": "ci"}, 400, "must be an object"),
        (config(), {"fieldManager": "ci", "force": "maybe"}, 400, "invalid syntax"),
    ],
)
async def test_bad_apply_requests_are_refused(
    raw: Raw, body: Any, params: dict[str, str], status: int, words: str
) -> None:
    answered, answer, _ = await raw.call("PATCH", POD, body, content_type=APPLY, params=params)

    assert answered == status
    assert words in answer["message"]


async def test_force_is_only_for_apply(raw: Raw) -> None:
    await apply(raw, config())

    status, answer, _ = await raw.call(
        "PATCH",
        POD,
        {"metadata": {"labels": {"x": "y"}}},
        content_type="application/merge-patch+json",
        params={"force": "true"},
    )

    assert status == 422
    assert "force: Forbidden: may not be specified for non-apply patch" in answer["message"]


async def test_yaml_aliases_are_refused(raw: Raw) -> None:
    text = b"a: &x [1, 2]\nb: *x\n"

    status, answer, _ = await raw.call(
        "PATCH", POD, raw=text, content_type=APPLY, params={"fieldManager": "ci"}
    )

    assert status == 400
    assert "aliases" in answer["message"]
