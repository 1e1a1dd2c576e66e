"""`numafit run accounting` / `python -m svc_accounting`."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING

from shared.service.runner import run, serve_spec
from shared.service.settings import add_common_arguments, common_from_args
from svc_accounting.leases import DEFAULT_BUCKET, DEFAULT_PARTITIONS, DEFAULT_TTL
from svc_accounting.operations import DEFAULT_RESERVATION_TTL
from svc_accounting.service import AccountingOptions, spec

if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_PARTITIONS = 1024
REPLICA_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive number of seconds")
    return value


def _partitions(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"{text!r}: must be between 0 and {MAX_PARTITIONS}")
    return value


def _replica_id(text: str) -> str:
    if text and not REPLICA_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r}: a replica id is 1-64 letters, digits, '-' or '_'"
        )
    return text


def build_parser(prog: str = "numafit run accounting") -> argparse.ArgumentParser:
    env = os.environ
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
    group = parser.add_argument_group(
        "replicas",
        "Several replicas share the nodes: each node's partition is served by exactly one "
        "replica at a time, through leases in a JetStream key-value bucket (NATS must run with "
        "JetStream). A replica that dies is replaced within --lease-ttl; one that stops hands "
        "its partitions over at once.",
    )
    group.add_argument(
        "--partitions",
        type=_partitions,
        default=int(env.get("NUMAFIT_PARTITIONS", DEFAULT_PARTITIONS)),
        help=(
            "partitions the nodes are spread over; every replica must use the same number. 0: "
            "a single replica owns every node, without JetStream (env NUMAFIT_PARTITIONS; "
            "default %(default)s)"
        ),
    )
    group.add_argument(
        "--lease-ttl",
        type=_positive_seconds,
        default=DEFAULT_TTL,
        help=(
            "seconds a partition's lease lives without renewal: a dead replica's partitions "
            "are taken over after at most this long (renewed every third of it; default "
            "%(default)s)"
        ),
    )
    group.add_argument(
        "--lease-bucket",
        default=DEFAULT_BUCKET,
        help="JetStream key-value bucket of the leases (default %(default)s)",
    )
    group.add_argument(
        "--replica-id",
        type=_replica_id,
        default=env.get("NUMAFIT_REPLICA_ID", ""),
        help=(
            "this replica's name in the lease bucket, unique among the replicas (env "
            "NUMAFIT_REPLICA_ID, e.g. the pod name; default: host name and process id)"
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
        partitions=args.partitions,
        lease_ttl=args.lease_ttl,
        lease_bucket=args.lease_bucket,
        replica_id=args.replica_id,
    )
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_accounting"))
