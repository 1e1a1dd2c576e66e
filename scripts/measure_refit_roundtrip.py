"""Refit round trip over NATS as the device plugin sees it, beside a bare nats-py echo.

Everything runs for real on this machine: a nats-server, the Kubernetes API emulator, and
svc_accounting + svc_refit in this process (each with its own NATS connection). Three series of
N sequential requests: a bare request-reply echo, a refit answered `already_aligned` (decision
on the read model, no write), and a refit that moves a reservation (decision + accounting move
+ a resourceVersion-guarded patch on the API server), alternating between two GPUs.
Run: PYTHONPATH=. .venv/bin/python scripts/measure_refit_roundtrip.py [N]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from shared import subjects
from shared.nats_server import NatsServer
from tests.builders import container, gpu, node, pod, refit_request
from tests.integration.harness import harness


def summary(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered) * 1e3
    p99 = ordered[max(int(len(ordered) * 0.99) - 1, 0)] * 1e3
    return f"{name:<34} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   ({len(ordered)} requests)"


async def main(n: int) -> None:
    with NatsServer() as server, tempfile.TemporaryDirectory() as tmp:
        gpus = [gpu(f"GPU-{i}", i // 4, mem=81920) for i in range(8)]
        target = pod(
            "bench",
            containers=[container("app", 1, 1000, 5)],
            namespace="ml",
            allocated="GPU-0,NVIDIA,1000,5:;",
        )
        target["metadata"].pop("uid")
        target["metadata"].pop("resourceVersion")
        async with harness(
            server.url, Path(tmp), [("node", node("node-1", gpus)), ("pod", target)]
        ) as h:
            nc = h.client_nc
            assert nc is not None
            created = await h.pod("ml", "bench")

            async def echo(msg: Any) -> None:
                await msg.respond(msg.data)

            await nc.subscribe("bench.echo", cb=echo)
            body = orjson.dumps(refit_request(created, 0, ["GPU-0"]))

            async def series(
                subject: str, payloads: list[bytes], expect: str | None
            ) -> list[float]:
                samples = []
                for payload in payloads:
                    start = time.perf_counter()
                    msg = await nc.request(subject, payload, timeout=5)
                    samples.append(time.perf_counter() - start)
                    if expect is not None:
                        code = orjson.loads(msg.data)["code"]
                        assert code == expect, code
                return samples

            warm = max(n // 10, 10)
            await series("bench.echo", [body] * warm, None)
            print(
                summary(
                    "bare nats-py request-reply echo", await series("bench.echo", [body] * n, None)
                )
            )
            subject = subjects.refit("node-1")
            await series(subject, [body] * warm, "already_aligned")
            print(
                summary(
                    "refit, already aligned", await series(subject, [body] * n, "already_aligned")
                )
            )
            moves = [
                orjson.dumps(refit_request(created, 0, ["GPU-4" if i % 2 == 0 else "GPU-0"]))
                for i in range(n)
            ]
            print(summary("refit, moved (commit + patch)", await series(subject, moves, "moved")))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
