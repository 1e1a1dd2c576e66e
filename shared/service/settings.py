"""Command-line settings common to every service (flags over environment over defaults)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.service.logs import add_log_level_argument

if TYPE_CHECKING:
    import argparse


@dataclass(frozen=True, slots=True)
class CommonSettings:
    nats_url: str
    """NATS server URL(s), comma-separated."""
    kubeconfig: str | None
    """Path of a kubeconfig; None means in-cluster configuration."""
    metrics_host: str
    metrics_port: int
    """Port of /healthz, /readyz and /metrics (0 = pick a free one, for tests)."""
    log_level: str
    log_format: str
    """`json` (one object per line) or `text`."""
    grace_seconds: float
    """How long SIGTERM waits for in-flight requests before closing."""
    nats_connect_timeout: float = 30.0
    """How long the first NATS connection may take before the service gives up (exit 1)."""
    nats_inbox_prefix: str = "_INBOX"
    """Subject prefix of this client's reply inboxes (per-user prefixes keep replies private)."""


def add_common_arguments(parser: argparse.ArgumentParser, default_metrics_port: int) -> None:
    env = os.environ
    group = parser.add_argument_group("common service options")
    group.add_argument(
        "--nats-url",
        default=env.get("NUMAFIT_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server URL(s), comma-separated (env NUMAFIT_NATS_URL; default %(default)s)",
    )
    group.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG") or None,
        help="kubeconfig path (env KUBECONFIG); in-cluster configuration when absent",
    )
    group.add_argument(
        "--metrics-host",
        default=env.get("NUMAFIT_METRICS_HOST", "0.0.0.0"),
        help="address of /healthz, /readyz and /metrics (default %(default)s)",
    )
    group.add_argument(
        "--metrics-port",
        type=int,
        default=int(env.get("NUMAFIT_METRICS_PORT", default_metrics_port)),
        help="port of /healthz, /readyz and /metrics (env NUMAFIT_METRICS_PORT; "
        "default %(default)s)",
    )
    add_log_level_argument(
        group,
        default=env.get("NUMAFIT_LOG_LEVEL", "info"),
        help="log level (env NUMAFIT_LOG_LEVEL; default %(default)s)",
    )
    group.add_argument(
        "--log-format",
        default=env.get("NUMAFIT_LOG_FORMAT", "json"),
        choices=["json", "text"],
        help="json: one object per line for log pipelines; text: for people (default %(default)s)",
    )
    group.add_argument(
        "--grace-seconds",
        type=float,
        default=float(env.get("NUMAFIT_GRACE_SECONDS", "10")),
        help="on SIGTERM, how long to finish in-flight requests (default %(default)s)",
    )
    _add_connect_timeout(group)


def _add_connect_timeout(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--nats-inbox-prefix",
        default=os.environ.get("NUMAFIT_NATS_INBOX_PREFIX", "_INBOX"),
        help="reply-inbox subject prefix (env NUMAFIT_NATS_INBOX_PREFIX; default %(default)s); "
        "with per-user NATS permissions give each user its own, e.g. _INBOX_node-1",
    )
    group.add_argument(
        "--nats-connect-timeout",
        type=float,
        default=float(os.environ.get("NUMAFIT_NATS_CONNECT_TIMEOUT", "30")),
        help="seconds to wait for the first NATS connection before exiting 1 (default "
        "%(default)s); later disconnects are retried forever",
    )


def common_from_args(args: argparse.Namespace) -> CommonSettings:
    return CommonSettings(
        nats_url=args.nats_url,
        kubeconfig=args.kubeconfig,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
        log_format=args.log_format,
        grace_seconds=args.grace_seconds,
        nats_connect_timeout=args.nats_connect_timeout,
        nats_inbox_prefix=args.nats_inbox_prefix,
    )
