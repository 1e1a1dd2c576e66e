"""The HTTP face of the emulator: routing, JSON in and out, admin endpoints, and its lifecycle.

KubeEmulator serves Kubernetes REST paths (see paths.py) from a Registry over an in-memory Store,
so the real kubernetes_asyncio client (or kubectl) works against it unchanged:

    async with KubeEmulator() as emulator:
        emulator.write_kubeconfig(path)          # then config.load_kube_config(config_file=path)
        emulator.faults.add(method="PATCH", path_regex="/pods/", status=500, times=1)

It also serves what kubectl needs beyond the REST verbs: OpenAPI documents (openapi.py), Table
output (rendering.py), protobuf bodies (protobuf.py), dry runs, field validation warnings and
server-side apply (registry.py, apply.py).

Besides the API it serves /healthz, /readyz, /livez, and its own controls under /_emulator/:

    GET    /_emulator/faults        the live fault rules, and how many faulted requests are
                                    still in flight
    POST   /_emulator/faults        add one: {"method", "path_regex", "delay_s", "status",
                                    "times", "message", "watch", "outlive_client"}; answers 201
                                    with the rule and its id
    DELETE /_emulator/faults        remove them all
    DELETE /_emulator/faults/{id}   remove one
    POST   /_emulator/compact       forget the watch history (watches from older revisions get 410)
    POST   /_emulator/expire-watches  compact, and end the live watches ({"resource": "pods"}, or
                                    all) with an ERROR event carrying 410 Gone
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from . import bodies, discovery, errors, kubeconfig, openapi, paths, rendering, watching
from .apply import CONTENT_TYPE as APPLY_CONTENT_TYPE
from .errors import KubeError
from .faults import ADMIN_PREFIX, Faults
from .openapi_proto import CONTENT_TYPE as OPENAPI_V2_PROTOBUF
from .openapi_proto import v2_protobuf
from .options import Verb, WriteOptions, write_options
from .registry import PATCH_CONTENT_TYPES, Registry
from .resources import BY_PATH, PODS, ResourceKind
from .selectors import (
    FieldSelector,
    LabelSelector,
    SelectorError,
    parse_field_selector,
    parse_label_selector,
)
from .store import Store, TooNew, TooOld

if TYPE_CHECKING:
    import os
    from pathlib import Path
    from types import TracebackType

    from .admission import AdmissionHook
    from .objects import JSONDict

log = logging.getLogger("numafit.kube_emulator")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The API server's own limit on request bodies (aiohttp's default, 1 MiB, is lower).
_MAX_BODY_BYTES = 3 * 1024 * 1024

# Namespaces a fresh cluster has; more appear on first use.
_INITIAL_NAMESPACES = ("default", "kube-system")


def json_response(
    body: JSONDict, status: int = 200, warnings: list[str] | None = None
) -> web.Response:
    response = web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
    for text in warnings or ():
        # RFC 7234 warn-code 299 with agent "-", the text quoted as Go's strconv.Quote would.
        response.headers.add("Warning", f"299 - {json.dumps(text)}")
    return response


class KubeEmulator:
    """A Kubernetes API server for tests: in memory, in process, on a real TCP port."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        history_limit: int = 10_000,
        admission: AdmissionHook | None = None,
        bookmark_interval_s: float = 60.0,
        shutdown_timeout_s: float = 2.0,
    ) -> None:
        self.host = host
        self.store = Store(history_limit)
        self.registry = Registry(self.store)
        self.registry.admission = admission
        self.faults = Faults()
        self.bookmark_interval_s = bookmark_interval_s
        self._requested_port = port
        self._shutdown_timeout_s = shutdown_timeout_s
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        for name in _INITIAL_NAMESPACES:
            self.registry.ensure_namespace(name)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._runner is not None:
            raise RuntimeError("the emulator is already running")
        # Cancel a handler when its client disconnects, so abandoned watches and delayed
        # faults end at once instead of holding state until their next write.
        runner = web.AppRunner(
            self.build_app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self._shutdown_timeout_s,
        )
        await runner.setup()
        # Binding the socket here (not in TCPSite) tells us the port when port=0 chose one.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self._requested_port), family=family)
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(sock.getsockname()[1])
        # The address really listened on (0.0.0.0 in a container), not `url`, which names the
        # loopback address a client on this host would use.
        bound = str(sock.getsockname()[0])
        host = f"[{bound}]" if ":" in bound else bound
        log.info("kube emulator listening", extra={"url": f"http://{host}:{self._port}"})

    async def stop(self) -> None:
        """End every watch, then close the server (in-flight requests get shutdown_timeout_s)."""
        runner, self._runner = self._runner, None
        self.store.close()
        await self.faults.cancel_outliving()
        if runner is not None:
            await runner.cleanup()
            log.info("kube emulator stopped")

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator is not running")
        return self._port

    @property
    def url(self) -> str:
        """The base URL clients use (a wildcard listen address is reached via loopback)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> Path:
        return kubeconfig.write(path, self.url)

    # --- test controls -------------------------------------------------------------------------

    @property
    def admission(self) -> AdmissionHook | None:
        return self.registry.admission

    @admission.setter
    def admission(self, hook: AdmissionHook | None) -> None:
        self.registry.admission = hook

    def compact(self) -> int:
        """Forget the watch history; a watch from any earlier revision now gets 410."""
        return self.store.compact()

    def expire_watches(self, resource: str | None = None) -> int:
        """Compact, and end every live watch of `resource` (a plural such as "pods"; None for
        all) with an ERROR event carrying 410 Gone, so its client must relist. Returns how
        many watches were ended."""
        bucket = None
        if resource is not None:
            kinds = [k for (_, plural), k in BY_PATH.items() if plural == resource]
            if not kinds:
                raise ValueError(f"unknown resource {resource!r}")
            bucket = kinds[0].bucket
        return self.store.expire_watches(bucket)

    # --- HTTP ----------------------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, self.faults.middleware], client_max_size=_MAX_BODY_BYTES
        )
        router = app.router
        for probe in ("/healthz", "/readyz", "/livez"):
            router.add_get(probe, self._ok)
        router.add_route("*", ADMIN_PREFIX + "faults", self._faults_collection)
        router.add_delete(ADMIN_PREFIX + "faults/{id}", self._fault_delete)
        router.add_post(ADMIN_PREFIX + "compact", self._compact)
        router.add_post(ADMIN_PREFIX + "expire-watches", self._expire_watches)
        router.add_get("/openapi/v2", self._openapi_v2)
        router.add_get("/openapi/v3", self._openapi_v3_index)
        router.add_get("/openapi/v3/{path:.+}", self._openapi_v3)
        router.add_route("*", "/{tail:.*}", self._api)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except KubeError as error:
            response = json_response(error.status, error.code)
        except RecursionError:
            # A body nested deeper than the interpreter's stack: refused, as upstream's decoder
            # refuses one past its depth limit.
            refusal = errors.bad_request("the request body is nested too deeply")
            response = json_response(refusal.status, refusal.code)
        except web.HTTPException as error:
            # aiohttp's own refusals (body too large, wrong method) in the API's words.
            if error.status == 404:
                refusal = errors.path_not_found()
            elif error.status == 405:
                refusal = errors.method_not_allowed()
            else:
                refusal = errors.from_code(error.status, error.reason)
            response = json_response(refusal.status, refusal.code)
        except Exception as error:
            log.exception("request failed", extra={"method": request.method, "path": request.path})
            failure = errors.internal(f"{type(error).__name__}: {error}")
            response = json_response(failure.status, failure.code)
        log.debug(
            "request",
            extra={
                "method": request.method,
                "path": request.path_qs,
                "status": response.status,
                "ms": round((time.perf_counter() - started) * 1000, 2),
            },
        )
        return response

    async def _ok(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _faults_collection(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return json_response(
                {
                    "rules": [rule.to_json() for rule in self.faults.rules()],
                    "in_flight": self.faults.in_flight,
                }
            )
        if request.method == "POST":
            try:
                rule = self.faults.add_json(await _read_json(request))
            except ValueError as error:
                raise errors.bad_request(str(error)) from None
            return json_response(rule.to_json(), 201)
        if request.method == "DELETE":
            self.faults.clear()
            return json_response({"rules": []})
        raise errors.method_not_allowed()

    async def _fault_delete(self, request: web.Request) -> web.Response:
        rule_id = request.match_info["id"]
        if not rule_id.isdigit() or not self.faults.remove(int(rule_id)):
            raise KubeError(errors.status_object(404, f"no fault rule {rule_id}"))
        return json_response({"removed": int(rule_id)})

    async def _compact(self, _request: web.Request) -> web.Response:
        return json_response({"dropped": self.compact(), "revision": self.store.revision})

    async def _expire_watches(self, request: web.Request) -> web.Response:
        body = await _read_json(request) if request.can_read_body else {}
        resource = body.get("resource") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(resource, str | None):
            raise errors.bad_request('expected {"resource": "<plural>"} or no body')
        try:
            expired = self.expire_watches(resource)
        except ValueError as error:
            raise errors.bad_request(str(error)) from None
        return json_response({"expired": expired, "revision": self.store.revision})

    async def _openapi_v2(self, request: web.Request) -> web.Response:
        if OPENAPI_V2_PROTOBUF in request.headers.get("Accept", ""):
            # Not its own media type as Content-Type: Go's mime parser (client-go's response
            # handling) refuses the '@' in it, so upstream too answers with octet-stream.
            return web.Response(body=v2_protobuf(), content_type="application/octet-stream")
        return web.Response(body=openapi.v2_bytes(), content_type="application/json")

    async def _openapi_v3_index(self, _request: web.Request) -> web.Response:
        return web.Response(body=openapi.v3_index(), content_type="application/json")

    async def _openapi_v3(self, request: web.Request) -> web.Response:
        document = openapi.v3_document(request.match_info["path"].strip("/"))
        if document is None:
            raise errors.path_not_found()
        return web.Response(body=document, content_type="application/json")

    async def _api(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            document = _discovery_document(request.path, request.host)
            if document is not None:
                return json_response(document)
        target = paths.parse(request.path)
        kind = None if target is None else BY_PATH.get((target.api_version, target.resource))
        if target is None or kind is None:
            raise errors.path_not_found()
        if not kind.namespaced:
            if target.namespace is not None:
                raise errors.path_not_found()
            namespace: str | None = ""
        else:
            namespace = target.namespace  # None: across all namespaces (collections only)
            if namespace is None and target.name is not None:
                raise errors.path_not_found()
        if target.name is None:
            return await self._collection(request, kind, namespace, target.watch_prefix)
        assert namespace is not None
        if target.watch_prefix:
            name_selector = f"metadata.name={target.name}"
            return await self._watch(
                request, kind, namespace, extra_fields=name_selector, wanted=_wanted(request)
            )
        return await self._item(request, kind, namespace, target.name, target.subresource or "")

    async def _collection(
        self, request: web.Request, kind: ResourceKind, namespace: str | None, watch_prefix: bool
    ) -> web.StreamResponse:
        method = request.method
        if method == "GET":
            wanted = _wanted(request)
            if watch_prefix or _flag(request.query.get("watch")):
                return await self._watch(request, kind, namespace, wanted=wanted)
            labels, fields = _selectors(request, kind)
            objects, revision = self.registry.select(kind, namespace, labels, fields)
            return json_response(rendering.render_list(kind, objects, str(revision), wanted))
        if method == "POST" and namespace is not None:
            options = _options(request, "Create")
            body = await bodies.read_object(request)
            created = await self.registry.create(kind, namespace, body, options)
            return json_response(created, 201, options.warnings)
        raise errors.method_not_allowed()

    async def _item(
        self, request: web.Request, kind: ResourceKind, namespace: str, name: str, subresource: str
    ) -> web.Response:
        method = request.method
        if subresource == "binding" and kind is PODS:
            if method != "POST":
                raise errors.method_not_allowed()
            options = _options(request, "Create")
            binding = await bodies.read_object(request)
            return json_response(self.registry.bind(namespace, name, binding, options), 201)
        if subresource not in ("", "status") or (subresource and not kind.has_status):
            raise errors.path_not_found()
        if method == "GET":
            obj = self.registry.get(kind, namespace, name)
            return json_response(rendering.render_one(kind, obj, _wanted(request)))
        if method == "PUT":
            options = _options(request, "Update")
            body = await bodies.read_object(request)
            replaced = await self.registry.replace(
                kind, namespace, name, body, subresource, options
            )
            return json_response(replaced, 200, options.warnings)
        if method == "PATCH":
            return await self._patch(request, kind, namespace, name, subresource)
        if method == "DELETE" and not subresource:
            delete_options = await bodies.read_any(request) if request.can_read_body else None
            if delete_options is not None and not isinstance(delete_options, dict):
                raise errors.bad_request("DeleteOptions must be a JSON object")
            options = _options(request, "Delete", delete_options=delete_options)
            deleted = self.registry.delete(kind, namespace, name, delete_options, options)
            return json_response(deleted)
        raise errors.method_not_allowed()

    async def _patch(
        self, request: web.Request, kind: ResourceKind, namespace: str, name: str, subresource: str
    ) -> web.Response:
        content_type = request.content_type.lower()
        if content_type == APPLY_CONTENT_TYPE:
            options = _options(request, "Patch", apply=True)
            config = await bodies.read_any(request)
            obj, created = await self.registry.apply(
                kind, namespace, name, config, subresource, options
            )
            return json_response(obj, 201 if created else 200, options.warnings)
        patch_type = PATCH_CONTENT_TYPES.get(content_type)
        if patch_type is None:
            raise errors.unsupported_media_type(request.content_type)
        options = _options(request, "Patch")
        patch = await bodies.read_any(request)
        patched = await self.registry.patch(
            kind, namespace, name, patch_type, patch, subresource, options
        )
        return json_response(patched, 200, options.warnings)

    async def _watch(
        self,
        request: web.Request,
        kind: ResourceKind,
        namespace: str | None,
        extra_fields: str = "",
        wanted: rendering.Wanted | None = None,
    ) -> web.StreamResponse:
        query = request.query
        labels, fields = _selectors(request, kind, extra_fields)
        since = _resource_version(query.get("resourceVersion", ""))
        timeout = _timeout_seconds(query.get("timeoutSeconds", ""))
        options = watching.WatchOptions(
            labels=labels,
            fields=fields,
            timeout_s=timeout,
            bookmarks=_flag(query.get("allowWatchBookmarks")),
            bookmark_interval_s=self.bookmark_interval_s,
            render=rendering.watch_renderer(kind, wanted or _wanted(request)),
        )
        try:
            watcher = self.store.watch(kind.bucket, namespace, since)
        except (TooOld, TooNew) as refusal:
            # Like the API server: the watch itself opens (200), then says why in an ERROR event.
            assert since is not None
            status = (
                errors.expired(str(refusal))
                if isinstance(refusal, TooOld)
                else errors.too_large_resource_version(since, self.store.revision)
            ).status
            response = await watching.start_stream(request)
            await response.write(watching.event_line("ERROR", status))
            await response.write_eof()
            return response
        try:
            response = await watching.start_stream(request)
        except BaseException:
            watcher.close()
            raise
        await watching.serve(response, kind, self.store, watcher, options)
        return response


def _discovery_document(path: str, host: str) -> JSONDict | None:
    """The discovery document at `path` (with or without a trailing slash, as clients vary)."""
    parts = path.strip("/").split("/")
    if parts == ["version"]:
        return discovery.version()
    if parts == ["api"]:
        return discovery.core_versions(host)
    if parts == ["apis"]:
        return discovery.group_list()
    if parts == ["api", "v1"]:
        return discovery.resource_list("v1")
    if len(parts) == 2 and parts[0] == "apis":
        return discovery.group(parts[1])
    if len(parts) == 3 and parts[0] == "apis":
        return discovery.resource_list(f"{parts[1]}/{parts[2]}")
    return None


async def _read_json(request: web.Request) -> Any:
    return bodies.parse_json(await request.read())


def _wanted(request: web.Request) -> rendering.Wanted:
    return rendering.negotiate(
        request.headers.get("Accept", ""), request.query.get("includeObject")
    )


def _options(
    request: web.Request,
    verb: Verb,
    *,
    apply: bool = False,
    delete_options: JSONDict | None = None,
) -> WriteOptions:
    return write_options(
        request.query,
        verb,
        apply=apply,
        user_agent=request.headers.get("User-Agent", ""),
        delete_options=delete_options,
    )


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _selectors(
    request: web.Request, kind: ResourceKind, extra_fields: str = ""
) -> tuple[LabelSelector, FieldSelector]:
    field_text = ",".join(filter(None, (request.query.get("fieldSelector", ""), extra_fields)))
    try:
        labels = parse_label_selector(request.query.get("labelSelector", ""))
        fields = parse_field_selector(field_text)
        fields.check_supported(kind.supported_fields())
    except SelectorError as error:
        raise errors.bad_request(str(error)) from None
    return labels, fields


def _resource_version(text: str) -> int | None:
    """A watch's starting revision; "" and "0" both mean "from the current state"."""
    if text in ("", "0"):
        return None
    if not text.isdigit():
        raise errors.bad_request(f'invalid resource version "{text}"')
    return int(text)


def _timeout_seconds(text: str) -> float | None:
    if text == "":
        return None
    if not text.isdigit():
        raise errors.bad_request(f'invalid timeoutSeconds "{text}"')
    return float(text) or None
