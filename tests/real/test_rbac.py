"""The Helm charts' RBAC on the real API server, each service running as its own ServiceAccount
(tokens from the TokenRequest API, tests/real/stack.py): enough (every request the services
and kube-scheduler made is allowed, judged from kube-apiserver's audit log, after the test drove
every path: register, reserve, bind, refit, consume, Events, the webhook's quota lookup, the
NodeResourceTopology watch) and no more (a write outside a role is refused with 403)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.service import natsconn
from tests.real import chart, cluster
from tests.real.cluster import Gpu
from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

pytestmark = real_tier()
ACCOUNTS = f"system:serviceaccount:{chart.NAMESPACE}:"
SCHEDULER = f"{chart.RELEASE}-scheduler"
ACCOUNTING = f"{chart.RELEASE}-accounting"
REFIT = f"{chart.RELEASE}-refit"
KUBE_SCHEDULER = f"{chart.RELEASE}-scheduler-kube-scheduler"


async def refit(url: str, body: dict[str, Any]) -> dict[str, Any]:
    nc = (await natsconn.connect(url, "real-tier-test")).client
    try:
        msg = await natsconn.request(nc, subjects.refit(body["nodeName"]), orjson.dumps(body), 5)
        reply: dict[str, Any] = orjson.loads(msg.data)
        return reply
    finally:
        await nc.close()


def drive_every_path(plane: ControlPlane, numafit: NumafitStack) -> None:
    group = cluster.unique("rbac")
    node = f"{group}-node"
    cluster.create_gpu_node(
        plane, numafit, node, group, [Gpu(f"GPU-{node}-0", 0), Gpu(f"GPU-{node}-1", 1)]
    )
    namespace = cluster.new_namespace(plane, "rbac")
    quota = {"hard": {"requests.nvidia.com/gpumem": "100000"}}
    plane.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": namespace},
                "spec": quota,
            }
        ]
    )
    annotations = {"hami.io/numa-alignment": "best-effort"}
    cluster.create(
        plane, cluster.gpu_pod("p", namespace, group, memory=10000, annotations=annotations)
    )
    placed = cluster.bound(plane, namespace, "p")
    ((reserved, _, _),) = cluster.reserved_gpus(placed)
    other = next(g for g in (f"GPU-{node}-0", f"GPU-{node}-1") if g != reserved)
    reply = asyncio.run(
        refit(
            numafit.nats_url,
            {
                "podUID": placed["metadata"]["uid"],
                "podNamespace": namespace,
                "podName": "p",
                "nodeName": node,
                "containerIndex": 0,
                "containerName": "main",
                "deviceType": "NVIDIA",
                "allowedDeviceUUIDs": [other],
                "mode": "best-effort",
                "timeoutMs": 2000,
            },
        )
    )
    assert reply["code"] == "moved", reply
    poll(
        lambda: any(
            e["reason"] == "NumaRefitSucceed" for e in cluster.events_of(plane, namespace, "p")
        ),
        within=30,
        what="the refit's Event",
    )
    cluster.allocate(numafit, cluster.pod(plane, namespace, "p"))


def rbac_denied(event: dict[str, Any]) -> bool:
    """A 403 of authorization, not the NamespaceLifecycle admission's refusal of new objects
    (kube-scheduler's Events) in a namespace being deleted: the tier deletes each test's
    namespaces after it, while the services may still report on its pods."""
    status = event["responseStatus"]
    return status["code"] == 403 and "because it is being terminated" not in (
        status.get("message") or ""
    )


def test_the_charts_rbac_is_enough_and_no_more(
    control_plane: ControlPlane, numafit: NumafitStack
) -> None:
    plane = control_plane
    drive_every_path(plane, numafit)

    audited = plane.audit_events(ACCOUNTS)
    denied = [
        (
            e["user"]["username"],
            e["verb"],
            e.get("objectRef", {}),
            e["responseStatus"].get("message"),
        )
        for e in audited
        if rbac_denied(e)
    ]
    assert denied == []

    def made(account: str) -> set[tuple[str, str, str]]:
        """(verb, resource[/subresource], apiGroup) of every request `account` made."""
        found = set()
        for e in audited:
            if e["user"]["username"] == ACCOUNTS + account and "objectRef" in e:
                ref = e["objectRef"]
                resource = ref.get("resource", "") + (
                    f"/{ref['subresource']}" if ref.get("subresource") else ""
                )
                found.add((e["verb"], resource, ref.get("apiGroup", "")))
        return found

    # The paths were taken, each by its own account (so the empty list above means something).
    assert {
        ("patch", "nodes", ""),
        ("patch", "pods", ""),
        ("watch", "pods", ""),
        ("create", "pods/binding", ""),
    } <= made(ACCOUNTING)
    assert ("list", "resourcequotas", "") in made(SCHEDULER)
    assert not {v for v, r, _ in made(SCHEDULER) if r.startswith("pods") and v != "get"} - {
        "list",
        "watch",
    }
    assert ("watch", "noderesourcetopologies", "topology.node.k8s.io") in made(SCHEDULER)
    assert ("create", "events", "") in made(REFIT)
    assert ("update", "leases", "coordination.k8s.io") in made(KUBE_SCHEDULER)
    assert ("create", "events", "events.k8s.io") in made(KUBE_SCHEDULER)

    # No more: a write outside each role is refused.
    namespace = cluster.new_namespace(plane, "rbac-refused")
    plane.kubectl("create", "configmap", "target", "-n", namespace)
    victim = cluster.gpu_pod("victim", namespace, "nowhere", memory=1000)
    cluster.create(plane, victim)
    attempts = {
        # Reservations are accounting's: neither the extender nor kube-scheduler nor the refit
        # service may write a pod's annotations.
        SCHEDULER: ("annotate", "pod", "victim", "hami.io/vgpu-node=forged"),
        KUBE_SCHEDULER: ("annotate", "pod", "victim", "hami.io/vgpu-node=forged"),
        REFIT: ("annotate", "pod", "victim", "hami.io/vgpu-node=forged"),
        # Accounting patches; it never deletes pods or reads configuration.
        ACCOUNTING: ("delete", "pod", "victim", "--wait=false"),
    }
    for account, args in attempts.items():
        kubeconfig = numafit.kubeconfig_of(account)
        refused = plane.kubectl(*args, "-n", namespace, kubeconfig=kubeconfig, check=False)
        assert refused.returncode != 0 and "Forbidden" in refused.stderr, (account, refused.stderr)
        refused = plane.kubectl(
            "patch", "configmap", "target", "-n", namespace, "--type=merge", "-p", json.dumps({"data": {"a": "b"}}),
            kubeconfig=kubeconfig, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "Forbidden" in refused.stderr, (account, refused.stderr)
    assert "hami.io/vgpu-node" not in cluster.pod(plane, namespace, "victim")["metadata"].get(
        "annotations", {}
    )
    forbidden = {
        e["user"]["username"][len(ACCOUNTS) :]
        for e in plane.audit_events(ACCOUNTS)
        if rbac_denied(e)
    }
    assert forbidden == set(attempts)
