"""`numafit run scheduler` / `python -m svc_scheduler`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from shared.core.admission import DEFAULT_SCHEDULER_NAME
from shared.core.config import CoreConfig
from shared.service.runner import run, serve_spec
from shared.service.settings import add_common_arguments, common_from_args
from svc_scheduler.extender import DEFAULT_REQUEST_TIMEOUT
from svc_scheduler.server import tls_context
from svc_scheduler.service import SchedulerOptions, spec
from svc_scheduler.webhook import parse_scheduler_names

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

DESCRIPTION = """\
The numafit scheduler: a kube-scheduler extender and the pods' admission webhook.

Extender (configure kube-scheduler with svc_scheduler/deploy/scheduler-config.yaml), for pods
whose schedulerName is one of --scheduler-name (a GPU pod of any other scheduler is refused
by /filter and /bind, and nothing is reserved or written for it):
  POST /filter      fits the pod phase-aware on every candidate node, picks one by the node
                    policy, reserves its GPUs through accounting; keeps that node only, and
                    lists why every other node cannot hold the pod (e.g. "1/2
                    CardInsufficientMemory") so `kubectl describe pod` explains a Pending pod
  POST /prioritize  0..10 per node by the node policy (10 on the node a pod is reserved on)
  POST /bind        bind-phase "allocating" through accounting, then the Binding
Admission (svc_scheduler/deploy/webhooks.yaml):
  POST /webhook     mutating: GPU pods get --scheduler-name and normalised GPU resources;
                    refuses invalid hami.io/numa-alignment or hami.io/device-scoring-weights,
                    scheduler-owned annotations at creation, pods over their namespace quota
  POST /validate    the same refusals, without a patch
/healthz, /readyz (ready once the first snapshot from accounting landed) and /metrics are on
--metrics-port.
"""


def build_parser(prog: str = "numafit run scheduler") -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_arguments(parser, default_metrics_port=9101)
    group = parser.add_argument_group("scheduler options")
    group.add_argument(
        "--listen-host",
        default=env.get("NUMAFIT_LISTEN_HOST", "0.0.0.0"),
        help="address of the extender and webhook listener (default %(default)s)",
    )
    group.add_argument(
        "--listen-port",
        type=int,
        default=int(env.get("NUMAFIT_LISTEN_PORT", "8888")),
        help="port of the extender and webhook listener (env NUMAFIT_LISTEN_PORT; "
        "default %(default)s)",
    )
    group.add_argument(
        "--tls-cert-file",
        default=env.get("NUMAFIT_TLS_CERT_FILE") or None,
        help="PEM certificate: serve HTTPS (the API server only calls webhooks over HTTPS)",
    )
    group.add_argument(
        "--tls-key-file",
        default=env.get("NUMAFIT_TLS_KEY_FILE") or None,
        help="PEM private key of --tls-cert-file",
    )
    group.add_argument(
        "--scheduler-name",
        action="append",
        metavar="NAME[,NAME...]",
        help="numafit's scheduler names, the kube-scheduler profiles that use this extender: "
        "the only pods it reserves GPUs for and binds; the webhook gives GPU pods of the "
        "default scheduler the first. Repeat it or give a comma-separated list (env "
        f"NUMAFIT_SCHEDULER_NAME, a comma-separated list; default {DEFAULT_SCHEDULER_NAME})",
    )
    group.add_argument(
        "--node-scheduler-policy",
        default=env.get("NUMAFIT_NODE_SCHEDULER_POLICY", "binpack"),
        choices=["binpack", "spread"],
        help="node policy when a pod has no hami.io/node-scheduler-policy: binpack fills the "
        "most used node first, spread the least used (default %(default)s)",
    )
    group.add_argument(
        "--gpu-scheduler-policy",
        default=env.get("NUMAFIT_GPU_SCHEDULER_POLICY", "spread"),
        help="GPU policy when a pod has no hami.io/gpu-scheduler-policy (default %(default)s)",
    )
    group.add_argument(
        "--default-gpu-num",
        type=int,
        default=int(env.get("NUMAFIT_DEFAULT_GPU_NUM", "1")),
        help="GPU count the webhook adds to a container naming GPU memory or cores but no "
        "count; 0 adds none (default %(default)s)",
    )
    group.add_argument(
        "--request-timeout",
        type=float,
        default=float(env.get("NUMAFIT_REQUEST_TIMEOUT", DEFAULT_REQUEST_TIMEOUT)),
        help="seconds one extender call may take, reserve retries included; keep it under "
        "the extender's httpTimeout (default %(default)s)",
    )
    return parser


def scheduler_names_from(flags: list[str] | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """numafit's scheduler names: every `--scheduler-name` given, else the environment's
    comma-separated list, else the default (flags replace the environment, as every other
    flag's value does; argparse's `append` would add them to a default instead)."""
    return parse_scheduler_names(
        flags or [env.get("NUMAFIT_SCHEDULER_NAME") or DEFAULT_SCHEDULER_NAME]
    )


def main(argv: Sequence[str] | None = None, prog: str = "numafit run scheduler") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.default_gpu_num < 0:
        parser.error("--default-gpu-num must not be negative")
    try:
        scheduler_names = scheduler_names_from(args.scheduler_name, os.environ)
    except ValueError as exc:
        parser.error(f"--scheduler-name: {exc}")
    try:
        ssl_context = tls_context(args.tls_cert_file, args.tls_key_file)
    except (ValueError, OSError) as exc:
        parser.error(f"TLS: {exc}")
    settings = common_from_args(args)
    config = CoreConfig(
        gpu_scheduler_policy=args.gpu_scheduler_policy,
        node_scheduler_policy=args.node_scheduler_policy,
        default_gpu_num=args.default_gpu_num,
    )
    options = SchedulerOptions(
        config=config,
        scheduler_names=scheduler_names,
        host=args.listen_host,
        port=args.listen_port,
        ssl_context=ssl_context,
        request_timeout=args.request_timeout,
    )
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_scheduler"))
