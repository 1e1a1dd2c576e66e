"""`numafit up --load`: a steady GPU workload, so every dashboard panel has something to show.

It creates pods through the API server, as a user or a controller would (the webhook routes
them, the scheduling loop places them, kubelet admits them), at `rate` pods per second, and
deletes the oldest once more than `max_pods` exist, so capacity is freed and reused. The pods
are `numafit run sim-node`'s mix: mostly opted in to NUMA refits (best-effort or strict), some
not, some with a regular init container or a native sidecar; kubelet pins their exclusive CPUs
to the lowest NUMA node with room while the scheduler spreads GPU work, so many need a refit,
a few strict ones fail and a few pods that did not opt in drift (accounting follows kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections import deque
from typing import TYPE_CHECKING

from shared.service import kube_io
from shared.tools.local import defaults
from shared.tools.simulate.sim_node import workload

if TYPE_CHECKING:
    from shared.service.kube_io import Kube

log = logging.getLogger("numafit.up.load")


class Load:
    def __init__(
        self,
        kube: Kube,
        *,
        rate: float = defaults.LOAD_RATE,
        max_pods: int = defaults.LOAD_MAX_PODS,
        namespace: str = defaults.LOAD_NAMESPACE,
        seed: int = 7,
    ) -> None:
        if rate <= 0:
            raise ValueError("the load's rate must be positive")
        self.kube = kube
        self.interval = 1.0 / rate
        self.max_pods = max_pods
        self.namespace = namespace
        self.rng = random.Random(seed)
        self.created = 0
        self.deleted = 0
        self.refused = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="load")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        alive: deque[str] = deque()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        for number in itertools.count(1):
            manifest = workload(number, self.rng, self.namespace)
            name = manifest["metadata"]["name"] = f"load-{manifest['metadata']['name']}"
            try:
                await self.kube.create_pod(self.namespace, manifest)
            except kube_io.KubeError as exc:  # e.g. refused by the webhook; keep going
                self.refused += 1
                log.warning("load pod not created", extra={"pod": name, "error": str(exc)})
            else:
                self.created += 1
                alive.append(name)
                log.debug("load pod created", extra={"pod": f"{self.namespace}/{name}"})
            while len(alive) > self.max_pods:
                oldest = alive.popleft()
                try:
                    await self.kube.delete_pod(self.namespace, oldest)
                except kube_io.NotFound:  # deleted by someone else meanwhile
                    pass
                except kube_io.KubeError as exc:
                    log.warning("load pod not deleted", extra={"pod": oldest, "error": str(exc)})
                else:
                    self.deleted += 1
            next_at = max(next_at + self.interval, loop.time())
            await asyncio.sleep(next_at - loop.time())  # the pace itself, not a wait for state
