"""`numafit run scheduler` / `python -m svc_scheduler`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from shared.core.config import CoreConfig
from shared.service.runner import run, serve_spec
from shared.service.settings import add_common_arguments, common_from_args
from svc_scheduler.extender import DEFAULT_REQUEST_TIMEOUT
from svc_scheduler.server import tls_context
from svc_scheduler.service import SchedulerOptions, spec
from svc_scheduler.webhook import DEFAULT_SCHEDULER_NAME

if TYPE_CHECKING:
    from collections.abc import Sequence

DESCRIPTION = """\
The numafit scheduler: a kube-scheduler extender and the pods' admission webhook.

Extender (configure kube-scheduler with svc_scheduler/deploy/scheduler-config.yaml):
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
        default=env.get("NUMAFIT_SCHEDULER_NAME", DEFAULT_SCHEDULER_NAME),
        help="schedulerName the webhook gives GPU pods: the kube-scheduler profile that uses "
        "this extender (default %(default)s)",
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


def main(argv: Sequence[str] | None = None, prog: str = "numafit run scheduler") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.default_gpu_num < 0:
        parser.error("--default-gpu-num must not be negative")
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
        scheduler_name=args.scheduler_name,
        host=args.listen_host,
        port=args.listen_port,
        ssl_context=ssl_context,
        request_timeout=args.request_timeout,
    )
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_scheduler"))
