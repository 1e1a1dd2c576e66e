"""`numafit run refit` / `python -m svc_refit`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from nats.aio.client import Client
from prometheus_client import CollectorRegistry

from shared.core.config import CoreConfig
from shared.service.health import Readiness
from shared.service.kube_io import Kube
from shared.service.runner import run, serve
from shared.service.settings import add_common_arguments, common_from_args
from svc_refit.metrics import RefitMetrics
from svc_refit.service import RefitService


def build_parser(prog: str = "numafit run refit") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "The refit service: answers NUMA refit requests on numafit.refit.v1.<node> (queue "
            "group numafit-refit), re-running the scheduler's fit restricted to kubelet's "
            "allowed GPUs and committing the move through accounting within the request's "
            "timeoutMs."
        ),
    )
    add_common_arguments(parser, default_metrics_port=9103)
    parser.add_argument(
        "--gpu-scheduler-policy",
        default=os.environ.get("NUMAFIT_GPU_SCHEDULER_POLICY", "spread"),
        help="default GPU policy when a pod names none (default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "numafit run refit") -> int:
    args = build_parser(prog).parse_args(argv)
    settings = common_from_args(args)
    config = CoreConfig(gpu_scheduler_policy=args.gpu_scheduler_policy)
    readiness = Readiness("nats")

    def factory(
        nc: Client, kube: Kube | None, registry: CollectorRegistry, ready: Readiness
    ) -> RefitService:
        assert kube is not None
        return RefitService(
            nc, kube, config=config, metrics=RefitMetrics(registry), readiness=ready
        )

    return run(
        serve("numafit-refit", settings, factory, readiness),
        settings.log_level,
        settings.log_format,
    )


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_refit"))
