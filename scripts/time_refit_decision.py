"""Time one refit decision on a node of 8 GPUs carrying 100 pods.

Two figures: the decision alone on a ready ledger (what svc_refit does per request) and the
whole offline `numafit plan` path (decode 100 pods' annotations, build the ledger, decide).
Run: PYTHONPATH=. .venv/bin/python scripts/time_refit_decision.py
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from shared.core import keys
from shared.core.refit import decide_refit
from shared.tools.plan import load_case, run_plan


def container(name: str, mem: int, cores: int) -> dict[str, Any]:
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(mem),
        "nvidia.com/gpucores": str(cores),
    }
    return {"name": name, "image": "x", "resources": {"limits": limits}}


def build() -> dict[str, Any]:
    """A `numafit plan` case: 8 GPUs (NUMA 0: GPU-0..3, NUMA 1: GPU-4..7), 100 pods of an
    init container, an app and a second app, each pod on one GPU; the refit asks to move pod
    p0's app (on GPU-0) to NUMA 1's GPUs."""
    gpus = [
        {
            "id": f"GPU-{i}",
            "index": i,
            "count": 40,
            "devmem": 81920,
            "devcore": 100,
            "type": "NVIDIA A100-SXM4-80GB",
            "numa": i // 4,
            "mode": "hami-core",
            "health": True,
        }
        for i in range(8)
    ]
    pods = []
    for i in range(100):
        uuid = f"GPU-{i % 8}"
        allocated = f"{uuid},NVIDIA,300,2:;{uuid},NVIDIA,500,3:;{uuid},NVIDIA,100,1:;"
        annotations = {
            keys.VGPU_NODE: "node-1",
            keys.ALLOCATED: allocated,
            keys.TO_ALLOCATE: f";{uuid},NVIDIA,500,3:;;",
        }
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"p{i}",
                    "namespace": "default",
                    "uid": f"uid-{i}",
                    "resourceVersion": "1",
                    "annotations": annotations,
                },
                "spec": {
                    "nodeName": "node-1",
                    "initContainers": [container("init", 300, 2)],
                    "containers": [container("app", 500, 3), container("side", 100, 1)],
                },
                "status": {"phase": "Pending"},
            }
        )
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-1", "annotations": {keys.NODE_REGISTER: json.dumps(gpus)}},
    }
    request = {
        "podUID": "uid-0",
        "podNamespace": "default",
        "podName": "p0",
        "nodeName": "node-1",
        "containerIndex": 1,
        "containerName": "app",
        "deviceType": "NVIDIA",
        "allowedDeviceUUIDs": [f"GPU-{i}" for i in range(4, 8)],
        "mode": "best-effort",
        "timeoutMs": 2000,
    }
    return {"node": node, "pods": pods, "request": request}


def measure(fn: Any, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def main() -> None:
    obj = build()
    loaded = load_case(obj)
    assert run_plan(loaded).decision.code.value == "moved"

    def decision_only() -> None:
        decide_refit(
            loaded.request,
            pods=loaded.pods,
            node=loaded.node,
            quota=loaded.quota,
            config=loaded.config,
        )

    def whole_plan() -> None:
        run_plan(load_case(obj))

    for name, fn, rounds in (
        ("decision on a ready ledger", decision_only, 2000),
        ("whole plan path", whole_plan, 300),
    ):
        measure(fn, 50)
        samples = sorted(measure(fn, rounds))
        p50 = statistics.median(samples)
        p99 = samples[int(len(samples) * 0.99) - 1]
        print(f"{name:<28} p50 {p50:8.1f} us   p99 {p99:8.1f} us   ({rounds} rounds)")


if __name__ == "__main__":
    main()
