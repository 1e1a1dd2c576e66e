"""GPU nodes without a kubelet, GPU pods, and reads of what numafit holds, on the real tier.

A node here is what numafit's device plugin and kubelet would leave on the API server: a Node
whose status (through the `status` subresource, as kubelet writes it) has CPU, memory, pods and
`nvidia.com/gpu` capacity and a Ready condition, and whose GPU inventory is registered through
accounting over NATS, exactly the request the device plugin sends (accounting then writes
HAMi's `hami.io/node-nvidia-register` annotation with its own ServiceAccount). Each test labels
its nodes with its own group and gives its pods a nodeSelector on it, so kube-scheduler hands
the extender that test's nodes only.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.service import natsconn
from tests.raw_accounting import RawAccounting
from tests.real.waiting import poll

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from tests.real.controlplane import ControlPlane
    from tests.real.stack import NumafitStack

GROUP_LABEL = "numafit.io/test-group"
REGISTER = "hami.io/node-nvidia-register"
ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"
SCHEDULE_WITHIN = 60.0
"""Seconds a pod gets to be bound: kube-scheduler's backoff after a refusal reaches 10 s."""


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    numa: int
    memory: int = 40000
    count: int = 10
    cores: int = 100

    def register_item(self, index: int) -> dict[str, Any]:
        return {
            "id": self.uuid,
            "index": index,
            "count": self.count,
            "devmem": self.memory,
            "devcore": self.cores,
            "type": "NVIDIA-H100",
            "numa": self.numa,
            "mode": "hami-core",
            "health": True,
        }


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def create_gpu_node(
    plane: ControlPlane, stack: NumafitStack, name: str, group: str, gpus: Sequence[Gpu]
) -> None:
    """Node `name` in `group`, Ready, with `gpus` registered through accounting; returns once
    accounting holds the node (its snapshot names every GPU)."""
    plane.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {GROUP_LABEL: group}},
            }
        ]
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {
        "cpu": "16",
        "memory": "64Gi",
        "pods": "110",
        "nvidia.com/gpu": str(sum(g.count for g in gpus)),
    }
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "fake node of the real tier",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}}
    plane.kubectl(
        "patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    devices = [gpu.register_item(i) for i, gpu in enumerate(gpus)]
    reply = asyncio.run(_call(stack.nats_url, "register", name, {"devices": devices}))
    assert reply.get("ok") is True, reply
    # kube-controller-manager's node lifecycle controller lifts the not-ready taint that
    # admission put on the new Node once it sees the Ready condition.
    poll(
        lambda: (
            not any(
                t["key"].startswith("node.kubernetes.io/")
                for t in plane.kubectl_json("get", "node", name)["spec"].get("taints", [])
            )
        ),
        within=60,
        what=f"node {name} untainted",
    )


def snapshot(stack: NumafitStack, node: str) -> dict[str, Any]:
    """Accounting's answer for `node` (the replica owning its partition answers)."""
    return asyncio.run(_call(stack.nats_url, "snapshot", node, {}))


def ledger_pods(stack: NumafitStack, node: str) -> dict[str, dict[str, str]] | None:
    """The pods accounting's ledger holds on `node` (uid -> the hami.io annotations it keeps
    for them); None when accounting does not know the node."""
    reply = snapshot(stack, node)
    assert reply.get("ok") is True, reply
    nodes = reply.get("nodes") or []
    if not nodes:
        return None
    (state,) = nodes
    return {p["pod"]["metadata"]["uid"]: p["pod"]["metadata"]["annotations"] for p in state["pods"]}


def reserved_memory(stack: NumafitStack, node: str) -> dict[str, float]:
    """MiB reserved per GPU of `node`, from the /metrics of every accounting replica
    (`numafit_accounting_device_memory_reserved_mib`; a replica exports only its own nodes)."""
    prefix = f'numafit_accounting_device_memory_reserved_mib{{node="{node}",uuid="'
    found: dict[str, float] = {}
    for name in stack.accounting_replicas():
        for line in stack.metrics(name).splitlines():
            if line.startswith(prefix):
                uuid = line[len(prefix) :].split('"', 1)[0]
                assert uuid not in found, f"{node}/{uuid} exported by two replicas"
                found[uuid] = float(line.rsplit(" ", 1)[1])
    return found


async def _call(url: str, op: str, node: str, body: Mapping[str, Any]) -> dict[str, Any]:
    nc = (await natsconn.connect(url, "real-tier-test")).client
    try:
        return await RawAccounting(nc, default_timeout=5.0).call(op, node, body)
    finally:
        await nc.close()


def gpu_pod(
    name: str,
    namespace: str,
    group: str,
    *,
    memory: int | None = None,
    percentage: int | None = None,
    cores: int | None = None,
    gpus: int = 1,
    annotations: Mapping[str, str] | None = None,
    cpu: str | None = None,
    scheduler_name: str | None = None,
) -> dict[str, Any]:
    """A one-container pod asking for GPU shares, limited to `group`'s nodes. No
    schedulerName by default: the admission webhook routes it to numafit's scheduler."""
    limits: dict[str, Any] = {"nvidia.com/gpu": str(gpus)}
    if memory is not None:
        limits["nvidia.com/gpumem"] = str(memory)
    if percentage is not None:
        limits["nvidia.com/gpumem-percentage"] = str(percentage)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    if cpu is not None:  # Guaranteed: integer CPUs and memory, requests = limits
        limits |= {"cpu": cpu, "memory": "1Gi"}
    spec: dict[str, Any] = {
        "nodeSelector": {GROUP_LABEL: group},
        "containers": [
            {
                "name": "main",
                "image": "numafit.invalid/never-pulled",
                "imagePullPolicy": "Never",
                "resources": {"limits": limits},
            }
        ],
    }
    if scheduler_name is not None:
        spec["schedulerName"] = scheduler_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def create(plane: ControlPlane, obj: Mapping[str, Any]) -> dict[str, Any]:
    """`kubectl create` of `obj`; the object as the API server stored it."""
    created: dict[str, Any] = json.loads(
        plane.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(obj)).stdout
    )
    return created


