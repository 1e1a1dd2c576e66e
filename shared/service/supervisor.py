"""One task supervisor per service: every background task and every request task it runs is a
child of one `asyncio.TaskGroup`, so nothing a service starts is left running unowned.

Services have `start()` and `stop(grace)` (the run loop drives them), so the group runs inside
one task the supervisor starts: `await sup.start()` opens it, `await sup.stop(grace)` closes it.
`async with Supervisor(name) as sup:` does the same around a block (leaving it is a stop
without grace).

Three kinds of children:

- `spawn(work, name, eternal=True)`: the service's job itself (a watch, a subscription pump).
  If it ever ends while the service is not stopping, by an exception, by returning or by being
  cancelled, the service can no longer do its job: `on_fatal(reason)` is called (services pass
  `Readiness.fail`: readiness fails for good and the process exits 1 for Kubernetes to restart
  it). At stop it is cancelled once the requests have finished.
- `spawn(work, name)`: finite work that should finish (an Event being recorded, a late write);
  at stop it gets what is left of the grace period, then it is cancelled. `drain=False`: work
  only the requests need (a shared snapshot fetch, the first sync): cancelled at stop with the
  eternal tasks, never waited for.
- `submit(work, name)`: like `drain=False` work, with its outcome in a future for whoever
  awaits it (one snapshot fetch several requests share).
- `request(work, name)`: one request (a NATS message), at most `limit` at once: a caller waits
  for a free slot (back-pressure on the subscription rather than unbounded tasks). `track()`
  counts a request that runs in a task somebody else owns (aiohttp's handler tasks) the same.

A child that raises is logged; only an eternal one is critical. TaskGroup would cancel every
sibling on a child's exception, so each child is wrapped and no exception reaches the group.

`stop(grace)` is one grace period for everything: no request is taken once it began (a
request's work is closed unrun), the requests in flight finish, then the eternal and
`drain=False` tasks are cancelled and the finite ones finish, all by the same deadline; what is
left then is cancelled, and the group is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator
    from types import TracebackType

log = logging.getLogger("numafit")

T = TypeVar("T")

REQUEST_LIMIT = 256
"""Requests run at once per service by default; the next one waits for a free slot."""


class _Kind(enum.Enum):
    ETERNAL = "eternal"
    FINITE = "finite"
    HELPER = "helper"  # drain=False
    REQUEST = "request"


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    """What a supervisor runs now."""

    eternal: int
    finite: int
    """Background tasks waited for at stop (`spawn` without `eternal`)."""
    helpers: int
    """Background tasks cancelled at stop (`drain=False`)."""
    requests: int
    """Requests in flight: its own request tasks and the `track()`ed ones."""
    stopping: bool


class Supervisor:
    def __init__(
        self,
        name: str,
        *,
        on_fatal: Callable[[str], None] | None = None,
        limit: int = REQUEST_LIMIT,
    ) -> None:
        self.name = name
        self.on_fatal = on_fatal
        self.limit = limit
        self.stopping = False
        """Set once `stop` began: an eternal task ending from then on is no failure."""
        self._slots = asyncio.Semaphore(limit)
        self._requests = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._children: dict[asyncio.Task[Any], _Kind] = {}
        self._group: asyncio.TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._release = asyncio.Event()
        self._closed = False

    def __repr__(self) -> str:
        return f"<Supervisor {self.name} {len(self._children)} tasks>"

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True from `start` until the group closed: `spawn` works (while stopping too)."""
        return self._group is not None and not self._closed

    async def start(self) -> None:
        """Open the group (once; a second call does nothing)."""
        if self._host is not None:
            return
        if self._closed:
            raise RuntimeError(f"supervisor {self.name} was stopped")
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The one task not started in a group: the one the group runs in.
        self._host = asyncio.create_task(self._run(opened), name=f"{self.name}-supervisor")
        await opened

    async def _run(self, opened: asyncio.Future[None]) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                opened.set_result(None)
                await self._release.wait()
        finally:
            self._closed = True
            if not opened.done():
                opened.cancel()

    async def stop(self, grace: float = 0.0) -> None:
        """Finish within `grace` seconds (see the module docstring), then close the group."""
        self.stopping = True
        if self._host is None:
            self._closed = True
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(grace, 0.0)
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._idle.wait()
            self._cancel(_Kind.ETERNAL, _Kind.HELPER)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    while pending := [t for t in self._children if not t.done()]:
                        await asyncio.wait(pending)
        finally:
            # Reached on time, late, or with stop itself cancelled (the run loop's own bound):
            # the group closes either way, with nothing left running.
            self._cancel(*_Kind)
            self._release.set()
            await asyncio.wait([self._host])

    def _cancel(self, *kinds: _Kind) -> None:
        for task, kind in list(self._children.items()):
            if kind in kinds:
                task.cancel()

    async def __aenter__(self) -> Supervisor:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop(0.0)

    # --- children ---------------------------------------------------------------------------

    def spawn(
        self,
        work: Coroutine[Any, Any, T],
        name: str,
        *,
        eternal: bool = False,
        drain: bool = True,
    ) -> asyncio.Task[T | None]:
        """Run `work` as a child. `eternal`: critical (see the module docstring); `drain`
        False: cancelled at stop rather than waited for."""
        kind = _Kind.ETERNAL if eternal else _Kind.FINITE if drain else _Kind.HELPER
        return self._child(work, name, kind)

    def submit(self, work: Coroutine[Any, Any, T], name: str) -> asyncio.Future[T]:
        """Run `work` as a child whose outcome, its result or its exception, is the returned
        future's (for work several requests share, such as one snapshot fetch: they await it
        through `asyncio.shield`). Nothing is logged; like `drain=False` work it is cancelled
        at stop, and the future with it."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)

        async def run() -> None:
            try:
                result = await work
            except asyncio.CancelledError:
                future.cancel()
                raise
            except Exception as exc:
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)

        task = self._child(run(), name, _Kind.HELPER)

        def finished(_: object) -> None:
            future.cancel()  # a no-op once it has an outcome
            work.close()  # `work` never ran when the task was cancelled before it started

        task.add_done_callback(finished)
        return future

    def _child(
        self, work: Coroutine[Any, Any, T], name: str, kind: _Kind
    ) -> asyncio.Task[T | None]:
        if self._group is None or self._closed:
            work.close()
            state = "stopped" if self._closed else "not started"
            raise RuntimeError(f"supervisor {self.name} is {state}: cannot run {name}")
        task = self._group.create_task(self._guard(work, name, kind), name=name)
        self._children[task] = kind
        task.add_done_callback(self._children.pop)
        # Cancelled before it ever ran (at a stop's deadline), `work` was never awaited:
        # closing it says it is abandoned (a no-op once it ran).
        task.add_done_callback(lambda _: work.close())
        return task

    async def _guard(self, work: Coroutine[Any, Any, T], name: str, kind: _Kind) -> T | None:
        """Run one child; no exception leaves it (it would cancel every sibling)."""
        why = "returned"
        try:
            result = await work
        except asyncio.CancelledError:
            why = "cancelled"
            raise
        except Exception as exc:
            why = repr(exc)
            log.error("task failed", extra={"task": name}, exc_info=exc)
            return None
        else:
            return result
        finally:
            if kind is _Kind.ETERNAL and not self.stopping:
                self._fatal(name, why)

    def _fatal(self, name: str, why: str) -> None:
        reason = f"background task {name} ended ({why})"
        if self.on_fatal is not None:
            self.on_fatal(reason)
        else:
            log.error("eternal task ended", extra={"task": name, "why": why})

    # --- requests ---------------------------------------------------------------------------

    async def request(self, work: Coroutine[Any, Any, None], name: str = "request") -> bool:
        """Run one request as a child, waiting only while `limit` requests already run. False
        (and `work` closed unrun) once the supervisor is stopping or stopped."""
        if not self._accepting():
            work.close()
            return False
        await self._slots.acquire()
        if not self._accepting():
            self._slots.release()
            work.close()
            return False
        self._begin()
        try:
            task = self._child(work, name, _Kind.REQUEST)
        except BaseException:
            self._end()
            raise
        task.add_done_callback(lambda _: self._end())
        return True

    def _accepting(self) -> bool:
        return self.running and not self.stopping

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count a request running in a task the supervisor does not own: `stop` and
        `wait_idle` wait for it too (it does not take one of the `limit` slots)."""
        self._requests += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._requests -= 1
            if self._requests == 0:
                self._idle.set()

    def _begin(self) -> None:
        self._requests += 1
        self._idle.clear()

    def _end(self) -> None:
        self._slots.release()
        self._requests -= 1
        if self._requests == 0:
            self._idle.set()

    @property
    def requests(self) -> int:
        """Requests in flight."""
        return self._requests

    async def wait_idle(self) -> None:
        """Return once no request is in flight (bound it with `asyncio.timeout`)."""
        await self._idle.wait()

    def statistics(self) -> SupervisorStatistics:
        kinds = list(self._children.values())
        return SupervisorStatistics(
            eternal=kinds.count(_Kind.ETERNAL),
            finite=kinds.count(_Kind.FINITE),
            helpers=kinds.count(_Kind.HELPER),
            requests=self._requests,
            stopping=self.stopping,
        )


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark the outcome seen: a caller that gave up waiting must not leave it unreported."""
    if not future.cancelled():
        future.exception()
