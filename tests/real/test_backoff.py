"""On the real kube-scheduler: transient refusals back the pod off, permanent ones park it.

kube-scheduler v1.28 parks a pod its extender's filter refuses (FailedNodes,
FailedAndUnresolvableNodes and Error alike: `Unschedulable`) in its unschedulable pool, from
which only a cluster event it registers (a Node added or changed, an assigned pod deleted, ...)
or the five-minute flush takes it; a pod whose bind fails goes to its backoff (1 s doubling to
10 s) and is tried again. A namespace quota raised is no event kube-scheduler knows, so
numafit answers a refusal by quota alone (it may be raised, or another pod of the namespace
may leave) through the bind: the pod keeps being tried, and binds within seconds of the
raise. A pod no GPU can hold is refused at filter time with numafit's reasons and stays
Unschedulable.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from tests.real import cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()

RAISED_WITHIN = 15.0
"""Seconds from the quota's raise to the bind: kube-scheduler's longest backoff (10 s), the
quota's way to accounting (its watch) and the bind."""
USED = "requests.nvidia.com/gpumem"


def scheduled_condition(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    conditions = cluster.pod(plane, namespace, name)["status"].get("conditions") or []
    found = [c for c in conditions if c["type"] == "PodScheduled"]
    return found[0] if found else {}


def test_a_quota_refusal_is_retried_until_the_raise_and_no_fit_stays_unschedulable(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    group = cluster.unique("backoff")
    node = f"{group}-node"
    cluster.create_gpu_node(plane, numafit, node, group, [Gpu(f"GPU-{node}-0", 0, 40000)])
    namespace = cluster.new_namespace(plane, "backoff")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": {USED: "30000"}},
    }
    plane.apply([quota])

    # Half a card is 20000 MiB in numafit's count (nothing in the API server's: a percentage).
    cluster.create(plane, cluster.gpu_pod("first", namespace, group, percentage=50))
    cluster.bound_and_allocated(plane, numafit, namespace, "first")
    cluster.create(plane, cluster.gpu_pod("second", namespace, group, percentage=50))
    # 90000 MiB fits no GPU at all: no quota or release will ever change that (another
    # namespace: the webhook refuses a pod its namespace's quota can never hold).
    elsewhere = cluster.new_namespace(plane, "backoff")
    cluster.create(plane, cluster.gpu_pod("never", elsewhere, group, memory=90000))

    def refused_by_quota() -> str | None:
        text = cluster.describe(plane, namespace, "second")
        return text if "ResourceQuotaNotFit" in text else None

    described = poll(
        refused_by_quota,
        within=cluster.SCHEDULE_WITHIN,
        what="second refused by numafit's quota",
        last=lambda: cluster.describe(plane, namespace, "second")[-1200:],
    )
    assert "retried with backoff" in described
    # Its bind failed (SchedulerError: kube-scheduler's backoff), it was not refused (that
    # would be Unschedulable: parked until an unrelated event).
    assert scheduled_condition(plane, namespace, "second")["reason"] == "SchedulerError"
    assert cluster.pod(plane, namespace, "second")["spec"].get("nodeName") is None

    never: dict[str, Any] = poll(
        lambda: scheduled_condition(plane, elsewhere, "never") or None,
        within=cluster.SCHEDULE_WITHIN,
        what="never refused",
    )
    assert (never["status"], never["reason"]) == ("False", "Unschedulable")
    assert "CardInsufficientMemory" in never["message"]

    plane.kubectl(
        "patch", "resourcequota", "gpu", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"hard": {USED: "60000"}}}),
    )  # fmt: skip
    placed = poll(
        lambda: (p := cluster.pod(plane, namespace, "second"))["spec"].get("nodeName") and p,
        within=RAISED_WITHIN,
        what="second bound after the quota's raise",
        last=lambda: cluster.describe(plane, namespace, "second")[-1200:],
    )
    assert placed["spec"]["nodeName"] == node
    assert [d[1] for d in cluster.reserved_gpus(placed)] == [20000]
    assert cluster.pod(plane, elsewhere, "never")["spec"].get("nodeName") is None


# --- kube-scheduler's own behaviour, with a stub extender ------------------------------------

PROBE_SCHEDULER = "queue-probe"


