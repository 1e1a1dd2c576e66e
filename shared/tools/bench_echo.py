"""The bare responders under a refit for `numafit bench`, each in a process of its own as the
services are deployed.

    python -m shared.tools.bench_echo --nats-url URL
    python -m shared.tools.bench_echo --nats-url URL --patcher --kubeconfig PATH
    python -m shared.tools.bench_echo --nats-url URL --forwarder

- echo: answers every request on `bench.echo` with its own body (the floor of one NATS leg);
- the chain floor, the refit's path without numafit's work: the *forwarder* (in the refit's
  place) answers `bench.chain` by asking the *patcher* (in accounting's place) on
  `bench.chain.patch`, which sends one resourceVersion-guarded merge patch of the pod the body
  names (`<namespace>/<name>`), as accounting does, and answers with its new resourceVersion;
  the forwarder then answers its requester. Two NATS request-replies, one PATCH, three
  processes woken each way: everything the refit pays but the decision, the bookkeeping and
  the checks.

Each prints `ready` once subscribed, and answers requests concurrently (a task each), as the
services do. A responder sharing the requester's process and event loop skips the wake-up of a
second process that every real round trip pays; the bench reports that figure beside these.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

from shared.service import natsconn
from shared.service.kube_io import KubeError
from shared.service.wiring import InProcess

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from nats.aio.client import Client

    from shared.service.kube_io import Kube

SUBJECT = "bench.echo"
CHAIN = "bench.chain"
"""What the forwarder answers (the refit's place)."""
PATCHER = "bench.chain.patch"
"""What the patcher answers (accounting's place)."""
FORWARD_TIMEOUT = 5.0
"""Seconds the forwarder waits for the patcher, and the patcher's PATCH may take."""
ANNOTATION = "numafit.io/bench-chain"


class Patcher:
    """One guarded merge patch per request, on the resourceVersion its last write returned
    (read once per pod), as accounting writes a move."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.versions: dict[tuple[str, str], str] = {}

    async def patch(self, data: bytes) -> bytes:
        namespace, _, name = data.decode().partition("/")
        key = (namespace, name)
        try:
            async with asyncio.timeout(FORWARD_TIMEOUT):
                if key not in self.versions:
                    pod = await self.kube.get_pod(namespace, name)
                    self.versions[key] = pod["metadata"]["resourceVersion"]
                body = await self.kube.patch_pod_annotations(
                    namespace, name, {ANNOTATION: str(time.perf_counter_ns())}, self.versions[key]
                )
        except (KubeError, TimeoutError) as exc:
            self.versions.pop(key, None)  # read again next time
            return f"error: {exc}"[:200].encode()
        version: str = body["metadata"]["resourceVersion"]
        self.versions[key] = version
        return version.encode()


async def _serve(nc: Client, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
    """Answer `subject` with `answer(body)`, a task per request (kept until done)."""
    running: set[asyncio.Task[None]] = set()

    async def one(msg: Any) -> None:
        with contextlib.suppress(Exception):  # a lost reply is the requester's timeout
            await msg.respond(await answer(msg.data))

    async def spawn(msg: Any) -> None:
        task = asyncio.create_task(one(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    await nc.subscribe(subject, cb=spawn)


async def _run(nats_url: str, role: str, kubeconfig: str | None) -> None:
    wiring = InProcess(nats_url, kubeconfig)
    try:
        nc = (await wiring.nats(f"bench-{role}")).client
        if role == "echo":

            async def echo(data: bytes) -> bytes:
                return data

            work: Callable[[bytes], Awaitable[bytes]] = echo
            subject = SUBJECT
        elif role == "patcher":
            work, subject = Patcher(await wiring.kube("bench-patcher")).patch, PATCHER
        else:

            async def forward(data: bytes) -> bytes:
                reply = await natsconn.request(nc, PATCHER, data, FORWARD_TIMEOUT)
                return bytes(reply.data)

            work, subject = forward, CHAIN
        await _serve(nc, subject, work)
        await nc.flush()
        print("ready", flush=True)
        await asyncio.Event().wait()  # until the bench terminates this process
    finally:
        await wiring.close(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.tools.bench_echo", description=__doc__)
    parser.add_argument("--nats-url", required=True, help="the bench's nats-server")
    role = parser.add_mutually_exclusive_group()
    role.add_argument("--patcher", action="store_true", help="answer bench.chain.patch")
    role.add_argument("--forwarder", action="store_true", help="answer bench.chain")
    parser.add_argument("--kubeconfig", help="the patcher's API server")
    args = parser.parse_args(argv)
    if args.patcher and not args.kubeconfig:
        parser.error("--patcher needs --kubeconfig")
    chosen = "patcher" if args.patcher else "forwarder" if args.forwarder else "echo"
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(args.nats_url, chosen, args.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
