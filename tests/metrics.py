"""Reading a service's metrics the way a scrape does: by exported name and labels."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from prometheus_client import CollectorRegistry

    from svc_accounting.service import AccountingService
    from svc_refit.service import RefitService


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The value of the series `name{labels}` (`name` as exported: counters end in `_total`).

    A series the service never created fails the test: every labelled series numafit exports
    exists from the start, so a missing one is a wrong name or label, not a zero."""
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"no series {name}{labels}"
    return value


def refit_counter(refit: RefitService | None, name: str, **labels: str) -> float:
    """svc_refit's counter `numafit_refit_<name>_total{labels}`."""
    assert refit is not None
    return sample(refit.metrics.registry, f"numafit_refit_{name}_total", **labels)


def reserved(
    accounting: AccountingService | None, node: str, uuids: Iterable[str]
) -> dict[str, dict[str, int]]:
    """What accounting says is reserved on each GPU of `node`, from its per-device gauges, in
    the usage table's shape (`{uuid: {used, usedmem, usedcores}}`)."""
    assert accounting is not None
    registry = accounting.metrics.registry
    names = {
        "used": "numafit_accounting_device_slots_reserved",
        "usedmem": "numafit_accounting_device_memory_reserved_mib",
        "usedcores": "numafit_accounting_device_cores_reserved",
    }
    return {
        uuid: {
            key: int(sample(registry, name, node=node, uuid=uuid)) for key, name in names.items()
        }
        for uuid in uuids
    }
