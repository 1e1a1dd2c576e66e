"""Dry runs (`dryRun=All`) on every verb: the answer a write would get, and no write.

Each test records the store's revision and opens a watch from it; after the dry runs the
revision must be unchanged and the first event the watch delivers must be a real write made
afterwards, which proves the dry runs emitted nothing. Waits are bounded by asyncio.timeout.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from shared.testing.kube_emulator import AdmissionRequest, KubeEmulator
from shared.testing.kube_emulator.remote_webhook import remote_webhook

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from multidict import CIMultiDictProxy

    from shared.testing.kube_emulator.objects import JSONDict

WAIT_S = 5.0
PODS = "/api/v1/namespaces/default/pods"


class Raw:
    """Plain HTTP against the emulator: status, body and headers of each answer."""

    def __init__(self, emulator: KubeEmulator, session: aiohttp.ClientSession) -> None:
        self.emulator = emulator
        self.session = session

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any, CIMultiDictProxy[str]]:
        data = raw if raw is not None else (None if body is None else orjson.dumps(body))
        sent = dict(headers or {})
        if data is not None:
            sent["Content-Type"] = content_type
        async with self.session.request(
            method, self.emulator.url + path, data=data, params=params, headers=sent
        ) as response:
            payload = await response.read()
            return response.status, orjson.loads(payload) if payload else None, response.headers

    async def ok(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, answer, _ = await self.call(method, path, body, **kwargs)
        assert status < 300, answer
        return answer

    async def revision(self) -> str:
        listed = await self.ok("GET", "/api/v1/namespaces")
        return str(listed["metadata"]["resourceVersion"])

    async def first_event(self, path: str, since: str) -> JSONDict:
        async with (
            asyncio.timeout(WAIT_S),
            self.session.get(
                self.emulator.url + path, params={"watch": "true", "resourceVersion": since}
            ) as stream,
        ):
            event: JSONDict = orjson.loads(await stream.content.readline())
            return event


def pod_body(name: str = "p", **spec: Any) -> JSONDict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


DRY = {"dryRun": "All"}


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
async def raw(emulator: KubeEmulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(emulator, session)


async def test_a_dry_run_create_answers_the_object_and_stores_nothing(raw: Raw) -> None:
    revision = await raw.revision()
    body = pod_body()
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "web-"
    body["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}

    status, created, _ = await raw.call("POST", PODS, body, params=DRY)
    in_new_namespace, _, _ = await raw.call(
        "POST", "/api/v1/namespaces/fresh/pods", pod_body(), params=DRY
    )

    assert status == 201
    meta = created["metadata"]
    assert meta["name"].startswith("web-") and len(meta["name"]) == len("web-") + 5
    assert meta["uid"] and meta["creationTimestamp"]
    assert "resourceVersion" not in meta
    assert created["spec"]["schedulerName"] == "default-scheduler"  # defaulted
    assert created["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "1"}
    assert created["status"] == {"phase": "Pending"}
    assert in_new_namespace == 201
    assert (await raw.ok("GET", PODS))["items"] == []
    assert (await raw.call("GET", "/api/v1/namespaces/fresh"))[0] == 404
    assert await raw.revision() == revision


async def test_a_dry_run_create_of_an_existing_name_conflicts(raw: Raw) -> None:
    await raw.ok("POST", PODS, pod_body())

    status, answer, _ = await raw.call("POST", PODS, pod_body(), params=DRY)

    assert status == 409
    assert answer["reason"] == "AlreadyExists"


async def test_dry_run_updates_patches_deletes_and_bindings_change_nothing(raw: Raw) -> None:
    created = await raw.ok("POST", PODS, pod_body())
    path = f"{PODS}/p"
    revision = await raw.revision()
    first_event = asyncio.create_task(raw.first_event(PODS, revision))
    replaced_body = {**created, "metadata": {**created["metadata"], "labels": {"app": "b"}}}

    replaced = await raw.ok("PUT", path, replaced_body, params=DRY)
    merged = await raw.ok(
        "PATCH",
        path,
        {"metadata": {"labels": {"tier": "x"}}},
        content_type="application/merge-patch+json",
        params=DRY,
    )
    strategic = await raw.ok(
        "PATCH",
        path,
        {"spec": {"containers": [{"name": "main", "image": "nginx"}]}},
        content_type="application/strategic-merge-patch+json",
        params=DRY,
    )
    json_patched = await raw.ok(
        "PATCH",
        path,
        [{"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}}],
        content_type="application/json-patch+json",
        params=DRY,
    )
    status_patched = await raw.ok(
        "PATCH",
        f"{path}/status",
        {"status": {"phase": "Running"}},
        content_type="application/merge-patch+json",
        params=DRY,
    )
    bound = await raw.ok(
        "POST",
        f"{path}/binding",
        {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}},
        params=DRY,
    )
    deleted = await raw.ok("DELETE", path, {"dryRun": ["All"]})
    deleted_by_query = await raw.ok("DELETE", path, params=DRY)

    assert replaced["metadata"]["labels"] == {"app": "b"}
    assert merged["metadata"]["labels"] == {"app": "a", "tier": "x"}
    assert strategic["spec"]["containers"][0]["image"] == "nginx"
    assert json_patched["metadata"]["annotations"] == {"a": "1"}
    assert status_patched["status"]["phase"] == "Running"
    assert bound["status"] == "Success"
    for answer in (replaced, merged, strategic, json_patched, status_patched):
        # An update's dry run answers the version the object still has.
        assert answer["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert deleted == created
    assert deleted_by_query == created
    assert await raw.ok("GET", path) == created
    assert await raw.revision() == revision
    await raw.ok(
        "PATCH",
        path,
        {"metadata": {"labels": {"real": "write"}}},
        content_type="application/merge-patch+json",
    )
    event = await first_event
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"]["labels"] == {"app": "a", "real": "write"}


async def test_a_dry_run_is_still_validated(raw: Raw) -> None:
    invalid = pod_body()
    invalid["spec"]["containers"] = []
    await raw.ok("POST", PODS, pod_body())

    create_status, _, _ = await raw.call(
        "POST", PODS, invalid | {"metadata": {"name": "q"}}, params=DRY
    )
    update_status, answer, _ = await raw.call(
        "PATCH",
        f"{PODS}/p",
        {"spec": {"nodeName": "elsewhere"}},
        content_type="application/merge-patch+json",
        params=DRY,
    )

    assert create_status == 422
    assert update_status == 422
    assert "pod updates may not change fields" in answer["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type", "options"),
    [
        ("POST", PODS, pod_body(), "application/json", "CreateOptions"),
        ("PUT", f"{PODS}/p", pod_body(), "application/json", "UpdateOptions"),
        ("PATCH", f"{PODS}/p", {}, "application/merge-patch+json", "PatchOptions"),
        ("DELETE", f"{PODS}/p", None, "application/json", "DeleteOptions"),
    ],
)
async def test_an_unknown_dry_run_value_is_refused_like_upstream(
    raw: Raw, method: str, path: str, body: Any, content_type: str, options: str
) -> None:
    await raw.ok("POST", PODS, pod_body())
    revision = await raw.revision()

    status, answer, _ = await raw.call(
        method, path, body, content_type=content_type, params={"dryRun": "Bogus"}
    )

    assert status == 422
    assert answer["reason"] == "Invalid"
    assert answer["message"] == (
        f'{options}.meta.k8s.io "" is invalid: dryRun: Unsupported value: '
        '[]string{"Bogus"}: supported values: "All"'
    )
    assert await raw.revision() == revision


async def test_a_dry_run_in_delete_options_must_be_a_list_of_all(raw: Raw) -> None:
    await raw.ok("POST", PODS, pod_body())

    wrong_value, _, _ = await raw.call("DELETE", f"{PODS}/p", {"dryRun": ["Some"]})
    wrong_type, _, _ = await raw.call("DELETE", f"{PODS}/p", {"dryRun": "All"})

    assert wrong_value == 422
    assert wrong_type == 400
    assert (await raw.call("GET", f"{PODS}/p"))[0] == 200


async def test_admission_is_told_about_a_dry_run_and_still_decides(
    emulator: KubeEmulator, raw: Raw
) -> None:
    seen: list[tuple[str, bool]] = []

    async def hook(request: AdmissionRequest) -> JSONDict | None:
        seen.append((request.operation, request.dry_run))
        patched = request.object
        patched["metadata"].setdefault("annotations", {})["admitted"] = "yes"
        return patched

    emulator.admission = hook

    created = await raw.ok("POST", PODS, pod_body(), params=DRY)
    await raw.ok("POST", PODS, pod_body())
    await raw.ok(
        "PATCH",
        f"{PODS}/p",
        {"metadata": {"labels": {"x": "y"}}},
        content_type="application/merge-patch+json",
        params=DRY,
    )

    assert created["metadata"]["annotations"] == {"admitted": "yes"}
    assert seen == [("CREATE", True), ("CREATE", False), ("UPDATE", True)]


async def test_a_remote_webhook_gets_dry_run_in_its_review(
    emulator: KubeEmulator, raw: Raw
) -> None:
    reviews: list[JSONDict] = []

    async def webhook(request: web.Request) -> web.Response:
        review = await request.json()
        reviews.append(review["request"])
        return web.json_response({"response": {"uid": review["request"]["uid"], "allowed": True}})

    app = web.Application()
    app.router.add_post("/webhook", webhook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        emulator.admission = remote_webhook(f"http://127.0.0.1:{port}/webhook")
        await raw.ok("POST", PODS, pod_body(), params=DRY)
        await raw.ok("POST", PODS, pod_body())
    finally:
        await runner.cleanup()

    assert [r["dryRun"] for r in reviews] == [True, False]
