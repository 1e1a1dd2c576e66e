"""An honest Kubernetes API emulator for numafit's tests and `numafit simulate`.

It speaks the API server's REST protocol (objects, lists, watch streams, Status errors) for pods
(with the binding and status subresources), nodes, namespaces, resource quotas, config maps,
events (core/v1 and events.k8s.io/v1) and NodeResourceTopologies (topology.node.k8s.io/v1alpha2),
so the real kubernetes_asyncio client and the real kubectl work against it unchanged, and it
keeps the semantics clients depend on: one global resourceVersion, lists that a watch can
resume from without a gap, 410 for an expired watch, 409 for a stale resourceVersion, admission
before storage, dry runs that store nothing, unknown fields pruned or refused, server-side
apply. Start it in process (KubeEmulator) or as a process (cli.main). Module map:

    server      KubeEmulator: HTTP routing, lifecycle, kubeconfig, admin endpoints
    registry    the REST verbs' semantics over the store (dry runs included)
    store       objects, the revision counter, the change log, watchers
    watching    a watcher as a newline-delimited JSON event stream
    resources   the served resources and their per-kind rules
    selectors   label and field selectors
    patching    JSON merge and JSON patch (libraries), strategic merge patch
    apply       server-side apply and managedFields, over fieldsets (FieldsV1 paths)
    options     a write's dryRun, fieldValidation, fieldManager and force, validated
    bodies      request bodies: JSON, YAML, protobuf (protobuf, over protowire)
    schema      the type model of the served kinds; schema_catalog fills it (kubernetes-validate)
    field_validation   unknown fields and wrong types, by the schema
    openapi     /openapi/v2 and /openapi/v3 (openapi_proto: v2 as gnostic protobuf)
    rendering   Table and metadata-only answers, as Accept asks (table: kubectl's columns)
    discovery   /api, /apis and /version
    faults      injected delays and errors
    admission   the hook standing in for admission webhooks
    scheduler_webhook   svc_scheduler's pod admission as that hook (`numafit simulate`, tests)
    remote_webhook      an AdmissionReview webhook over HTTP as that hook
    errors      Status objects with upstream's wording
"""

from .admission import AdmissionDenied, AdmissionHook, AdmissionRequest
from .cli import main, serve
from .faults import FaultRule, Faults
from .server import KubeEmulator

__all__ = [
    "AdmissionDenied",
    "AdmissionHook",
    "AdmissionRequest",
    "FaultRule",
    "Faults",
    "KubeEmulator",
    "main",
    "serve",
]
