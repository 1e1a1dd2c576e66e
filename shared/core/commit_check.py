"""The commit check: does a reservation still fit the node it is written to?

Accounting is the single writer of reservations, so it re-checks every `reserve` and `move`
itself, whoever asks: a caller's decision may rest on a stale read model, and a node's
credentials could name any placement at all. The check is the fit's own, not a second copy of
its rules: every device the commit adds usage to is handed to `fit.fit_container`, alone in a
one-device snapshot, for each phase of the pod that runs on it.

How the end state maps onto the fit's incremental check (reference d.5, d.6, e.2): the node's
ledger counts every tracked pod's stored usage; the pod's own current usage is taken out, which
leaves the other pods (`O`). A pod's containers do not all run at once, so each phase is
checked on its own, as d.6 fits them: the running phase (sidecars and apps) and, until the init
phase is released, each regular init container beside the sidecars declared before it. For a
phase that puts `P` (memory, cores, slots) on a device, one of its rows is the *probe* (the
request the fit checks) and the rest of `P` is charged onto the device first, so the fit's
"free >= request" tests read exactly `O + P <= capacity`; health, cordon, vendor type,
time-slicing slots, exclusive use of a whole card, exhausted compute units and MIG are the
fit's checks on that device. The probe is the phase's row with the most cores (then memory),
so a 100-core row meets the fit's exclusivity rule.

Only what the commit adds is judged: a device whose usage by the pod does not grow is not
checked (a move away from a since-cordoned GPU, or re-reserving the same placement, is never
refused), and a reservation that fits exactly is accepted. Namespace quota is checked on the
pod's total, with its own current usage excluded (reference e.5).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.accounting import Rows, TrackedPod, effective, kind_at, total
from shared.core.fit import (
    CARD_UUID_MISMATCH,
    RESOURCE_QUOTA_NOT_FIT,
    FitOptions,
    fit_container,
    format_reasons,
)
from shared.core.model import (
    ContainerDevice,
    ContainerEntry,
    ContainerKind,
    NodeSnapshot,
    Usage,
)
from shared.core.nodes import usage_growth
from shared.core.policy import parse_policy
from shared.core.requests import ContainerRequest

if TYPE_CHECKING:
    from shared.core.quota import QuotaLedger

NEUTRAL_OPTIONS = FitOptions(parse_policy("spread"))
"""No pod-level filters: the commit check judges capacity and device state, not preferences
(the caller's fit already applied the pod's policy, UUID and type filters)."""

MAX_CORES = 100
"""The fit clamps a container's cores request at one whole GPU."""


@dataclass(frozen=True, slots=True)
class CommitCheck:
    """HAMi's reason names with the number of devices refused for each (empty when the commit
    fits), and how many devices were judged."""

    reasons: Mapping[str, int]
    considered: int

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def quota_only(self) -> bool:
        return set(self.reasons) == {RESOURCE_QUOTA_NOT_FIT}

    @property
    def reason_text(self) -> str:
        """HAMi's `"<count>/<considered> <Reason>"` items."""
        return format_reasons(self.reasons, max(self.considered, 1))


def _phases(
    kinds: Sequence[ContainerKind], rows: Sequence[ContainerEntry], released: bool
) -> list[list[ContainerDevice]]:
    """Rows that run together: the running phase first, then (unless released) each regular
    init container with the sidecars declared before it."""
    running: list[ContainerDevice] = []
    sidecars: list[ContainerDevice] = []
    inits: list[list[ContainerDevice]] = []
    for position, entry in enumerate(rows):
        kind = kind_at(kinds, position)
        if kind is ContainerKind.INIT:
            if not released:
                inits.append([*sidecars, *entry])
            continue
        running.extend(entry)
        if kind is ContainerKind.SIDECAR:
            sidecars.extend(entry)
    return [running, *inits]


def _positional(rows: Rows) -> list[ContainerEntry]:
    if isinstance(rows, Mapping):
        if not rows:
            return []
        result: list[ContainerEntry] = [() for _ in range(max(rows) + 1)]
        for position, entry in rows.items():
            result[position] = entry
        return result
    return list(rows)


def check_commit(
    node: NodeSnapshot,
    tracked: TrackedPod | None,
    rows: Rows,
    kinds: Sequence[ContainerKind],
    released: bool,
    *,
    namespace: str = "",
    quota: QuotaLedger | None = None,
    options: FitOptions = NEUTRAL_OPTIONS,
) -> CommitCheck:
    """Would writing `rows` as the pod's reservation on `node` over-commit anything?

    `node` is the ledger's snapshot of the node, counting every tracked pod (the pod itself
    included when `tracked` lives on this node); it is not modified. `tracked` is the pod's
    current ledger entry, on any node, or None. Quota (when `quota` is given) is judged for
    `namespace` on the pod's total.
    """
    positional = _positional(rows)
    new_usage = effective(kinds, positional, released)
    old_here: Mapping[str, Usage] = (
        tracked.usage if tracked is not None and tracked.node == node.name else {}
    )
    # Only the devices the commit grows are judged: each is taken out of the node's snapshot
    # alone, with the pod's own usage there removed (without copying the whole node).
    devices = node.by_uuid()

    reasons: Counter[str] = Counter()
    considered = 0
    phases = _phases(kinds, positional, released)
    grown = usage_growth(old_here, new_usage)
    for uuid in new_usage:
        if uuid not in grown:
            continue
        considered += 1
        found = devices.get(uuid)
        if found is None:
            reasons[CARD_UUID_MISMATCH] += 1
            continue
        device = found.copy()
        before = old_here.get(uuid)
        if before is not None:
            device.subtract(before.counted)
        for phase in phases:
            here = [d for d in phase if d.uuid == uuid]
            if not here:
                continue
            probe = max(here, key=lambda d: (d.usedcores, d.usedmem))
            charged = device.copy()
            rest = Usage(
                sum(d.usedmem for d in here) - probe.usedmem,
                sum(d.usedcores for d in here) - min(probe.usedcores, MAX_CORES),
                len(here) - 1,
            )
            charged.add(rest)
            alone = NodeSnapshot(node.name, [charged], node.cordoned)
            request = ContainerRequest(
                nums=1, type=probe.type, memreq=probe.usedmem, coresreq=probe.usedcores
            )
            fit = fit_container(alone, request, options, 0, {})
            if not fit.ok:
                reasons.update(fit.reasons)
                break

    if quota is not None:
        exclude = total(tracked.usage) if tracked is not None else Usage()
        if not quota.fits(namespace, total(new_usage), exclude):
            reasons[RESOURCE_QUOTA_NOT_FIT] += 1
    return CommitCheck(dict(reasons), considered)
