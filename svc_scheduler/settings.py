"""`numafit run scheduler`'s settings, declared once (`shared.service.declare`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.core.config import CoreConfig
from shared.core.webhook_rules import DEFAULT_SCHEDULER_NAME
from shared.service.declare import group, listing, member, setting
from shared.service.settings import gpu_scheduler_policy, node_scheduler_policy, port
from shared.service.values import optional_text, whole
from svc_scheduler.extender import DEFAULT_REQUEST_TIMEOUT
from svc_scheduler.webhook import parse_scheduler_names

if TYPE_CHECKING:
    import ssl

METRICS_PORT = 9101
SCHEDULER = "scheduler options"
"""The help section of these settings."""


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """Everything the scheduler extender and webhook are configured with, received whole."""

    config: CoreConfig = group(
        CoreConfig,
        node_scheduler_policy=node_scheduler_policy(SCHEDULER),
        gpu_scheduler_policy=gpu_scheduler_policy(SCHEDULER),
        default_gpu_num=member(
            "GPU count the webhook adds to a container naming GPU memory or cores but no "
            "count; 0 adds none",
            parse=whole(0),
            section=SCHEDULER,
        ),
    )
    scheduler_names: tuple[str, ...] = listing(
        (DEFAULT_SCHEDULER_NAME,),
        "numafit's scheduler names, the kube-scheduler profiles that use this extender: the "
        "only pods it reserves GPUs for and binds; the webhook gives GPU pods of the default "
        "scheduler the first. Repeat it or give a comma-separated list",
        parse=parse_scheduler_names,
        flag="--scheduler-name",
        metavar="NAME[,NAME...]",
        section=SCHEDULER,
    )
    host: str = setting(
        "0.0.0.0",
        "address of the extender and webhook listener",
        flag="--listen-host",
        section=SCHEDULER,
    )
    port: int = setting(
        8888,
        "port of the extender and webhook listener (0: a free one, for tests)",
        parse=port,
        flag="--listen-port",
        section=SCHEDULER,
    )
    tls_cert_file: str | None = setting(
        None,
        "PEM certificate: serve HTTPS (the API server only calls webhooks over HTTPS)",
        parse=optional_text,
        shown_default="none (HTTP)",
        metavar="PATH",
        section=SCHEDULER,
    )
    tls_key_file: str | None = setting(
        None,
        "PEM private key of --tls-cert-file",
        parse=optional_text,
        metavar="PATH",
        section=SCHEDULER,
    )
    request_timeout: float = setting(
        DEFAULT_REQUEST_TIMEOUT,
        "how long one extender call may take, reserve retries included; keep it under the "
        "extender's httpTimeout",
        unit="s",
        section=SCHEDULER,
    )
    ssl_context: ssl.SSLContext | None = None
    """Serve HTTPS with it: made from --tls-cert-file and --tls-key-file by `numafit run`,
    given directly by embedded callers."""
