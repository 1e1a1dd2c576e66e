"""Namespace quota for GPU memory and cores (reference e.5, e.6).

A check passes unless a limit was explicitly set and `used + request > limit`. Usage is the sum
of memory and cores of every tracked pod's stored (phase-aware) value; slots are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.core.accounting import Rows, effective, total
from shared.core.errors import ObjectError, RequestError
from shared.core.model import ContainerKind, Usage
from shared.core.quantity import parse_integer_quantity

if TYPE_CHECKING:
    from shared.core.config import CoreConfig


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """Explicit limits of one namespace; None = not set (unbounded)."""

    mem: int | None = None
    cores: int | None = None


@dataclass(slots=True)
class QuotaLedger:
    """Per-namespace limits and the usage counted against them."""

    limits: dict[str, QuotaLimit] = field(default_factory=dict)
    used: dict[str, Usage] = field(default_factory=dict)

    def add(self, namespace: str, usage: Mapping[str, Usage]) -> None:
        self.used[namespace] = self.used.get(namespace, Usage()) + total(usage)

    def remove(self, namespace: str, usage: Mapping[str, Usage]) -> None:
        self.used[namespace] = self.used.get(namespace, Usage()).clamp_sub(total(usage))

    def limited(self, namespace: str) -> bool:
        limit = self.limits.get(namespace)
        return limit is not None and (limit.mem is not None or limit.cores is not None)

    def fits(self, namespace: str, request: Usage, exclude: Usage = Usage()) -> bool:
        """FitQuota: would `request` more stay within the limits? `exclude` is usage of the pod
        being re-placed, taken out of the counted usage first (the pod is not counted against
        itself)."""
        limit = self.limits.get(namespace)
        if limit is None:
            return True
        used = self.used.get(namespace, Usage()).clamp_sub(exclude)
        if limit.mem is not None and used.mem + request.mem > limit.mem:
            return False
        return not (limit.cores is not None and used.cores + request.cores > limit.cores)


def _limit_from(hard: Mapping[str, Any], resource: str, where: str) -> int | None:
    values = []
    for prefix in ("limits.", "requests.", ""):
        raw = hard.get(prefix + resource)
        if raw is not None:
            try:
                values.append(parse_integer_quantity(raw, f"{where} {prefix}{resource}"))
            except RequestError as exc:
                raise ObjectError(str(exc)) from exc
    return min(values) if values else None


def limits_from_quotas(quotas: Iterable[Any], config: CoreConfig) -> dict[str, QuotaLimit]:
    """Explicit GPU limits per namespace from ResourceQuota objects (`spec.hard`, keys with a
    `limits.` or `requests.` prefix; the tighter wins). Memory limits are multiplied by
    memoryFactor when it is above 1, as HAMi does."""
    result: dict[str, QuotaLimit] = {}
    for obj in quotas:
        if not isinstance(obj, Mapping):
            raise ObjectError("resourceQuotas entries must be objects")
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            raise ObjectError("resourceQuota metadata and spec must be objects")
        namespace = meta.get("namespace") or "default"
        if not isinstance(namespace, str):
            raise ObjectError("resourceQuota metadata.namespace must be a string")
        hard = spec.get("hard") or {}
        if not isinstance(hard, Mapping):
            raise ObjectError("resourceQuota spec.hard must be an object")
        where = f"resourceQuota {namespace}/{meta.get('name', '?')}"
        mem = _limit_from(hard, config.resource_memory_name, where)
        if mem is not None and config.memory_factor > 1:
            mem *= config.memory_factor
        cores = _limit_from(hard, config.resource_core_name, where)
        previous = result.get(namespace, QuotaLimit())
        result[namespace] = QuotaLimit(_tighter(previous.mem, mem), _tighter(previous.cores, cores))
    return result


def _tighter(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


@dataclass(frozen=True, slots=True)
class QuotaProbe:
    """The fit's per-candidate quota check for one pod (d.5 row 8).

    Rows keep their real container positions, so a sidecar or app is never mistaken for an
    init container (the compaction bug of HAMi #2828 cannot happen here).
    """

    ledger: QuotaLedger
    namespace: str
    kinds: Sequence[ContainerKind]
    released: bool
    exclude: Usage = Usage()

    def fits(self, rows: Rows) -> bool:
        return self.ledger.fits(
            self.namespace, total(effective(self.kinds, rows, self.released)), self.exclude
        )
