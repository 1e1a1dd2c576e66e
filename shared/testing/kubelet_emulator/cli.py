"""``numafit run kubelet-emulator``: serve an emulated kubelet until SIGINT/SIGTERM.

Useful to run the real device plugin by hand on a machine without kubelet:
the plugin registers on ``DIR/kubelet.sock`` and its device list is logged.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from shared.service.logs import add_log_level_argument, configure_logging
from shared.testing.kubelet_emulator.config import (
    DEFAULT_KUBELET_VERSION,
    DEVICE_PLUGIN_DIR,
    KubeletConfig,
    TopologyPolicy,
    parse_cpus,
)
from shared.testing.kubelet_emulator.emulator import KubeletEmulator

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)


def build_parser(prog: str = "numafit run kubelet-emulator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Emulate kubelet's device manager for device plugins (registration, "
        "ListAndWatch, Topology Manager admission).",
    )
    parser.add_argument("--node", default=socket.gethostname(), help="node name (for logs)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEVICE_PLUGIN_DIR,
        help=f"device plugin directory holding kubelet.sock (default {DEVICE_PLUGIN_DIR})",
    )
    parser.add_argument(
        "--topology-policy",
        choices=[policy.value for policy in TopologyPolicy],
        default=TopologyPolicy.NONE.value,
        help="Topology Manager policy (default none, as kubelet)",
    )
    parser.add_argument(
        "--cpus",
        type=_cpus_argument,
        default={},
        metavar="NUMA=COUNT,...",
        help="allocatable exclusive CPUs per NUMA node, e.g. '0=32,1=32'",
    )
    parser.add_argument(
        "--kubelet-version",
        default=DEFAULT_KUBELET_VERSION,
        help="the kubelet version played: before v1.31 a pod whose init containers ask for an "
        f"extended resource no plugin advertises is rejected (default {DEFAULT_KUBELET_VERSION})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seeds the order of kubelet's Go sets: the replica IDs offered to "
        "GetPreferredAllocation and kubelet's own picks (default 0)",
    )
    add_log_level_argument(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "numafit run kubelet-emulator") -> int:
    """Run the emulator until interrupted; returns the process exit status."""
    args = build_parser(prog).parse_args(argv)
    configure_logging(args.log_level, "json")
    config = KubeletConfig(
        directory=args.dir,
        node_name=args.node,
        topology_policy=TopologyPolicy(args.topology_policy),
        cpus=args.cpus,
        version=args.kubelet_version,
        seed=args.seed,
    )
    try:
        asyncio.run(_serve(config))
    except OSError as exc:
        logger.error("kubelet emulator failed", extra={"error": str(exc)})
        return 1
    return 0


async def _serve(config: KubeletConfig) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        async with KubeletEmulator(config):
            await stopping.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _cpus_argument(text: str) -> dict[int, int]:
    try:
        return parse_cpus(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
