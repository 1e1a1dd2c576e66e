"""The bare echo under a refit for `numafit bench`, measured as deployed: its responder in a
process of its own, as refit is to the device plugin.

    python -m shared.bench_echo --nats-url URL

answers every request on `bench.echo` with its own body until stopped, and prints `ready` once
subscribed. A responder sharing the requester's process and event loop skips the wake-up of a
second process that every real round trip pays; the bench reports that figure beside this one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

from shared.service import natsconn

SUBJECT = "bench.echo"


async def _echo(nats_url: str) -> None:
    nc = (await natsconn.connect(nats_url, "bench-echo")).client

    async def answer(msg: Any) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(SUBJECT, cb=answer)
    await nc.flush()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()  # until the bench stops this process
    finally:
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.bench_echo", description=__doc__)
    parser.add_argument("--nats-url", required=True, help="the bench's nats-server")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_echo(args.nats_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
