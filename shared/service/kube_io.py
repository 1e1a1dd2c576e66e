"""Raw-JSON Kubernetes calls the services make, with errors translated at this one edge.

Responses are read as raw JSON (`_preload_content=False`) and handed to the core's parsers:
the generated models would cost a deserialization per object and per watch event for fields
nobody reads. Callers bound every call with `asyncio.timeout` (a write's budget is the caller's
remaining deadline); a 409 becomes `Conflict`, a 404 `NotFound`, anything else `KubeError`.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping


class KubeError(Exception):
    """An API call failed (status in `.status`, 0 when no HTTP answer came back)."""

    def __init__(self, message: str, status: int = 0, *, sent: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.sent = sent
        """False when the request provably never reached the server (no connection)."""

    @property
    def outcome_unknown(self) -> bool:
        """A write failing like this may still have been committed: no answer came back after
        the request was sent (a reset connection), or the API server's own 504 ("request did
        not complete within requested timeout": etcd may still commit it)."""
        return self.status == 504 or (self.status == 0 and self.sent)


class Conflict(KubeError):
    """409: the object changed since the resourceVersion the write was based on."""


class NotFound(KubeError):
    """404: the object does not exist (any more)."""


class Gone(KubeError):
    """410 on a watch: the resourceVersion is too old; list again."""


MERGE_PATCH = "application/merge-patch+json"


