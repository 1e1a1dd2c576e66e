"""An honest Kubernetes API emulator for numafit's tests and `numafit simulate`.

It speaks the API server's REST JSON (objects, lists, watch streams, Status errors) for pods
(with the binding and status subresources), nodes, namespaces, resource quotas and events
(core/v1 and events.k8s.io/v1), so the real kubernetes_asyncio client works against it
unchanged, and it keeps the semantics clients depend on: one global resourceVersion, lists that
a watch can resume from without a gap, 410 for an expired watch, 409 for a stale
resourceVersion, admission before storage. Start it in process (KubeEmulator) or as a process
(cli.main). Module map:

    server      KubeEmulator: HTTP routing, lifecycle, kubeconfig, admin endpoints
    registry    the REST verbs' semantics over the store
    store       objects, the revision counter, the change log, watchers
    watching    a watcher as a newline-delimited JSON event stream
    resources   the served resources and their per-kind rules
    selectors   label and field selectors
    patching    JSON merge, strategic merge and JSON patch
    faults      injected delays and errors
    admission   the hook standing in for admission webhooks
    scheduler_webhook   svc_scheduler's pod admission as that hook (`numafit simulate`, tests)
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
