"""`numafit run refit` / `python -m svc_refit`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from shared.service.runner import run, serve_spec
from shared.service.settings import common_from_args, service_parser
from svc_refit.service import spec
from svc_refit.settings import METRICS_PORT, RefitOptions

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.service.declare import SettingsParser

DESCRIPTION = (
    "The refit service: answers NUMA refit requests on numafit.refit.v1.<node> (queue group "
    "numafit-refit), re-running the scheduler's fit restricted to kubelet's allowed GPUs and "
    "committing the move through accounting within the request's timeoutMs. Every flag can "
    "be given as its environment variable instead; a flag wins."
)


def build_parser(
    prog: str = "numafit run refit", env: Mapping[str, str] | None = None
) -> SettingsParser:
    return service_parser(prog, DESCRIPTION, RefitOptions, metrics_port=METRICS_PORT, env=env)


def main(argv: Sequence[str] | None = None, prog: str = "numafit run refit") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    settings = common_from_args(args)
    options = parser.resolve(RefitOptions, args)
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_refit"))
