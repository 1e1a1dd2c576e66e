"""`numafit up --control-plane real`: the same stack on upstream Kubernetes binaries.

Instead of the API emulator and numafit's own scheduling loop: etcd, kube-apiserver and
kube-controller-manager (shared.testing.realk8s, found through KUBEBUILDER_ASSETS), and
kube-scheduler with numafit's extender stanza (filter, prioritize, bind; the GPU resources
ignoredByScheduler), as the svc-scheduler chart renders it. The extender and the admission
webhook are served over HTTPS with a certificate of the control plane's CA, because the API
server calls webhooks over HTTPS only; a real MutatingWebhookConfiguration (and the validating
one) routes GPU pods to numafit's scheduler, as on a cluster.

What a kubelet would do on the API server the node agent here does: each node is registered
Ready with its capacity (through the status subresource's heartbeat afterwards); a pod
kube-scheduler bound to one of the stack's nodes is admitted by that node's kubelet emulator
(shared.tools.local.kubelets); a deleted pod's resources are released and its deletion confirmed
(grace period 0), without which a bound pod would stay Terminating for ever.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import shutil
import ssl
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiException

from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.service import kube_io
from shared.service.wiring import InProcess
from shared.testing.realk8s import assets
from shared.testing.realk8s.plane import ControlPlane, ControlPlaneError
from shared.tools.local.defaults import StackError
from shared.tools.simulate.cluster import DEFAULT_REPLICAS, SimCluster
from svc_accounting import service as accounting_service
from svc_refit import service as refit_service
from svc_scheduler import service as scheduler_service

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path

    from shared.tools.local.kubelets import Kubelets
    from shared.tools.simulate.driver import PodReport
    from shared.tools.simulate.scenario import NodeSpec

log = logging.getLogger("numafit.up.real")

MANAGED_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
"""The chart's managedResources: counted by the extender, ignored by kube-scheduler."""
EXCLUDED_NAMESPACES = ("kube-system",)
"""The chart's webhooks.excludeNamespaces (the release namespace does not exist here)."""
HEARTBEAT = 60.0
"""Seconds between two renewals of a node's Ready condition (kube-controller-manager runs
with a node monitor grace period of an hour)."""
NODE_MEMORY = "1Ti"
NODE_PODS = "250"


def find_assets() -> assets.Assets:
    """The binaries, or StackError with the one line saying why not (it names
    KUBEBUILDER_ASSETS)."""
    found = assets.find()
    if isinstance(found, str):
        raise StackError(
            f"--control-plane real needs the Kubernetes binaries: {found}; set "
            f"{assets.VARIABLE} to a folder holding {', '.join(assets.BINARIES)} (envtest's "
            "convention), or leave --control-plane at emulator"
        )
    return found


def scheduler_config(extender_url: str, ca_pem: bytes) -> dict[str, Any]:
    """The chart's KubeSchedulerConfiguration (helm/svc-scheduler's ConfigMap) for this
    machine: the extender at `extender_url`, verified with the control plane's CA; leader
    election off (one replica, nothing to elect)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": DEFAULT_SCHEDULER_NAME}],
        "extenders": [
            {
                "urlPrefix": extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 1,
                "httpTimeout": "5s",
                "nodeCacheCapable": True,
                "enableHTTPS": True,
                "tlsConfig": {"caData": base64.b64encode(ca_pem).decode()},
                "ignorable": False,
                "managedResources": [
                    {"name": name, "ignoredByScheduler": True} for name in MANAGED_RESOURCES
                ],
            }
        ],
    }


def webhook_configurations(extender_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The chart's two webhook configurations, with the extender's URL for the Service."""
    found = []
    for kind, path in (
        ("MutatingWebhookConfiguration", "/webhook"),
        ("ValidatingWebhookConfiguration", "/validate"),
    ):
        hook: dict[str, Any] = {
            "name": "pods.numafit-scheduler.numafit.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
            "clientConfig": {
                "url": extender_url + path,
                "caBundle": base64.b64encode(ca_pem).decode(),
            },
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/metadata.name",
                        "operator": "NotIn",
                        "values": list(EXCLUDED_NAMESPACES),
                    }
                ]
            },
        }
        if kind == "MutatingWebhookConfiguration":
            hook["reinvocationPolicy"] = "IfNeeded"
        found.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": "numafit-scheduler"},
                "webhooks": [hook],
            }
        )
    return found


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_status(spec: NodeSpec) -> dict[str, Any]:
    """What a kubelet reports for the node: capacity (its CPUs, the device plugin's
    replicas), Ready, and its version (which the scheduler reads)."""
    replicas = sum(g.replicas or DEFAULT_REPLICAS for g in spec.gpus)
    resources = {
        "cpu": str(sum(spec.cpus.values())),
        "memory": NODE_MEMORY,
        "pods": NODE_PODS,
        "nvidia.com/gpu": str(replicas),
    }
    now = _now()
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "numafit's kubelet emulator is posting ready status",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
        "nodeInfo": {"kubeletVersion": spec.kubelet_version},
    }


