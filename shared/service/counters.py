"""Labelled counters (and histograms) exported from the start, at zero.

A labelled counter has no series until its first increment, so after a restart an alert ratio
such as `rate(errors) / rate(total)` evaluates to nothing instead of 0 and a `for:` clause starts
over. Every service creates the children of every label value it can produce when it starts.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client.metrics import MetricWrapperBase


def at_zero(counter: MetricWrapperBase, *values: Iterable[str]) -> None:
    """Create `counter`'s child for every combination of the label values given, one iterable
    per label in the counter's label order."""
    for combination in itertools.product(*(tuple(v) for v in values)):
        counter.labels(*combination)
