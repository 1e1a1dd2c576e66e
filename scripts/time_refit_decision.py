"""Time one refit decision on a node of 8 GPUs carrying 100 pods.

Two figures: the decision alone on a ready ledger (what svc_refit does per request) and the
whole offline `numafit plan` path (decode 100 pods' annotations, build the ledger, decide).
Run: PYTHONPATH=. .venv/bin/python scripts/time_refit_decision.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from shared.core.refit import decide_refit
from shared.plan import load_case, run_plan
from tests.builders import case, container, gpu, node, pod, refit_request


def build() -> dict[str, Any]:
    gpus = [gpu(f"GPU-{i}", i // 4, mem=81920, count=40) for i in range(8)]
    pods = []
    for i in range(100):
        uuid = f"GPU-{i % 8}"
        pods.append(
            pod(
                f"p{i}",
                init=[container("init", 1, 300, 2)],
                containers=[container("app", 1, 500, 3), container("side", 1, 100, 1)],
                allocated=f"{uuid},NVIDIA,300,2:;{uuid},NVIDIA,500,3:;{uuid},NVIDIA,100,1:;",
                to_allocate=f";{uuid},NVIDIA,500,3:;;",
            )
        )
    target = pods[0]  # on GPU-0 (NUMA 0); kubelet allows NUMA 1's GPUs
    return case(
        node("node-1", gpus), pods, refit_request(target, 1, [f"GPU-{i}" for i in range(4, 8)])
    )


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
