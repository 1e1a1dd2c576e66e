"""Background tasks a service owns: started by name, failures logged, drained or cancelled on
stop. No task is left running unowned (the watch loops, health loops, event recording).

A task spawned `eternal=True` (a watch loop, a subscription pump) is the service's job itself:
if it ever ends while the service is not stopping, by an exception or by returning, the service
can no longer do its job, so `on_fatal` is called (services pass `Readiness.fail`: readiness
fails and the process exits 1 for Kubernetes to restart it) rather than only logging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("numafit")


class TaskSet:
    def __init__(self, on_fatal: Callable[[str], None] | None = None) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._eternal: set[asyncio.Task[Any]] = set()
        self.on_fatal = on_fatal
        self.stopping = False

    def spawn(
        self, work: Coroutine[Any, Any, Any], name: str, *, eternal: bool = False
    ) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        if eternal:
            self._eternal.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        eternal = task in self._eternal
        self._eternal.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("task failed", extra={"task": task.get_name()}, exc_info=error)
        if eternal and not self.stopping:
            why = "cancelled" if task.cancelled() else repr(error) if error else "returned"
            reason = f"background task {task.get_name()} ended ({why})"
            if self.on_fatal is not None:
                self.on_fatal(reason)
            else:
                log.error("eternal task ended", extra={"task": task.get_name(), "why": why})

    async def stop(self, grace: float = 0.0) -> None:
        """Let the tasks finish for up to `grace` seconds, then cancel what is left. Eternal
        tasks never finish by themselves: they are cancelled at once."""
        self.stopping = True
        for task in list(self._eternal):
            task.cancel()
        if grace > 0 and self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.gather(*self._tasks, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