async def watch_events(response: Any, what: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The (type, object) events of a watch response, one JSON object per line; an ERROR
    event (410 Gone, ...) or an error status raises as its KubeError. Releases the response."""
    try:
        if response.status >= 400:
            _raise_for(response.status, await response.read(), what)
        async for line in response.content:
            if not line.strip():
                continue
            event = orjson.loads(line)
            kind = event.get("type", "") if isinstance(event, dict) else ""
            obj = event.get("object") if isinstance(event, dict) else None
            obj = obj if isinstance(obj, dict) else {}
            if kind == "ERROR":
                _raise_for(int(obj.get("code", 500)), orjson.dumps(obj), what)
            yield str(kind), obj
    finally:
        response.release()


async def watch_list(
    lister: Callable[..., Any],
    resource_version: str,
    timeout_seconds: int,
    what: str,
    *args: Any,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The events of one watch made with a generated client's list call (`lister(*args)`),
    from `resource_version`, with bookmarks; `Gone` on 410."""
    response = await lister(
        *args,
        watch=True,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        allow_watch_bookmarks=True,
        _preload_content=False,
    )
    async for event in watch_events(response, f"watch {what}"):
        yield event


async def _call(coro_factory: Callable[[], Any], what: str) -> Any:
    try:
        response = await coro_factory()
        try:
            if response.status >= 400:
                body = await response.read()
                _raise_for(response.status, body, what)
            return orjson.loads(await response.read())
        finally:
            response.release()
    except ApiException as exc:
        _raise_for(
            exc.status or 0, (exc.body or "").encode() if isinstance(exc.body, str) else b"", what
        )
        raise  # pragma: no cover - _raise_for always raises
    except aiohttp.ClientConnectorError as exc:
        raise KubeError(f"{what}: {exc}", sent=False) from exc
    except aiohttp.ClientError as exc:
        raise KubeError(f"{what}: {exc}") from exc


def _raise_for(status: int, body: bytes, what: str) -> None:
    message = ""
    try:
        message = orjson.loads(body).get("message", "")
    except (orjson.JSONDecodeError, AttributeError):
        message = body.decode(errors="replace")[:200]
    text = f"{what}: {status} {message}".strip()
    if status == 409:
        raise Conflict(text, status)
    if status == 404:
        raise NotFound(text, status)
    if status == 410:
        raise Gone(text, status)
    raise KubeError(text, status)


class Kube:
    """The calls numafit makes, over one ApiClient."""

    def __init__(self, api: client.ApiClient, component: str) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.component = component

    async def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        body = await _call(
            lambda: self.core.list_pod_for_all_namespaces(_preload_content=False),
            "list pods",
        )
        return body.get("items") or [], body.get("metadata", {}).get("resourceVersion", "")

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        body = await _call(lambda: self.core.list_node(_preload_content=False), "list nodes")
        return body.get("items") or [], body.get("metadata", {}).get("resourceVersion", "")

    async def list_resource_quotas(self) -> list[dict[str, Any]]:
        body = await _call(
            lambda: self.core.list_resource_quota_for_all_namespaces(_preload_content=False),
            "list resourcequotas",
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    async def list_resource_quotas_versioned(self) -> tuple[list[dict[str, Any]], str]:
        """Every ResourceQuota and the list's resourceVersion (to watch from)."""
        body = await _call(
            lambda: self.core.list_resource_quota_for_all_namespaces(_preload_content=False),
            "list resourcequotas",
        )
        return body.get("items") or [], body.get("metadata", {}).get("resourceVersion", "")

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        body: dict[str, Any] = await _call(
            lambda: self.core.read_namespaced_pod(name, namespace, _preload_content=False),
            f"get pod {namespace}/{name}",
        )
        return body

    async def get_pod_cached(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod as the API server's watch cache has it (`resourceVersion=0`: no quorum read
        from etcd), for what never changes on a pod once created (its uid, its scheduler)."""
        body: dict[str, Any] = await _call(
            lambda: self.api.call_api(
                "/api/v1/namespaces/{namespace}/pods/{name}",
                "GET",
                {"namespace": namespace, "name": name},
                [("resourceVersion", "0")],
                {"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
            ),
            f"get pod {namespace}/{name}",
        )
        return body

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str,
        labels: Mapping[str, str | None] | None = None,
    ) -> dict[str, Any]:
        """One JSON merge patch; `resource_version` is the optimistic-lock precondition."""
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        if labels:
            metadata["labels"] = dict(labels)
        body: dict[str, Any] = await _call(
            lambda: self.core.patch_namespaced_pod(  # type: ignore[call-arg]
                name,
                namespace,
                {"metadata": metadata},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            ),
            f"patch pod {namespace}/{name}",
        )
        return body

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None]
    ) -> dict[str, Any]:
        body: dict[str, Any] = await _call(
            lambda: self.core.patch_node(  # type: ignore[call-arg]
                name,
                {"metadata": {"annotations": dict(annotations)}},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            ),
            f"patch node {name}",
        )
        return body

    async def create_event(
        self,
        involved: Mapping[str, str],
        event_type: str,
        reason: str,
        message: str,
    ) -> None:
        """A core/v1 Event on a pod (legacy form: first/last timestamp, count 1)."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = involved["namespace"]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # As client-go names them: the object and the time in hex nanoseconds, so that
                # Events listed by name come in the order they happened.
                "name": f"{involved['name'][:235]}.{time.time_ns():x}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": namespace,
                "name": involved["name"],
                "uid": involved.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await _call(
            lambda: self.core.create_namespaced_event(
                namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
            ),
            f"create event on {namespace}/{involved['name']}",
        )

    async def watch(
        self, kind: str, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Raw watch events (type, object) from `resource_version`; raises Gone on 410.
        `kind`: "pods", "nodes" or "resourcequotas" (all namespaces)."""
        listers: dict[str, Callable[..., Any]] = {
            "pods": self.core.list_pod_for_all_namespaces,
            "nodes": self.core.list_node,
            "resourcequotas": self.core.list_resource_quota_for_all_namespaces,
        }
        lister = listers.get(kind)
        if lister is None:
            raise ValueError(f"cannot watch {kind!r}")
        async for event in watch_list(lister, resource_version, timeout_seconds, kind):
            yield event

    async def create_binding(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        *,
        annotations: Mapping[str, str] | None = None,
        resource_version: str = "",
    ) -> None:
        """POST pods/<name>/binding: place the pod on `node` (the scheduler's last step).

        Raw JSON: kubernetes-asyncio deserializes the returned Status as a V1Binding and raises
        after a successful bind (ecosystem.md section 6). `uid` is a precondition: a pod
        recreated under the same name is never bound by mistake. The API server also copies
        the Binding's `annotations` onto the pod (merged over the pod's, in the same write) and
        checks `resource_version` as a precondition (409 when the pod changed): accounting's
        reservation and the bind are then one guarded write, not a PATCH and a Binding.
        """
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if resource_version:
            metadata["resourceVersion"] = resource_version
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await _call(
            lambda: self.core.create_namespaced_pod_binding(
                name,
                namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
            ),
            f"bind pod {namespace}/{name} to {node}",
        )

    async def list_namespaced_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        body = await _call(
            lambda: self.core.list_namespaced_resource_quota(namespace, _preload_content=False),
            f"list resourcequotas in {namespace}",
        )
        items: list[dict[str, Any]] = body.get("items") or []
        return items

    # --- used by `numafit simulate` and tests (a controller's and kubelet's writes) ---------

    async def create_node(self, body: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await _call(
            lambda: self.core.create_node(body, _preload_content=False),  # type: ignore[arg-type]
            "create node",
        )
        return created

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await _call(
            lambda: self.core.create_namespaced_pod(
                namespace,
                body,  # type: ignore[arg-type]
                _preload_content=False,
            ),
            f"create pod in {namespace}",
        )
        return created

    async def delete_pod(self, namespace: str, name: str) -> None:
        await _call(
            lambda: self.core.delete_namespaced_pod(name, namespace, _preload_content=False),
            f"delete pod {namespace}/{name}",
        )

    async def patch_pod_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """What kubelet writes: the pod's status subresource (JSON merge patch)."""
        patched: dict[str, Any] = await _call(
            lambda: self.core.patch_namespaced_pod_status(  # type: ignore[call-arg]
                name,
                namespace,
                {"status": dict(status)},
                _content_type=MERGE_PATCH,
                _preload_content=False,
            ),
            f"patch status of pod {namespace}/{name}",
        )
        return patched
