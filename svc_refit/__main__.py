"""`numafit run refit` / `python -m svc_refit`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from shared.core.config import CoreConfig
from shared.service.runner import run, serve_spec
from shared.service.settings import add_common_arguments, common_from_args
from svc_refit.service import RefitOptions, spec

if TYPE_CHECKING:
    from collections.abc import Sequence


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
    options = RefitOptions(config=CoreConfig(gpu_scheduler_policy=args.gpu_scheduler_policy))
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_refit"))
