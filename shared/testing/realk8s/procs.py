"""Child processes of a loopback control plane (and of the real test tier), each in its own
process group with its own log file.

Every child is a session leader (`start_new_session`), so stopping it signals the whole group:
kube-apiserver, etcd and numafit's services leave no grandchild behind. `stop_all` runs when
their owner stops (a failed test included) and, as a last resort, at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

GRACE = 10.0
"""Seconds a child gets after SIGTERM before its group is killed."""

_LIVE: weakref.WeakSet[Processes] = weakref.WeakSet()


class Child:
    def __init__(self, name: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The end of its log, for a failure message."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, number: int) -> None:
        """`number` to the child's whole process group (nothing if it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)

    def stop(self, grace: float = GRACE) -> int | None:
        """SIGTERM to the group, SIGKILL after `grace`; the exit status (None if never seen)."""
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                return self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # Gone or not, a grandchild may still hold the group: kill it, then reap the child.
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(grace)
        return None


class Processes:
    """The children one fixture started, stopped newest first."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.children: list[Child] = []
        logs.mkdir(parents=True, exist_ok=True)
        _LIVE.add(self)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Child:
        log = self.logs / f"{name}.log"
        with log.open("ab") as handle:  # the child keeps its own descriptor
            process = subprocess.Popen(
                list(argv),
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        with contextlib.suppress(ValueError):
            self.children.remove(child)

    def stop_all(self, grace: float = GRACE) -> None:
        while self.children:
            self.children.pop().stop(grace)


@atexit.register
def _stop_leftovers() -> None:
    for processes in list(_LIVE):
        processes.stop_all(grace=2.0)
