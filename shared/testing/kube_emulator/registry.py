"""The REST verbs over the store, with the API server's semantics and none of its HTTP.

This is where a request body becomes a stored object: identity checks against the URL,
defaulting, admission, system metadata (uid, creationTimestamp, generated names), validation,
optimistic concurrency (a resourceVersion in a PUT body or a patch is a precondition; a write
that loses a race while admission runs is retried, as upstream's GuaranteedUpdate does), the
status/main split of resources with a status subresource, pods/binding, and server-side apply
(apply.py). Every write takes WriteOptions: with dry_run it does all of the above (admission
included, told it is a dry run) and answers what it would have stored, but stores nothing, so no
revision is taken and no watcher hears of it; field validation (field_validation.py) drops or
refuses unknown fields as the directive says, leaving warnings in the options. Every refusal is
a KubeError with upstream's Status; server.py only translates HTTP to these calls and back.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from . import apply as server_side_apply
from . import errors, field_validation
from .admission import DEFAULT_WEBHOOK, AdmissionDenied, AdmissionHook, AdmissionRequest
from .binding import bind_pod, check_bindable, check_preconditions, check_target
from .errors import FieldError, KubeError
from .objects import JSONDict, child, copy_json, metadata, now_rfc3339
from .options import WriteOptions
from .patching import PatchError, copy_value, json_patch, merge_patch, strategic_merge_patch
from .resources import NAMESPACES, PODS, ResourceKind
from .store import KeyExists, KeyMissing, Store, VersionMismatch

if TYPE_CHECKING:
    from .selectors import FieldSelector, LabelSelector

PatchType = Literal["json", "merge", "strategic"]

PATCH_CONTENT_TYPES: dict[str, PatchType] = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
}

# Metadata only the server writes: kept from the stored object whatever an update says.
_SYSTEM_METADATA = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")

# An update that keeps losing races with concurrent writers gives up, as upstream eventually does.
_UPDATE_ATTEMPTS = 16

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_SUBDOMAIN_RULE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
# Upstream's generateName alphabet: no vowels (no words) and no look-alike characters.
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

Mutation = Callable[[JSONDict], JSONDict]
"""Computes the desired object from (a copy of) the current one."""


class Registry:
    """Create, read, update, patch, delete, bind: each a method, each returning wire JSON."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.admission: AdmissionHook | None = None

    # --- reads ---------------------------------------------------------------------------------

    def get(self, kind: ResourceKind, namespace: str, name: str) -> JSONDict:
        stored = self.store.get(kind.bucket, namespace, name)
        if stored is None:
            raise errors.not_found(kind.plural, name, kind.group)
        return kind.from_storage(stored)

    def select(
        self,
        kind: ResourceKind,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> tuple[list[JSONDict], int]:
        """The matching objects (as clients see them) and the store revision they were read at;
        a later watch from that revision misses nothing.

        `limit` is not honoured (the API allows a server to return everything at once).
        """
        stored, revision = self.store.list(kind.bucket, namespace)
        return [
            kind.from_storage(obj) for obj in stored if matches(kind, obj, labels, fields)
        ], revision

    # --- create --------------------------------------------------------------------------------

    async def create(
        self,
        kind: ResourceKind,
        namespace: str,
        body: JSONDict,
        options: WriteOptions | None = None,
    ) -> JSONDict:
        options = options or WriteOptions()
        obj = self._typed(kind, body)
        warnings = field_validation.validate(kind, obj, options.field_validation)
        meta = metadata(obj)
        self._check_namespace(kind, namespace, meta)
        if meta.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        kind.apply_defaults(obj)
        obj = await self._admit(kind, "CREATE", obj, None, options.dry_run)
        meta = metadata(obj)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = str(meta["generateName"]) + "".join(
                random.choices(_NAME_SUFFIX_ALPHABET, k=5)
            )
        for key in _SYSTEM_METADATA:
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        kind.prepare_for_create(obj)
        name = str(meta.get("name", ""))
        problems = _name_errors(meta) + _annotation_errors(meta) + kind.validate_create(obj)
        if problems:
            raise errors.invalid(kind.kind, name, problems, kind.group)
        options.warnings.extend(warnings)
        if options.dry_run:
            # Upstream's dry run checks what the write would hit, then returns the object
            # as it would have been stored, less the resourceVersion only storage assigns.
            if kind.namespaced:
                _check_namespace_name(namespace)
            if self.store.get(kind.bucket, meta.get("namespace", ""), name) is not None:
                raise errors.already_exists(kind.plural, name, kind.group)
            return kind.from_storage(kind.to_storage(obj))
        if kind.namespaced:
            self.ensure_namespace(namespace)
        try:
            created = self.store.create(kind.bucket, kind.to_storage(obj))
        except KeyExists:
            raise errors.already_exists(kind.plural, name, kind.group) from None
        return kind.from_storage(created)

    def ensure_namespace(self, namespace: str) -> None:
        # Any namespace exists on first use, so tests need not create one; the Namespace object
        # appears (with its own ADDED event) just before the first object in it. A name no
        # namespace could have is answered as upstream answers a missing namespace.
        if self.store.get(NAMESPACES.bucket, "", namespace) is not None:
            return
        _check_namespace_name(namespace)
        obj: JSONDict = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now_rfc3339(),
            },
        }
        NAMESPACES.prepare_for_create(obj)
        self.store.create(NAMESPACES.bucket, obj)

    # --- update, patch, status ---------------------------------------------------------------

    async def replace(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        body: JSONDict,
        subresource: str = "",
        options: WriteOptions | None = None,
    ) -> JSONDict:
        """PUT: the body replaces the object (or only its status, for the status subresource)."""
        body = self._typed(kind, body)
        meta = metadata(body)
        self._check_namespace(kind, namespace, meta)
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        return await self._update(
            kind, namespace, name, lambda _current: copy_json(body), subresource, options
        )

    async def patch(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        patch_type: PatchType,
        patch: object,
        subresource: str = "",
        options: WriteOptions | None = None,
    ) -> JSONDict:
        """PATCH: the patch is applied to the current object on every attempt, so a
        metadata.resourceVersion it carries is checked against the latest version."""
        if patch_type == "json" and not isinstance(patch, list):
            raise errors.bad_request("the JSON patch must be a list of operations")
        if patch_type != "json" and not isinstance(patch, dict):
            raise errors.bad_request("the patch must be a JSON object")

        def apply(current: JSONDict) -> JSONDict:
            try:
                if patch_type == "json":
                    result = json_patch(current, copy_value(patch))
                elif patch_type == "merge":
                    result = merge_patch(current, copy_value(patch))
                else:
                    result = strategic_merge_patch(current, copy_value(patch))
            except PatchError as error:
                raise KubeError(errors.status_object(422, str(error))) from None
            if not isinstance(result, dict):
                raise KubeError(
                    errors.status_object(422, "the patch made the object not an object")
                )
            return result

        return await self._update(kind, namespace, name, apply, subresource, options)

    async def apply(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        config: object,
        subresource: str = "",
        options: WriteOptions | None = None,
    ) -> tuple[JSONDict, bool]:
        """Server-side apply (see apply.py); returns the object and whether it was created."""
        options = options or WriteOptions()
        if not isinstance(config, dict):
            raise errors.bad_request("the apply configuration must be an object")
        for key, label in (("apiVersion", "apiVersion"), ("kind", "Kind")):
            if not config.get(key):
                raise errors.bad_request(f"Object '{label}' is missing in the apply configuration")
        config = self._typed(kind, config)
        meta = metadata(config)
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({name})"
            )
        if "managedFields" in meta:
            raise errors.bad_request("metadata.managedFields must be nil")
        self._check_namespace(kind, namespace, meta)
        options.warnings.extend(field_validation.validate(kind, config, options.field_validation))
        if subresource not in ("", "status") or (subresource and not kind.has_status):
            raise errors.path_not_found()

        def merge(current: JSONDict | None) -> JSONDict:
            return server_side_apply.apply(
                kind,
                current,
                config,
                manager=options.field_manager,
                force=options.force,
                subresource=subresource,
                now=now_rfc3339(),
            )

        if self.store.get(kind.bucket, namespace if kind.namespaced else "", name) is None:
            if subresource:
                raise errors.not_found(kind.plural, name, kind.group)
            created = merge(None)
            metadata(created)["name"] = name
            return await self.create(kind, namespace, created, options), True
        updated = await self._update(
            kind, namespace, name, merge, subresource, options, operation="Apply"
        )
        return updated, False

    async def _update(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        mutate: Mutation,
        subresource: str,
        options: WriteOptions | None = None,
        operation: server_side_apply.Operation = "Update",
    ) -> JSONDict:
        options = options or WriteOptions()
        if subresource not in ("", "status") or (subresource == "status" and not kind.has_status):
            raise errors.path_not_found()
        for _attempt in range(_UPDATE_ATTEMPTS):
            current = self.get(kind, namespace, name)
            current_version = str(metadata(current)["resourceVersion"])
            desired = mutate(copy_json(current))
            precondition = metadata(desired).get("resourceVersion")
            if precondition and precondition != current_version:
                raise errors.conflict(kind.plural, name, group=kind.group)
            warnings = field_validation.validate(kind, desired, options.field_validation)
            new = _merge_for_update(kind, current, desired, subresource)
            if operation == "Apply" and subresource:
                # The status part came from the apply, and so does the bookkeeping of it.
                _carry_managed_fields(new, desired)
            if not subresource:
                # Upstream decodes (and so defaults) every body, not only a create's.
                kind.apply_defaults(new)
                new = await self._admit(kind, "UPDATE", new, current, options.dry_run)
            # An apply wrote managedFields itself (possibly none left); any other write that
            # omits them keeps them.
            _restore_system_metadata(new, current, keep_managed_fields=operation == "Update")
            if not subresource:
                problems = (
                    _immutable_errors(new, current)
                    + _annotation_errors(metadata(new))
                    + kind.validate_update(new, current)
                )
                if problems:
                    raise errors.invalid(kind.kind, name, problems, kind.group)
            if operation == "Update":
                server_side_apply.track_update(
                    kind,
                    current,
                    new,
                    manager=options.field_manager,
                    subresource=subresource,
                    now=now_rfc3339(),
                )
            if options.dry_run:
                # Answered with the resourceVersion the object still has.
                options.warnings.extend(warnings)
                return kind.from_storage(kind.to_storage(new))
            try:
                updated = self.store.update(kind.bucket, kind.to_storage(new), current_version)
            except VersionMismatch:
                continue  # written meanwhile (admission awaited): recompute from the new state
            except KeyMissing:
                raise errors.not_found(kind.plural, name, kind.group) from None
            options.warnings.extend(warnings)
            return kind.from_storage(updated)
        raise errors.conflict(kind.plural, name, group=kind.group)

    # --- delete --------------------------------------------------------------------------------

    def delete(
        self,
        kind: ResourceKind,
        namespace: str,
        name: str,
        delete_options: JSONDict | None,
        options: WriteOptions | None = None,
    ) -> JSONDict:
        """Deletes at once (grace periods and finalizers are not emulated); returns the object."""
        current = self.get(kind, namespace, name)
        preconditions = child(delete_options or {}, "preconditions")
        meta = metadata(current)
        check_preconditions(preconditions, meta, kind.plural, name, kind.group)
        if options is not None and options.dry_run:
            return current
        try:
            deleted = self.store.delete(kind.bucket, namespace, name, str(meta["resourceVersion"]))
        except (KeyMissing, VersionMismatch):
            raise errors.not_found(kind.plural, name, kind.group) from None
        return kind.from_storage(deleted)

    # --- pods/binding --------------------------------------------------------------------------

    def bind(
        self,
        namespace: str,
        name: str,
        binding: JSONDict,
        options: WriteOptions | None = None,
    ) -> JSONDict:
        """POST pods/{name}/binding: what the scheduler does to place a pod on a node.

        Sets spec.nodeName and the PodScheduled condition and copies the Binding's annotations
        and labels onto the pod, under the Binding's uid/resourceVersion preconditions.
        """
        meta = metadata(binding)
        if meta.get("name", name) != name:
            raise errors.bad_request("name in URL does not match name in Binding object")
        self._check_namespace(PODS, namespace, meta)
        target = child(binding, "target")
        check_target(target, name)
        pod = self.get(PODS, namespace, name)
        pod_meta = metadata(pod)
        check_preconditions(meta, pod_meta, "pods", name)
        check_bindable(pod_meta, pod.setdefault("spec", {}), name)
        bind_pod(pod, pod_meta, meta, target["name"])
        if options is None or not options.dry_run:
            self.store.update(PODS.bucket, pod, str(pod_meta["resourceVersion"]))
        return errors.success_status(201)

    # --- shared checks -------------------------------------------------------------------------

    async def _admit(
        self,
        kind: ResourceKind,
        operation: Literal["CREATE", "UPDATE"],
        obj: JSONDict,
        old: JSONDict | None,
        dry_run: bool = False,
    ) -> JSONDict:
        # Only pods are admitted: the emulator stands in for webhooks registered on pods.
        hook = self.admission
        if hook is None or kind is not PODS:
            return obj
        meta = metadata(obj)
        request = AdmissionRequest(
            operation=operation,
            kind=kind.kind,
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            object=obj,
            old_object=None if old is None else copy_json(old),
            dry_run=dry_run,
        )
        try:
            result = await hook(request)
        except AdmissionDenied as denial:
            raise errors.admission_denied(
                denial.webhook, denial.message, denial.code, denial.reason
            ) from None
        except Exception as failure:
            raise errors.internal(
                f'failed calling webhook "{DEFAULT_WEBHOOK}": {failure}'
            ) from failure
        if result is None:
            return request.object
        # Upstream decodes a mutating webhook's result like a request body: what the types
        # lack is dropped, and defaulting runs again (limits added by a webhook become
        # requests too), so a later update, defaulted in turn, finds nothing changed.
        field_validation.prune(kind, result)
        kind.apply_defaults(result)
        return result

    @staticmethod
    def _typed(kind: ResourceKind, body: JSONDict) -> JSONDict:
        """The body as this resource, kind and apiVersion first as the API server writes them."""
        for key, expected in (("kind", kind.kind), ("apiVersion", kind.api_version)):
            given = body.get(key)
            if given and given != expected:
                raise errors.bad_request(
                    f"the object provided is unrecognized (must be of type {kind.kind}): "
                    f"{key} {given!r} is not {expected!r}"
                )
        typed: JSONDict = {"kind": kind.kind, "apiVersion": kind.api_version}
        typed.update((key, value) for key, value in body.items() if key not in typed)
        return typed

    @staticmethod
    def _check_namespace(kind: ResourceKind, namespace: str, meta: JSONDict) -> None:
        given = meta.get("namespace")
        if kind.namespaced:
            if given and given != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)