class RealCluster(SimCluster):
    """SimCluster's services and nodes on a real control plane instead of the emulator."""

    def __init__(self, *args: Any, api_port: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.assets = find_assets()
        self.api_port = api_port
        self.plane: ControlPlane | None = None
        self.ca_pem = b""

    @property
    def api_url(self) -> str:
        assert self.plane is not None
        return self.plane.server

    @property
    def admin_kubeconfig(self) -> Path:
        assert self.plane is not None
        return self.plane.kubeconfig

    async def start(self, progress: Callable[[str], None] = lambda _: None) -> None:
        progress("starting etcd, kube-apiserver and kube-controller-manager")
        try:
            plane = self.plane = await asyncio.to_thread(
                ControlPlane, self.assets, self.workdir / "plane", self.api_port
            )
            await asyncio.to_thread(plane.start)
        except (ControlPlaneError, OSError) as exc:
            raise StackError(f"the control plane did not start: {exc}") from exc
        self.ca_pem = plane.ca_file.read_bytes()
        progress("starting nats-server")
        await asyncio.to_thread(self.nats.start)
        wiring = self.wiring = InProcess(self.nats.url, plane.kubeconfig)
        kube = self.kube = await wiring.kube("numafit-up")
        for spec in self.scenario.nodes:
            await kube.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": spec.name},
                    # Kept on create, as kubelet's registration writes it.
                    "status": node_status(spec),
                }
            )

        progress("starting accounting, refit and the scheduler extender (HTTPS)")
        config = self.scenario.config
        self.accounting = await wiring.start(
            accounting_service.spec(accounting_service.AccountingOptions(config=config)),
            client_name="accounting",
            registry=self._registry("accounting"),
        )
        self.refit = await wiring.start(
            refit_service.spec(refit_service.RefitOptions(config=config)),
            client_name="refit",
            registry=self._registry("refit"),
        )
        serving = await asyncio.to_thread(
            plane.authority.issue,
            "numafit-scheduler",
            common_name="numafit-scheduler",
            dns=("localhost",),
            ips=("127.0.0.1",),
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(serving.cert, serving.key)
        self.scheduler = await wiring.start(
            scheduler_service.spec(
                scheduler_service.SchedulerOptions(
                    config=config,
                    host=self.scheduler_host,
                    port=self.scheduler_port,
                    ssl_context=context,
                )
            ),
            client_name="scheduler",
            registry=self._registry("scheduler"),
        )
        for spec in self.scenario.nodes:
            progress(f"starting kubelet and device plugin on {spec.name}")
            await self._start_node(wiring, spec)
        async with asyncio.timeout(30):
            for sim in self.nodes.values():
                await sim.plugin.inventory_registered.wait()
            await self.scheduler.read_model.ready.wait()
            await self.scheduler.nodes.listed.wait()
            for name in self.nodes:
                await self.topology_seen(name)

        progress("admission webhooks and kube-scheduler with numafit's extender")
        await self._apply_webhooks(kube)
        extender = self.extender_url
        try:
            await asyncio.to_thread(
                plane.start_scheduler,
                scheduler_config(extender, self.ca_pem),
                "kube-scheduler",
            )
        except (ControlPlaneError, OSError) as exc:
            raise StackError(f"kube-scheduler did not start: {exc}") from exc

    @property
    def extender_url(self) -> str:
        """The extender as kube-scheduler and the API server reach it (its certificate names
        127.0.0.1, whatever --host the listener binds)."""
        assert self.scheduler is not None
        return f"https://127.0.0.1:{self.scheduler.http.port}"

    @property
    def scheduler_url(self) -> str:
        return self.extender_url

    async def _apply_webhooks(self, kube: kube_io.Kube) -> None:
        api = AdmissionregistrationV1Api(kube.api)
        for body in webhook_configurations(self.extender_url, self.ca_pem):
            if body["kind"] == "MutatingWebhookConfiguration":
                await api.create_mutating_webhook_configuration(body)  # type: ignore[arg-type]
            else:
                await api.create_validating_webhook_configuration(body)  # type: ignore[arg-type]

    async def stop(self) -> None:
        wiring = self.wiring
        for node in self.nodes.values():
            if wiring is not None:
                with contextlib.suppress(Exception):
                    await wiring.stop(node.plugin, 1.0)
            with contextlib.suppress(Exception):
                await node.kubelet.stop()
        if wiring is not None:
            with contextlib.suppress(Exception):
                await wiring.close(1.0)
        if self.plane is not None:
            await asyncio.to_thread(self.plane.stop)  # every process group, newest first
        await asyncio.to_thread(self.nats.stop)
        for directory in [*self._socket_dirs, self.workdir]:
            shutil.rmtree(directory, ignore_errors=True)


class NodeAgent:
    """The kubelets' side of the API server for the stack's nodes: admit what kube-scheduler
    bound to them (one pod at a time, as Kubelets admits), release and confirm deletions,
    renew each node's Ready condition."""

    def __init__(self, kube: kube_io.Kube, kubelets: Kubelets, nodes: Iterable[NodeSpec]) -> None:
        self.kube = kube
        self.kubelets = kubelets
        self.specs = {spec.name: spec for spec in nodes}
        self._seen: dict[str, str] = {}
        """uid -> node of every pod admitted or being admitted here."""
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._settled: dict[str, asyncio.Future[PodReport | None]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._watch(), name="up-node-agent-watch"),
            asyncio.create_task(self._admit(), name="up-node-agent-admit"),
            asyncio.create_task(self._heartbeat(), name="up-node-agent-heartbeat"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def first_attempt(self, uid: str) -> PodReport | None:
        """Until the pod is admitted on a node (its report) or kube-scheduler found it
        unschedulable (None)."""
        return await self._future(uid)

    def _future(self, uid: str) -> asyncio.Future[PodReport | None]:
        if uid not in self._settled:
            self._settled[uid] = asyncio.get_running_loop().create_future()
        return self._settled[uid]

    def _settle(self, uid: str, report: PodReport | None) -> None:
        # Only a waiter's future: one per pod ever seen would grow with --load for ever. The
        # stack waits right after creating the pod, before the watch can see it admitted.
        future = self._settled.pop(uid, None)
        if future is not None and not future.done():
            future.set_result(report)

    async def _watch(self) -> None:
        while True:
            try:
                items, version = await self.kube.list_pods()
                for pod in items:
                    await self._observe("ADDED", pod)
                async for kind, pod in self.kube.watch("pods", version):
                    if kind != "BOOKMARK":
                        await self._observe(kind, pod)
            except kube_io.Gone:
                continue
            except Exception as exc:  # a broken stream: list again
                log.warning("watching pods failed; listing again", extra={"error": str(exc)})
                await asyncio.sleep(1.0)

    async def _observe(self, kind: str, pod: dict[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid, node = meta.get("uid", ""), spec.get("nodeName") or ""
        status = pod.get("status") or {}
        if not node:
            if any(
                c.get("type") == "PodScheduled" and c.get("status") == "False"
                for c in status.get("conditions") or []
            ):
                self._settle(uid, None)  # kube-scheduler tried and found no node
            return
        if not self.kubelets.runs(node):
            return
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if self._seen.pop(uid, None) is not None:  # once, however many events follow
                await self.kubelets.release(node, uid)
            if kind != "DELETED":
                await self._confirm_deletion(meta)
            return
        if uid not in self._seen and (status.get("phase") or "Pending") == "Pending":
            self._seen[uid] = node
            self._queue.put_nowait(pod)

    async def _confirm_deletion(self, meta: dict[str, Any]) -> None:
        """What kubelet does once the containers stopped: delete with grace period 0."""
        try:
            await self.kube.core.delete_namespaced_pod(
                meta["name"],
                meta.get("namespace", "default"),
                grace_period_seconds=0,
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("confirming a deletion failed", extra={"error": str(exc)})

    async def _admit(self) -> None:
        while True:
            pod = await self._queue.get()
            meta = pod["metadata"]
            node = pod["spec"]["nodeName"]
            try:
                report = await self.kubelets.admit(pod, node)
            except Exception as exc:  # one pod's trouble never stops the node
                log.warning(
                    "admission failed",
                    extra={"pod": f"{meta.get('namespace')}/{meta['name']}", "error": str(exc)},
                )
                self._settle(meta["uid"], None)
                continue
            log.info(
                "pod admitted",
                extra={
                    "pod": f"{report.namespace}/{report.name}",
                    "node": node,
                    "phase": report.phase,
                    "reason": report.reason,
                    "gpus": {c.name: c.gpus for c in report.containers},
                },
            )
            self._settle(meta["uid"], report)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT)
            for name, spec in self.specs.items():
                try:
                    await self.kube.core.patch_node_status(name, {"status": node_status(spec)})
                except Exception as exc:  # the next beat tries again
                    log.warning("node heartbeat failed", extra={"node": name, "error": str(exc)})


async def ensure_namespace(kube: kube_io.Kube, name: str, within: float = 30.0) -> None:
    """Namespace `name`, with its `default` ServiceAccount (which kube-controller-manager
    makes; the API server refuses pods until it exists). The emulator needs none of this."""
    from kubernetes_asyncio.client import CoreV1Api

    core: CoreV1Api = kube.core
    try:
        await core.create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}  # type: ignore[arg-type]
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    async with asyncio.timeout(within):
        while True:
            try:
                await core.read_namespaced_service_account("default", name)
                return
            except ApiException as exc:
                if exc.status != 404:
                    raise
            await asyncio.sleep(0.1)  # kube-controller-manager's to make; bounded above
