"""`numafit run accounting`'s settings, declared once (`shared.service.declare`).

The defaults are the constants of the modules that use them (one value each); the fields
without a flag are for embedded services (simulate, bench, tests) only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.core.config import CoreConfig
from shared.core.partitions import SLOTS
from shared.service.declare import setting
from shared.service.events import TIMEOUT as EVENT_TIMEOUT
from shared.service.values import Parser, whole
from svc_accounting.leases import DEFAULT_BUCKET, DEFAULT_PARTITIONS, DEFAULT_TTL
from svc_accounting.pod_ops import DEFAULT_RESERVATION_TTL
from svc_accounting.pod_writes import DEFAULT_WRITE_TIMEOUT

METRICS_PORT = 9102
MAX_PARTITIONS = SLOTS
"""Each partition holds at least one slot of the subjects (shared/core/partitions.py)."""
REPLICA_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
REPLICAS = "replicas"
"""The help section of the replica settings."""
SECTIONS = {
    REPLICAS: (
        "Several replicas share the nodes: each node's partition is served by exactly one "
        "replica at a time, through leases in a JetStream key-value bucket (NATS must run "
        "with JetStream). A replica that dies is replaced within --lease-ttl; one that stops "
        "hands its partitions over at once."
    )
}


def _replica_id(text: str) -> str:
    if text and not REPLICA_ID.fullmatch(text):
        raise ValueError(f"{text[:80]!r}: a replica id is 1-64 letters, digits, '-' or '_'")
    return text


check_replica_id = Parser(_replica_id, "1-64 letters, digits, '-' or '_'")
partition_count = whole(0, MAX_PARTITIONS)


@dataclass(frozen=True, slots=True)
class AccountingOptions:
    """Everything the accounting service is configured with, received whole."""

    config: CoreConfig = field(default_factory=CoreConfig)
    quota_resync_seconds: float = setting(
        30.0,
        "ResourceQuotas are watched (changes apply at once); the quota watch is renewed at "
        "least this often",
        unit="s",
    )
    write_timeout: float = setting(
        DEFAULT_WRITE_TIMEOUT, "longest one Kubernetes API write may take", unit="s"
    )
    reservation_ttl: float = setting(
        DEFAULT_RESERVATION_TTL,
        "how long a filter's reservation is held, unwritten, waiting for its bind; one not "
        "bound by then is released and kube-scheduler schedules the pod again",
        unit="s",
    )
    partitions: int = setting(
        DEFAULT_PARTITIONS,
        "partitions the nodes are spread over (each serves some of the subjects' slots); every "
        "replica must use the same number. 0: a single replica owns every node, without "
        "JetStream",
        parse=partition_count,
        section=REPLICAS,
    )
    lease_ttl: float = setting(
        DEFAULT_TTL,
        "how long a partition's lease lives without renewal: a dead replica's partitions are "
        "taken over after at most this long (renewed every third of it)",
        unit="s",
        section=REPLICAS,
    )
    lease_bucket: str = setting(
        DEFAULT_BUCKET, "JetStream key-value bucket of the leases", section=REPLICAS
    )
    replica_id: str = setting(
        "",
        "this replica's name in the lease bucket, unique among the replicas (e.g. the pod name)",
        parse=check_replica_id,
        shown_default="host name and process id",
        section=REPLICAS,
    )
    event_timeout: float = EVENT_TIMEOUT
    """Seconds the drift Event may take to record (informational: never worth waiting on)."""
    watch_timeout_seconds: int = 300
    """Seconds one watch request lasts before it is renewed (the API server's timeout)."""