def matches(
    kind: ResourceKind, stored: JSONDict, labels: LabelSelector, fields: FieldSelector
) -> bool:
    """Whether a stored object is selected by both selectors."""
    if not labels.requirements and not fields.requirements:
        return True  # empty selectors select everything (most watches: nothing to compute)
    object_labels = child(metadata(stored), "labels")
    return labels.matches(object_labels) and fields.matches(kind.field_values(stored))


def _merge_for_update(
    kind: ResourceKind, current: JSONDict, desired: JSONDict, subresource: str
) -> JSONDict:
    if subresource == "status":
        # The status subresource writes .status and nothing else.
        new = copy_json(current)
        new["status"] = desired.get("status", {})
    else:
        new = desired
        if kind.has_status:
            # ... and the main resource never writes .status (upstream PrepareForUpdate).
            new.pop("status", None)
            if "status" in current:
                new["status"] = copy_json(current)["status"]
    new["kind"], new["apiVersion"] = kind.kind, kind.api_version
    return new


def _carry_managed_fields(new: JSONDict, desired: JSONDict) -> None:
    entries = metadata(desired).get("managedFields")
    if entries is None:
        metadata(new).pop("managedFields", None)
    else:
        metadata(new)["managedFields"] = entries


def _restore_system_metadata(
    new: JSONDict, current: JSONDict, *, keep_managed_fields: bool = True
) -> None:
    meta, old = metadata(new), metadata(current)
    if keep_managed_fields and "managedFields" not in meta and "managedFields" in old:
        meta["managedFields"] = old["managedFields"]
    if meta.get("uid") in (None, ""):
        meta["uid"] = old.get("uid")
    for key in ("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
        if key in old:
            meta[key] = old[key]
        else:
            meta.pop(key, None)
    meta["resourceVersion"] = old["resourceVersion"]


def _immutable_errors(new: JSONDict, current: JSONDict) -> list[FieldError]:
    meta, old = metadata(new), metadata(current)
    return [
        FieldError(f"metadata.{key}", "immutable", value=meta.get(key))
        for key in ("name", "namespace", "uid")
        if meta.get(key) != old.get(key)
    ]


def _check_namespace_name(namespace: str) -> None:
    """A name no namespace could have is answered as upstream answers a missing namespace."""
    if len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
        raise errors.not_found("namespaces", namespace)


def _name_errors(meta: JSONDict) -> list[FieldError]:
    name = meta.get("name")
    if not name:
        return [FieldError("metadata.name", "required", "name or generateName is required")]
    if not isinstance(name, str) or len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
        return [FieldError("metadata.name", "invalid", _SUBDOMAIN_RULE, name)]
    return []


TOTAL_ANNOTATION_BYTES = 256 * 1024
"""apimachinery's TotalAnnotationSizeLimitB: every key and value of one object together."""


def _annotation_errors(meta: JSONDict) -> list[FieldError]:
    """Upstream ValidateAnnotations' size rule, on every create and update of any kind: an
    object's annotations are stored, watched and sent with it, so their size is bounded."""
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        return []
    size = sum(
        len(str(key).encode("utf-8", "surrogatepass"))
        + len(str(value).encode("utf-8", "surrogatepass"))
        for key, value in annotations.items()
    )
    if size <= TOTAL_ANNOTATION_BYTES:
        return []
    rule = f"must have at most {TOTAL_ANNOTATION_BYTES} bytes"
    return [FieldError("metadata.annotations", "too_long", rule)]
