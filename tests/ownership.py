"""Partition ownership over time, as accounting replicas report it, and the one property that
matters: no partition was served by two replicas at once."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

INFINITY = float("inf")


@dataclass
class Timeline:
    """Serving intervals per partition: `start(replica, k, t)` ... `end(replica, k, t)`."""

    _open: dict[tuple[str, int], float] = field(default_factory=dict)
    spans: dict[int, list[tuple[float, float, str]]] = field(default_factory=dict)

    def start(self, replica: str, partition: int, at: float) -> None:
        self._open.setdefault((replica, partition), at)

    def end(self, replica: str, partition: int, at: float) -> None:
        started = self._open.pop((replica, partition), None)
        if started is not None:
            self.spans.setdefault(partition, []).append((started, at, replica))

    def end_all(self, replica: str, at: float) -> None:
        """The replica died at `at` (SIGKILL): everything it served ended then."""
        for who, k in [key for key in self._open if key[0] == replica]:
            self.end(who, k, at)

    def overlaps(self) -> list[str]:
        """Every pair of replicas that served one partition at overlapping times."""
        spans = {k: list(v) for k, v in self.spans.items()}
        for (replica, k), started in self._open.items():
            spans.setdefault(k, []).append((started, INFINITY, replica))
        found = []
        for k, intervals in spans.items():
            for (s1, e1, r1), (s2, e2, r2) in itertools.combinations(sorted(intervals), 2):
                if r1 != r2 and s2 < e1 and s1 < e2:
                    found.append(f"partition {k}: {r1} [{s1}, {e1}) and {r2} [{s2}, {e2})")
        return found

    def changes(self) -> int:
        return sum(len(v) for v in self.spans.values()) + len(self._open)
