"""`numafit run scheduler` / `python -m svc_scheduler`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from shared.service.runner import run, serve_spec
from shared.service.settings import common_from_args, service_parser
from svc_scheduler.server import tls_context
from svc_scheduler.service import spec
from svc_scheduler.settings import METRICS_PORT, SchedulerOptions

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.service.declare import SettingsParser

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
--metrics-port. Every flag can be given as its environment variable instead; a flag wins.
"""


def build_parser(
    prog: str = "numafit run scheduler", env: Mapping[str, str] | None = None
) -> SettingsParser:
    return service_parser(
        prog,
        DESCRIPTION,
        SchedulerOptions,
        metrics_port=METRICS_PORT,
        env=env,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def scheduler_names_from(flags: list[str] | None, env: Mapping[str, str]) -> tuple[str, ...]:
    """numafit's scheduler names: every `--scheduler-name` given, else the environment's
    comma-separated list, else the default (flags replace the environment, as every other
    flag's value does), by the same parser as `numafit run scheduler`."""
    parser = build_parser(env=env)
    args = parser.parse_args([f"--scheduler-name={flag}" for flag in flags or []])
    return parser.resolve(SchedulerOptions, args).scheduler_names


def main(argv: Sequence[str] | None = None, prog: str = "numafit run scheduler") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        ssl_context = tls_context(args.tls_cert_file, args.tls_key_file)
    except (ValueError, OSError) as exc:
        parser.error(f"TLS: {exc}")
    settings = common_from_args(args)
    options = parser.resolve(SchedulerOptions, args, ssl_context=ssl_context)
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_scheduler"))
