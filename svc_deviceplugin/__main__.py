"""`numafit run deviceplugin` / `python -m svc_deviceplugin`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shared import subjects
from shared.service.runner import run, serve_spec
from shared.service.settings import add_common_arguments, common_from_args
from svc_deviceplugin.config import HamiCorePaths, PluginConfig
from svc_deviceplugin.discovery import (
    DiscoveryError,
    GpuBackend,
    NvmlBackend,
    SimulatedBackend,
    TopologyError,
    inventory_lines,
)
from svc_deviceplugin.service import PluginOptions, spec

if TYPE_CHECKING:
    from collections.abc import Sequence


def build_parser(prog: str = "numafit run deviceplugin") -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "The NVIDIA device plugin: advertises each GPU as replica slots with its NUMA node, "
            "registers with kubelet (re-registering after kubelet restarts), asks for a NUMA "
            "refit when kubelet's Topology Manager allows none of the reserved GPUs (pods with "
            "hami.io/numa-alignment), and answers Allocate with HAMi-core's environment. Talks "
            "only to kubelet and NATS."
        ),
    )
    add_common_arguments(parser, default_metrics_port=9104)
    parser.add_argument(
        "--node", default=env.get("NODE_NAME", ""), help="this node's name (env NODE_NAME)"
    )
    parser.add_argument(
        "--device-plugin-dir",
        default=env.get("NUMAFIT_DEVICE_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"),
        help="kubelet's device-plugin directory (default %(default)s)",
    )
    parser.add_argument("--socket-name", default="numafit-gpu.sock", help="plugin socket file")
    parser.add_argument("--resource-name", default="nvidia.com/gpu", help="extended resource")
    parser.add_argument(
        "--replicas", type=int, default=10, help="replica slots per GPU (default %(default)s)"
    )
    parser.add_argument(
        "--topology",
        default=env.get("NUMAFIT_TOPOLOGY"),
        help="simulated GPUs from a YAML/JSON topology instead of NVML (tests, demos)",
    )
    parser.add_argument(
        "--xid-file",
        default=env.get("NUMAFIT_XID_FILE"),
        help="with --topology: inject GPU health events; every line appended to this file, "
        "'<uuid> <xid>' ('*' for every GPU), is one XID event (env NUMAFIT_XID_FILE)",
    )
    parser.add_argument(
        "--refit-timeout-ms",
        type=int,
        default=2000,
        help="budget of each kubelet call (GetPreferredAllocation, Allocate), every hop "
        "included; a refit gets what is left of it (default %(default)s)",
    )
    parser.add_argument("--no-refit", action="store_true", help="never ask for NUMA refits")
    parser.add_argument(
        "--operating-mode",
        choices=["hami-core", "mig"],
        default="hami-core",
        help="mig: register GPUs in MIG mode; no refits (default %(default)s)",
    )
    parser.add_argument(
        "--hami-core-dir",
        default="/usr/local/vgpu",
        help="host directory holding libvgpu.so and ld.so.preload (default %(default)s)",
    )
    parser.add_argument(
        "--cache-dir",
        default="/tmp/vgpu/containers",
        help="host directory for per-container shared caches (default %(default)s)",
    )
    parser.add_argument(
        "--state-dir",
        default=env.get("NUMAFIT_STATE_DIR", "/var/lib/numafit/deviceplugin"),
        help="host directory for the consume journal: allocations kubelet was answered for "
        "while accounting did not acknowledge them, sent again until it does, across plugin "
        "restarts (mount it from the host; not the device-plugin directory, which kubelet "
        "empties when it starts; '' keeps them in memory only; env NUMAFIT_STATE_DIR, "
        "default %(default)s)",
    )
    parser.add_argument(
        "--inventory",
        action="store_true",
        help="print what GPU discovery sees and exit (exit 1 with one line when NVML is absent, "
        "2 when the --topology file is unusable)",
    )
    return parser


def backend_for(topology: str | None, xid_file: str | None = None) -> GpuBackend:
    if topology:
        return SimulatedBackend.from_file(Path(topology), xid_file=xid_file)
    return NvmlBackend()


def main(argv: Sequence[str] | None = None, prog: str = "numafit run deviceplugin") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.xid_file and not args.topology:
        print(f"{prog}: --xid-file needs --topology (simulated GPUs)", file=sys.stderr)
        return 2
    try:
        backend = backend_for(args.topology, args.xid_file)
    except TopologyError as exc:  # a bad --topology file is bad input, like a bad flag
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except DiscoveryError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    if args.inventory:
        try:
            print("\n".join(inventory_lines(backend.list_gpus())))
        finally:
            backend.close()
        return 0
    if not args.node:
        backend.close()
        print(f"{prog}: --node (or NODE_NAME) is required", file=sys.stderr)
        return 2
    try:
        subjects.check_name(args.node, "--node (or NODE_NAME)")
        config = _config(args)
    except ValueError as exc:  # InvalidName is a ValueError
        backend.close()
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    settings = common_from_args(args)
    options = PluginOptions(config=config, backend=backend)
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


def _config(args: argparse.Namespace) -> PluginConfig:
    return PluginConfig(
        node=args.node,
        directory=Path(args.device_plugin_dir),
        socket_name=args.socket_name,
        resource_name=args.resource_name,
        replicas=args.replicas,
        refit_enabled=not args.no_refit,
        refit_timeout_ms=args.refit_timeout_ms,
        mig_mode=args.operating_mode == "mig",
        state_dir=Path(args.state_dir) if args.state_dir else None,
        hami_core=HamiCorePaths(
            library_host=f"{args.hami_core_dir}/libvgpu.so",
            preload_host=f"{args.hami_core_dir}/ld.so.preload",
            cache_host_dir=args.cache_dir,
        ),
    )


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_deviceplugin"))
