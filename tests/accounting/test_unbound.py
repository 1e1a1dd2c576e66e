"""The unbound GPU pods accounting's pod watch shows: a filter's reserve reads its pod there
instead of from the API server, unless accounting knows a newer version of it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from shared.core.config import CoreConfig
from shared.core.pods import PodInfo, pod_from_object
from svc_accounting.unbound import UnboundPods
from tests.builders import container, pod
from tests.integration.harness import harness, wait_for
from tests.integration.test_accounting_reliability import objects, revision, uid_rv
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path

    import pytest


def unbound_pod(name: str = "fresh", version: str = "10", **kw: Any) -> PodInfo:
    obj = pod(name, containers=[container("app", 1, 20000)], namespace="ml", node_name="", **kw)
    obj["metadata"].update(uid=f"uid-{name}", resourceVersion=version)
    return pod_from_object(obj)


def test_an_unbound_gpu_pod_is_kept_until_it_is_bound_or_ends() -> None:
    index = UnboundPods(CoreConfig())
    fresh = unbound_pod()
    index.observe(fresh)
    assert index.get("uid-fresh", "ml", "fresh") is fresh
    bound = dataclasses.replace(fresh, node_name="node-1", resource_version="11")
    index.observe(bound)
    assert index.get("uid-fresh", "ml", "fresh") is None
    index.observe(dataclasses.replace(fresh, resource_version="12"))
    index.observe(dataclasses.replace(fresh, phase="Failed", resource_version="13"))
    assert len(index) == 0
    index.observe(dataclasses.replace(fresh, resource_version="14"))
    index.observe(dataclasses.replace(fresh, deleting=True, resource_version="15"))
    assert len(index) == 0


def test_pods_without_gpus_are_not_kept() -> None:
    index = UnboundPods(CoreConfig())
    plain = pod("web", containers=[], namespace="ml", node_name="")
    plain["spec"]["containers"] = [{"name": "app", "image": "x"}]
    plain["metadata"].update(uid="uid-web", resourceVersion="3")
    index.observe(pod_from_object(plain))
    assert len(index) == 0


def test_a_stale_event_does_not_replace_a_newer_one() -> None:
    index = UnboundPods(CoreConfig())
    newer = unbound_pod(version="20")
    index.observe(newer)
    index.observe(unbound_pod(version="19"))
    assert index.get("uid-fresh", "ml", "fresh") is newer


def test_a_version_accounting_knows_otherwise_wins_if_newer() -> None:
    index = UnboundPods(CoreConfig())
    index.observe(unbound_pod(version="20"))
    assert index.get("uid-fresh", "ml", "fresh", known=["20", "7"]) is not None
    assert index.get("uid-fresh", "ml", "fresh", known=["21"]) is None
    assert index.get("uid-fresh", "ml", "other") is None  # another name: read it again
    assert index.get("uid-fresh", "default", "fresh") is None


def test_it_is_bounded_and_a_full_list_prunes_it() -> None:
    index = UnboundPods(CoreConfig(), limit=2)
    for name in ("a", "b", "c"):
        index.observe(unbound_pod(name))
    assert len(index) == 2 and index.get("uid-c", "ml", "c") is None
    index.retain(["uid-b"])
    assert index.get("uid-a", "ml", "a") is None and index.get("uid-b", "ml", "b") is not None
    index.forget("uid-b")
    assert len(index) == 0


async def test_a_reserve_reads_a_watched_pod_without_asking_the_api_server(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = pod("fresh", containers=[container("app", 1, 20000)], namespace="ml", node_name="")
    async with harness(nats_url, tmp_path, objects(fresh), with_refit=False) as h:
        assert h.accounting is not None
        accounting = h.accounting
        uid, _ = await uid_rv(h, "fresh")
        kube = accounting.ops.writes.kube
        real_get = kube.get_pod
        reads: list[str] = []

        async def counted(namespace: str, name: str) -> dict[str, Any]:
            reads.append(f"{namespace}/{name}")
            return await real_get(namespace, name)

        monkeypatch.setattr(kube, "get_pod", counted)
        body = {"podUID": uid, "podNamespace": "ml", "podName": "fresh"}
        reply = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,0:;"),
        )
        assert reply["ok"], reply
        assert reads == []

        # A pod the watch has not delivered yet is read from the API server.
        accounting.unbound.forget(uid)
        again = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,0:;"),
        )
        assert again["ok"], again
        assert reads == ["ml/fresh"]


async def test_a_pod_bound_meanwhile_is_refused_once_the_watch_shows_it(
    nats_url: str, tmp_path: Path
) -> None:
    fresh = pod("fresh", containers=[container("app", 1, 20000)], namespace="ml", node_name="")
    async with harness(nats_url, tmp_path, objects(fresh), with_refit=False) as h:
        assert h.accounting is not None and h.kube is not None
        accounting = h.accounting
        uid, _ = await uid_rv(h, "fresh")
        await wait_for(lambda: accounting.unbound.get(uid, "ml", "fresh") is not None)
        await h.kube.create_binding("ml", "fresh", uid, "node-1")
        await wait_for(lambda: accounting.unbound.get(uid, "ml", "fresh") is None)
        body = {"podUID": uid, "podNamespace": "ml", "podName": "fresh"}
        reply = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,0:;"),
        )
        assert reply["code"] == "invalid_request" and "already bound" in reply["error"], reply


async def test_a_recreated_pod_is_the_new_one(nats_url: str, tmp_path: Path) -> None:
    """Deleted and created again under its name: the old uid is gone from the index."""
    fresh = pod("fresh", containers=[container("app", 1, 20000)], namespace="ml", node_name="")
    async with harness(nats_url, tmp_path, objects(fresh), with_refit=False) as h:
        assert h.accounting is not None and h.kube is not None
        accounting = h.accounting
        old_uid, _ = await uid_rv(h, "fresh")
        await h.kube.delete_pod("ml", "fresh")
        await h.create("pod", for_create(fresh))
        new_uid, _ = await uid_rv(h, "fresh")
        await wait_for(lambda: accounting.unbound.get(new_uid, "ml", "fresh") is not None)
        assert accounting.unbound.get(old_uid, "ml", "fresh") is None
        body = {"podUID": old_uid, "podNamespace": "ml", "podName": "fresh"}
        reply = await h.client.call(
            "reserve",
            "node-1",
            dict(body, revision=await revision(h), allocated="GPU-b,NVIDIA,20000,0:;"),
        )
        assert reply["code"] == "pod_mismatch", reply
