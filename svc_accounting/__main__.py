"""`numafit run accounting` / `python -m svc_accounting`."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from shared.service.runner import run, serve_spec
from shared.service.settings import add_common_arguments, common_from_args
from svc_accounting.operations import DEFAULT_RESERVATION_TTL
from svc_accounting.service import AccountingOptions, spec

if TYPE_CHECKING:
    from collections.abc import Sequence


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number of seconds")
    return value


def build_parser(prog: str = "numafit run accounting") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "The accounting service: owns every per-pod GPU reservation, is the only writer of "
            "the allocation annotations, rebuilds its ledger from them on start, and serves "
            "reserve / bind-phase / move / consume / pending / snapshot / register on "
            "numafit.accounting.v1.<op>.<node>, publishing usage on numafit.usage.v1.<node>."
        ),
    )
    add_common_arguments(parser, default_metrics_port=9102)
    parser.add_argument(
        "--write-timeout",
        type=float,
        default=2.0,
        help="longest an API write may take, in seconds (default %(default)s)",
    )
    parser.add_argument(
        "--reservation-ttl",
        type=_positive_seconds,
        default=DEFAULT_RESERVATION_TTL,
        help=(
            "seconds a filter's reservation is held, unwritten, waiting for its bind; one not "
            "bound by then is released and kube-scheduler schedules the pod again "
            "(default %(default)s)"
        ),
    )
    parser.add_argument(
        "--quota-resync-seconds",
        type=float,
        default=30.0,
        help=(
            "ResourceQuotas are watched (changes apply at once); the quota watch is renewed "
            "at least this often, in seconds (default %(default)s)"
        ),
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "numafit run accounting") -> int:
    args = build_parser(prog).parse_args(argv)
    settings = common_from_args(args)
    options = AccountingOptions(
        quota_resync_seconds=args.quota_resync_seconds,
        write_timeout=args.write_timeout,
        reservation_ttl=args.reservation_ttl,
    )
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_accounting"))
