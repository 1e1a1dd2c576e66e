"""`numafit run accounting` / `python -m svc_accounting`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from shared.service.runner import run, serve_spec
from shared.service.settings import common_from_args, service_parser
from svc_accounting.service import spec
from svc_accounting.settings import METRICS_PORT, SECTIONS, AccountingOptions

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.service.declare import SettingsParser

DESCRIPTION = (
    "The accounting service: owns every per-pod GPU reservation, is the only writer of the "
    "allocation annotations, rebuilds its ledger from them on start, and serves reserve / "
    "bind-phase / move / consume / pending / snapshot / register on "
    "numafit.accounting.v1.<op>.<node>, publishing usage on numafit.usage.v1.<node>. Every "
    "flag can be given as its environment variable instead; a flag wins."
)


def build_parser(
    prog: str = "numafit run accounting", env: Mapping[str, str] | None = None
) -> SettingsParser:
    return service_parser(
        prog,
        DESCRIPTION,
        AccountingOptions,
        metrics_port=METRICS_PORT,
        sections=SECTIONS,
        env=env,
    )


def main(argv: Sequence[str] | None = None, prog: str = "numafit run accounting") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    settings = common_from_args(args)
    options = parser.resolve(AccountingOptions, args)
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_accounting"))