def pod(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = plane.kubectl_json("get", "pod", name, "-n", namespace)
    return found


def bound(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    """The pod once kube-scheduler (through the extender's bind) gave it a node."""

    def node_name() -> dict[str, Any] | None:
        current = pod(plane, namespace, name)
        return current if current["spec"].get("nodeName") else None

    return poll(
        node_name,
        within=SCHEDULE_WITHIN,
        what=f"pod {namespace}/{name} bound",
        last=lambda: describe(plane, namespace, name)[-1500:],
    )


def allocate(stack: NumafitStack, pod_object: Mapping[str, Any]) -> dict[str, Any]:
    """What the device plugin does at kubelet's Allocate, for a node without either: consume
    the pod's reserved entry through accounting, naming the GPUs kubelet gave (here: the
    reserved ones, by physical UUID, as the plugin names them). Accounting then marks the pod's bind phase `success` and the node, locked
    for the pod while it was allocating, takes the next pod."""
    node = pod_object["spec"]["nodeName"]
    gpus = [uuid for uuid, _, _ in reserved_gpus(pod_object)]
    body = {"devices": gpus, "podUID": pod_object["metadata"]["uid"]}
    reply = asyncio.run(_call(stack.nats_url, "consume", node, body))
    assert reply.get("ok") is True, reply
    return reply


def bound_and_allocated(
    plane: ControlPlane, stack: NumafitStack, namespace: str, name: str
) -> dict[str, Any]:
    """The pod bound by kube-scheduler, then admitted as kubelet and the device plugin would."""
    placed = bound(plane, namespace, name)
    allocate(stack, placed)
    return placed


def describe(plane: ControlPlane, namespace: str, name: str) -> str:
    return plane.kubectl("describe", "pod", name, "-n", namespace).stdout


def events_of(plane: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = plane.kubectl_json(
        "get", "events", "-n", namespace, f"--field-selector=involvedObject.name={name}"
    )
    events: list[dict[str, Any]] = listed["items"]
    return events


def reserved_gpus(
    pod_object: Mapping[str, Any], key: str = "hami.io/vgpu-devices-to-allocate"
) -> list[tuple[str, int, int]]:
    """(uuid, MiB, cores) of every device in the pod's to-allocate annotation (or `key`: the
    allocated one holds what was consumed, to-allocate what is left to), HAMi's encoding
    `UUID,Type,MiB,cores:` per device, `;` between containers (parsed here, by hand, so that
    the test does not read numafit's answer with numafit's own codec)."""
    value = pod_object["metadata"].get("annotations", {}).get(key, "")
    devices = []
    for container in value.split(";"):
        for device in container.split(":"):
            if device:
                uuid, _type, mem, cores = device.split(",")
                devices.append((uuid, int(mem), int(cores)))
    return devices


CREATED_NAMESPACES: list[tuple[ControlPlane, str]] = []
"""The namespaces tests created and have not deleted yet (tests/real/conftest.py deletes each
test's after it): a pod left pending is retried by kube-scheduler for the rest of the session,
and every pod it pops can park another's failed bind (its failure handler compares the move
request with the *current* scheduling cycle: docs/design/node-lock.md)."""


def new_namespace(plane: ControlPlane, prefix: str) -> str:
    """A fresh namespace whose default ServiceAccount exists (pods can be created), deleted
    after the test that made it."""
    name = unique(prefix)
    plane.kubectl("create", "namespace", name)
    CREATED_NAMESPACES.append((plane, name))
    poll(
        lambda: plane.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        within=30,
        what=f"default ServiceAccount of {name}",
    )
    return name