class StubExtender:
    """An extender that answers each pod as its name says: `failed-*` with FailedNodes,
    `unresolvable-*` with FailedAndUnresolvableNodes, `error-*` with Error, `bindfail-*` with
    a node and two failed binds before the Binding. Counts the calls per pod."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.calls: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = stub.answer(self.path.strip("/"), body)
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["Pod"]["metadata"]["name"] if verb == "filter" else body["PodName"]
        with self.lock:
            calls = self.calls.setdefault(name, [])
            calls.append(verb)
            binds = calls.count("bind")
        kind = name.split("-", 1)[0]
        if verb == "filter":
            nodes = body["NodeNames"]
            if kind == "failed":
                return {"NodeNames": [], "FailedNodes": dict.fromkeys(nodes, "busy")}
            if kind == "unresolvable":
                return {"NodeNames": [], "FailedAndUnresolvableNodes": dict.fromkeys(nodes, "no")}
            if kind == "error":
                return {"NodeNames": [], "Error": "stub error"}
            return {"NodeNames": nodes[:1]}
        if binds <= 2:
            return {"Error": "stub bind failure"}
        self.plane.kubectl(
            "create", "-f", "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name, "namespace": body["PodNamespace"]},
                    "target": {"kind": "Node", "name": body["Node"]},
                }
            ),
        )  # fmt: skip
        return {"Error": ""}

    def count(self, name: str, verb: str) -> int:
        with self.lock:
            return self.calls.get(name, []).count(verb)


def pending_pods(plane: ControlPlane, port: int) -> dict[str, float]:
    """kube-scheduler's `scheduler_pending_pods` gauge by queue."""
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/metrics",
        headers={"Authorization": f"Bearer {plane.admin_token}"},
    )
    context = ssl._create_unverified_context()  # its own self-signed certificate, loopback
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("scheduler_pending_pods{"):
            queue = line.split('queue="', 1)[1].split('"', 1)[0]
            found[queue] = float(line.rsplit(" ", 1)[1])
    return found


def test_kube_scheduler_parks_filter_refusals_and_backs_off_failed_binds(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    """What numafit's answers rest on, shown on kube-scheduler v1.28.7 itself: a pod its
    extender's filter refuses, whichever way, waits in the unschedulable pool; a pod whose
    bind fails is retried after its backoff, and each such failure also moves every parked pod
    back to be tried (kube-scheduler treats a failed bind as an assigned pod deleted)."""
    plane = control_plane
    stub = StubExtender(plane)
    stub.thread.start()
    try:
        config = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "leaderElection": {"leaderElect": False},
            "clientConnection": {"kubeconfig": str(plane.kubeconfig)},
            "profiles": [{"schedulerName": PROBE_SCHEDULER}],
            "extenders": [
                {
                    "urlPrefix": stub.url,
                    "filterVerb": "filter",
                    "bindVerb": "bind",
                    "nodeCacheCapable": True,
                    "httpTimeout": "5s",
                }
            ],
        }
        child = plane.start_scheduler(config, "queue-probe-scheduler")
        port = secure_port(child.process.args)
        try:
            group = cluster.unique("probe")
            node = f"{group}-node"
            cluster.create_gpu_node(plane, numafit, node, group, [Gpu(f"GPU-{node}-0", 0)])
            namespace = cluster.new_namespace(plane, "probe")
            parked = ("failed-a", "unresolvable-a", "error-a")
            for name in parked:
                cluster.create(plane, probe_pod(name, namespace, group))
            poll(
                lambda: pending_pods(plane, port).get("unschedulable") == len(parked),
                within=cluster.SCHEDULE_WITHIN,
                what="the three refused pods in the unschedulable pool",
                last=lambda: (pending_pods(plane, port), stub.calls),
            )
            assert all(stub.count(n, "filter") == 1 for n in parked), stub.calls

            cluster.create(plane, probe_pod("bindfail-a", namespace, group))
            placed = cluster.bound(plane, namespace, "bindfail-a")
            assert placed["spec"]["nodeName"] == node
            # Two failed binds, each retried after the backoff: three attempts in all.
            assert stub.count("bindfail-a", "bind") == 3
            assert stub.count("bindfail-a", "filter") == 3
            # Each failed bind moved the parked pods back to be tried again.
            assert all(stub.count(n, "filter") >= 2 for n in parked), stub.calls
            poll(
                lambda: pending_pods(plane, port).get("unschedulable") == len(parked),
                within=cluster.SCHEDULE_WITHIN,
                what="the refused pods parked again",
                last=lambda: pending_pods(plane, port),
            )
        finally:
            child.stop()
    finally:
        stub.server.shutdown()
        stub.server.server_close()


def secure_port(argv: object) -> int:
    """The `--secure-port` a kube-scheduler was started with (its /metrics)."""
    assert isinstance(argv, list)
    flag = next(str(a) for a in argv if str(a).startswith("--secure-port="))
    return int(flag.split("=", 1)[1])


def probe_pod(name: str, namespace: str, group: str) -> dict[str, Any]:
    """A pod without GPUs (the webhook leaves it alone) for the probe's kube-scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": PROBE_SCHEDULER,
            "nodeSelector": {cluster.GROUP_LABEL: group},
            "containers": [
                {
                    "name": "main",
                    "image": "numafit.invalid/never-pulled",
                    "imagePullPolicy": "Never",
                }
            ],
        },
    }
