"""`numafit run deviceplugin` / `python -m svc_deviceplugin`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shared import subjects
from shared.service.runner import run, serve_spec
from shared.service.settings import common_from_args, service_parser
from svc_deviceplugin.discovery import (
    DiscoveryError,
    GpuBackend,
    NvmlBackend,
    SimulatedBackend,
    TopologyError,
    inventory_lines,
)
from svc_deviceplugin.service import spec
from svc_deviceplugin.settings import (
    METRICS_PORT,
    DevicePluginSettings,
    PluginOptions,
    plugin_config,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.service.declare import SettingsParser

DESCRIPTION = (
    "The NVIDIA device plugin: advertises each GPU as replica slots with its NUMA node, "
    "registers with kubelet (re-registering after kubelet restarts), asks for a NUMA refit "
    "when kubelet's Topology Manager allows none of the reserved GPUs (pods with "
    "hami.io/numa-alignment), and answers Allocate with HAMi-core's environment. Talks only "
    "to kubelet and NATS. Every flag but --inventory can be given as its environment "
    "variable instead; a flag wins."
)
NODE = "--node (or NUMAFIT_NODE)"
"""How errors about the node name name where it comes from."""


def build_parser(
    prog: str = "numafit run deviceplugin", env: Mapping[str, str] | None = None
) -> SettingsParser:
    parser = service_parser(
        prog, DESCRIPTION, DevicePluginSettings, metrics_port=METRICS_PORT, env=env
    )
    # A command, not a setting: no environment variable (one set by mistake on a DaemonSet
    # would make every plugin print and exit).
    parser.add_argument(
        "--inventory",
        action="store_true",
        help="print what GPU discovery sees and exit (exit 1 with one line when NVML is absent, "
        "2 when the --topology file is unusable); a command: no environment variable",
    )
    return parser


def backend_for(topology: str | None, xid_file: str | None = None) -> GpuBackend:
    if topology:
        return SimulatedBackend.from_file(Path(topology), xid_file=xid_file)
    return NvmlBackend()


def main(argv: Sequence[str] | None = None, prog: str = "numafit run deviceplugin") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    flags = parser.resolve(DevicePluginSettings, args)
    if flags.xid_file and not flags.topology:
        print(f"{prog}: --xid-file needs --topology (simulated GPUs)", file=sys.stderr)
        return 2
    try:
        backend = backend_for(flags.topology, flags.xid_file)
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
    if not flags.node:
        backend.close()
        print(f"{prog}: {NODE} is required", file=sys.stderr)
        return 2
    try:
        subjects.check_name(flags.node, NODE)
        config = plugin_config(flags)
    except ValueError as exc:  # InvalidName is a ValueError
        backend.close()
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    settings = common_from_args(args)
    options = PluginOptions(config=config, backend=backend)
    return run(serve_spec(spec(options), settings), settings.log_level, settings.log_format)


if __name__ == "__main__":
    sys.exit(main(prog="python -m svc_deviceplugin"))
