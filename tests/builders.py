"""Small builders for Kubernetes-shaped test objects (nodes, pods, refit requests)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson

from shared.core import keys

_uids = itertools.count(1)


def gpu(
    uuid: str,
    numa: int = 0,
    *,
    mem: int = 40000,
    cores: int = 100,
    count: int = 10,
    index: int | None = None,
    type: str = "NVIDIA A100-SXM4-40GB",
    mode: str = "hami-core",
    health: bool = True,
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "id": uuid,
        "count": count,
        "devmem": mem,
        "devcore": cores,
        "type": type,
        "numa": numa,
        "mode": mode,
        "health": health,
    }
    if index is not None:
        item["index"] = index
    return item


def node(name: str, gpus: list[dict[str, Any]], cordon: str | None = None) -> dict[str, Any]:
    for i, item in enumerate(gpus):
        item.setdefault("index", i)
    annotations = {keys.NODE_REGISTER: orjson.dumps(gpus).decode()}
    if cordon is not None:
        annotations[keys.DEVICE_CORDON] = cordon
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
    }


def container(
    name: str,
    gpus: int | None = 1,
    mem: int | None = None,
    cores: int | None = None,
    *,
    pct: int | None = None,
    sidecar: bool = False,
    requests: bool = False,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources["nvidia.com/gpu"] = str(gpus)
    if mem is not None:
        resources["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        resources["nvidia.com/gpucores"] = str(cores)
    if pct is not None:
        resources["nvidia.com/gpumem-percentage"] = str(pct)
    spec: dict[str, Any] = {"name": name, "image": "x"}
    if resources:
        spec["resources"] = {"requests" if requests else "limits": resources}
    if sidecar:
        spec["restartPolicy"] = "Always"
    return spec


def pod(
    name: str,
    *,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    namespace: str = "default",
    uid: str | None = None,
    node_name: str = "node-1",
    allocated: str | None = None,
    to_allocate: str | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
    init_exit: dict[str, int] | None = None,
) -> dict[str, Any]:
    meta_annotations = dict(annotations or {})
    if allocated is not None:
        meta_annotations.setdefault(keys.VGPU_NODE, node_name)
        meta_annotations[keys.ALLOCATED] = allocated
        meta_annotations[keys.TO_ALLOCATE] = allocated if to_allocate is None else to_allocate
    status: dict[str, Any] = {"phase": phase}
    if init_exit:
        status["initContainerStatuses"] = [
            {"name": n, "state": {"terminated": {"exitCode": code}}}
            for n, code in init_exit.items()
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{next(_uids)}",
            "resourceVersion": "1",
            "annotations": meta_annotations,
        },
        "spec": {
            "nodeName": node_name,
            "initContainers": init or [],
            "containers": containers,
        },
        "status": status,
    }


def refit_request(
    target: dict[str, Any], index: int, allowed: list[str], **extra: Any
) -> dict[str, Any]:
    meta = target["metadata"]
    spec = target["spec"]
    names = [c["name"] for c in spec.get("initContainers", []) + spec["containers"]]
    body: dict[str, Any] = {
        "podUID": meta["uid"],
        "podNamespace": meta["namespace"],
        "podName": meta["name"],
        "nodeName": spec["nodeName"],
        "containerIndex": index,
        "containerName": names[index] if index < len(names) else "",
        "deviceType": "NVIDIA",
        "allowedDeviceUUIDs": allowed,
        "mode": "best-effort",
        "timeoutMs": 2000,
    }
    body.update(extra)
    return body


def quota(namespace: str, hard: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": hard},
    }


def case(
    node_obj: dict[str, Any],
    pods: list[dict[str, Any]],
    request: dict[str, Any],
    *,
    quotas: list[dict[str, Any]] | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"node": node_obj, "pods": pods, "request": request}
    if quotas is not None:
        body["resourceQuotas"] = quotas
    if config is not None:
        body["config"] = config
    return body
