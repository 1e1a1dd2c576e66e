"""The settings every service takes, declared once (`shared.service.declare`).

Each service's own are in `svc_<name>/settings.py`; `service_parser` makes the parser of
`numafit run <name>` from both.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from shared.core.config import NODE_POLICIES, check_node_policy
from shared.core.policy import check_gpu_policy
from shared.service.declare import Setting, SettingsParser, member, setting
from shared.service.logs import LOG_LEVELS
from shared.service.values import checked, optional_text, seconds, whole

if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

COMMON = "common service options"
"""The help section of these settings."""
port = whole(0, 65535)


@dataclass(frozen=True, slots=True)
class CommonSettings:
    nats_url: str = setting(
        "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated", metavar="URL"
    )
    kubeconfig: str | None = setting(
        None,
        "kubeconfig path; in-cluster configuration when absent",
        parse=optional_text,
        aliases=("KUBECONFIG",),
        shown_default="in-cluster configuration",
        metavar="PATH",
    )
    metrics_host: str = setting("0.0.0.0", "address of /healthz, /readyz and /metrics")
    metrics_port: int = setting(
        0, "port of /healthz, /readyz and /metrics (0: a free one, for tests)", parse=port
    )
    log_level: str = setting("info", "log level, any case", parse=str.lower, choices=LOG_LEVELS)
    log_format: str = setting(
        "json",
        "json: one object per line for log pipelines; text: for people",
        choices=("json", "text"),
    )
    grace_seconds: float = setting(
        10.0,
        "on SIGTERM, how long in-flight requests may take to finish before closing",
        parse=seconds(allow_zero=True),
        unit="s",
    )
    nats_connect_timeout: float = setting(
        30.0,
        "how long the first NATS connection may take before the service exits 1; later "
        "disconnects are retried forever",
        unit="s",
    )
    nats_inbox_prefix: str = setting(
        "_INBOX",
        "subject prefix of this client's reply inboxes; with per-user NATS permissions give "
        "each user its own, e.g. _INBOX_node-1",
    )


gpu_policy = checked(check_gpu_policy)
"""A GPU policy as the core takes it (refused here so that a typo fails at start, not as odd
placements later)."""
node_policy = checked(check_node_policy)


def gpu_scheduler_policy(section: str = "") -> Setting:
    """`--gpu-scheduler-policy`, a member of CoreConfig (scheduler and refit)."""
    return member(
        "GPU policy when a pod has no hami.io/gpu-scheduler-policy: spread, binpack, or a "
        "comma chain such as binpack,numa",
        parse=gpu_policy,
        section=section,
    )


def node_scheduler_policy(section: str = "") -> Setting:
    return member(
        "node policy when a pod has no hami.io/node-scheduler-policy: binpack fills the most "
        "used node first, spread the least used",
        parse=node_policy,
        choices=NODE_POLICIES,
        section=section,
    )


def service_parser(
    prog: str,
    description: str,
    options: type[Any],
    *,
    metrics_port: int,
    sections: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    **parser_args: Any,
) -> SettingsParser:
    """The parser of `numafit run <service>`: the common settings (with this service's
    metrics port), then the service's own (`options`, a dataclass of settings)."""
    parser = SettingsParser(prog=prog, description=description, env=env, **parser_args)
    parser.declare(CommonSettings, title=COMMON, defaults={"metrics_port": metrics_port})
    parser.declare(options, sections=sections)
    return parser


def common_from_args(args: argparse.Namespace) -> CommonSettings:
    """The common settings of parsed arguments (every one resolved by the parser)."""
    return CommonSettings(**{f.name: getattr(args, f.name) for f in fields(CommonSettings)})
