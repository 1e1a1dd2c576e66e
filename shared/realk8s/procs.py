"""The control plane's child processes: each a session leader with its own log file, so that
stopping one signals its whole process group (no grandchild is left behind), newest first,
and, as a last resort, at interpreter exit."""

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

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        """The end of its log, for an error message."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, number: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)

    def stop(self, grace: float = GRACE) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        # Gone or not, a grandchild may still hold the group.
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(grace)


class Processes:
    def __init__(self, logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.logs = logs
        self.children: list[Child] = []
        _LIVE.add(self)

    def start(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> Child:
        log = self.logs / f"{name}.log"
        with log.open("ab") as handle:  # the child keeps its own descriptor
            process = subprocess.Popen(
                list(argv),
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if env is None else dict(env),
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
