"""`numafit up`: its options, the announcement, and the run until Ctrl-C or SIGTERM.

`add_arguments` is light (the parser of `numafit --help` is built from it without importing
the services); `up_command` imports the stack when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from shared.service.logs import add_log_level_argument
from shared.tools.local import defaults

if TYPE_CHECKING:
    from shared.tools.local.stack import LocalStack, UpOptions

log = logging.getLogger("numafit.up")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

DESCRIPTION = """\
Run the whole numafit system on this machine until Ctrl-C (or SIGTERM): an embedded
nats-server, the Kubernetes API emulator (with the admission webhook), svc_accounting,
svc_refit, svc_scheduler, simulated GPU nodes (each a kubelet emulator with Topology Manager
and static CPU manager driving the real device plugin over gRPC), and a scheduling loop that
does what kube-scheduler does for every pod with schedulerName numafit-scheduler, whoever
created it: /filter, /prioritize, /bind through the extender, FailedScheduling Events and
retries with backoff, then admission by the node's kubelet.

With --control-plane real (the binaries found through KUBEBUILDER_ASSETS, envtest's
convention; etcd there or on PATH) the cluster is upstream Kubernetes instead: etcd,
kube-apiserver (HTTPS on --api-port), kube-controller-manager, and kube-scheduler with
numafit's extender stanza (filter, prioritize, bind; nvidia.com/* ignoredByScheduler) in place
of the emulator and the scheduling loop; the webhook is a real MutatingWebhookConfiguration
over HTTPS, and the kubelet emulators register their nodes on the real API server.

It prints `export KUBECONFIG=...` for kubectl, the URLs and the metrics ports (compose's:
scheduler 9101, accounting 9102, refit 9103, device plugin 9104 and up), and writes a
kubeconfig, a Prometheus configuration and stack.json into --state-dir.
"""

EPILOG = """\
examples:
  numafit up                                  one node, 8 GPUs on 2 NUMA nodes
  numafit up --nodes 3 --gpus 4 --load        three nodes, a steady workload for Prometheus
  numafit up --scenario examples/single-numa-node-mismatch.yaml
  numafit up --host 0.0.0.0                   reachable from other machines
  KUBEBUILDER_ASSETS=.cache/k8s numafit up --control-plane real
then, in another terminal:
  export KUBECONFIG=<the path it printed>
  kubectl apply -f examples/pods/refit-best-effort.yaml
  kubectl describe pod refit-best-effort      the refit shows under Events
"""

_DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")
_SHAPE_FLAGS = (
    "nodes",
    "gpus",
    "cpus",
    "gpu_model",
    "gpu_memory",
    "topology_policy",
    "nrt_nodes",
)
_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0-65535; 0 picks a free one)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    nodes = parser.add_argument_group("simulated nodes")
    nodes.add_argument("--nodes", type=int, metavar="N", help="GPU nodes gpu-node-1..N (default 1)")
    nodes.add_argument(
        "--gpus",
        type=int,
        metavar="N",
        help="GPUs per node, GPU-<node>-<i>, spread evenly over the NUMA nodes of --cpus "
        "(default 8)",
    )
    nodes.add_argument(
        "--cpus",
        metavar="NUMA=COUNT,...",
        help="exclusive CPUs kubelet's static CPU manager has per NUMA node (default 0=32,1=32)",
    )
    nodes.add_argument(
        "--gpu-model", metavar="NAME", help=f"GPU model (default {_default_model()})"
    )
    nodes.add_argument(
        "--gpu-memory", type=int, metavar="MIB", help="memory per GPU in MiB (default 81920)"
    )
    nodes.add_argument(
        "--topology-policy",
        choices=_POLICIES,
        help="kubelet's Topology Manager policy (default single-numa-node: a container's GPUs "
        "must be on the NUMA node of its exclusive CPUs, which is what makes refits happen)",
    )
    nodes.add_argument(
        "--nrt-nodes",
        type=int,
        metavar="N",
        help="the first N nodes publish NodeResourceTopology, as NFD's topology-updater "
        "would, so the scheduler predicts where kubelet pins each container and reserves GPUs "
        "there (fewer refits; the NUMA prediction metrics count hits); default 0",
    )
    nodes.add_argument(
        "--scenario",
        metavar="FILE",
        help="take nodes, scheduler config and pods from a `numafit simulate` scenario file "
        "instead of the flags above; its pods are created once the stack is up, in order",
    )
    nodes.add_argument(
        "--gpu-scheduler-policy",
        choices=("binpack", "spread"),
        help="GPU policy of pods without hami.io/gpu-scheduler-policy (default spread)",
    )
    nodes.add_argument(
        "--node-scheduler-policy",
        choices=("binpack", "spread"),
        help="node policy of pods without hami.io/node-scheduler-policy (default binpack)",
    )
    nodes.add_argument(
        "--control-plane",
        choices=("emulator", "real"),
        default="emulator",
        help="emulator: numafit's API emulator and scheduling loop (default); real: etcd, "
        "kube-apiserver, kube-controller-manager and kube-scheduler with the extender, from "
        "the folder named by KUBEBUILDER_ASSETS",
    )
    net = parser.add_argument_group("addresses (0 for a port picks a free one)")
    net.add_argument(
        "--host",
        default=defaults.HOST,
        metavar="ADDRESS",
        help="address every listener binds (default %(default)s; 0.0.0.0 for every interface)",
    )
    net.add_argument(
        "--api-port",
        type=_port,
        metavar="PORT",
        default=defaults.API_PORT,
        help="Kubernetes API emulator, or kube-apiserver's HTTPS port with --control-plane real "
        "(default %(default)s)",
    )
    net.add_argument(
        "--nats-port",
        type=_port,
        metavar="PORT",
        default=defaults.NATS_PORT,
        help="nats-server (default %(default)s)",
    )
    net.add_argument(
        "--extender-port",
        type=_port,
        metavar="PORT",
        default=defaults.EXTENDER_PORT,
        help="scheduler extender and admission webhook (default %(default)s)",
    )
    net.add_argument(
        "--metrics-port-base",
        type=_port,
        metavar="PORT",
        default=defaults.METRICS_PORT_BASE,
        help="/metrics, /healthz, /readyz: scheduler on this port, accounting +1, refit +2, "
        "device plugin of each node +3 and up (default %(default)s, as in compose; 0: free ports)",
    )
    net.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where kubeconfig, prometheus.yml and stack.json are written (default "
        "$XDG_RUNTIME_DIR/numafit, else /tmp/numafit-<uid>)",
    )
    load = parser.add_argument_group("workload")
    load.add_argument(
        "--load",
        action="store_true",
        help="keep a steady GPU workload going: pods created and deleted at --load-rate, most "
        "opted in to NUMA refits, so every dashboard panel has data",
    )
    load.add_argument(
        "--load-rate",
        type=float,
        default=defaults.LOAD_RATE,
        metavar="PODS_PER_S",
        help="pods created per second (default %(default)s)",
    )
    load.add_argument(
        "--load-max-pods",
        type=int,
        default=defaults.LOAD_MAX_PODS,
        metavar="N",
        help="load pods kept; beyond it the oldest is deleted (default %(default)s)",
    )
    load.add_argument(
        "--load-namespace",
        default=defaults.LOAD_NAMESPACE,
        metavar="NAME",
        help="namespace of the load's pods (default %(default)s)",
    )
    load.add_argument(
        "--seed",
        type=int,
        default=7,
        metavar="N",
        help="seed of the load's pod mix (default %(default)s)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--scrape-interval",
        default=defaults.SCRAPE_INTERVAL,
        metavar="DURATION",
        help="scrape and rule evaluation interval written to prometheus.yml (default %(default)s)",
    )
    add_log_level_argument(out, help="log level of every part (default %(default)s)")
    out.add_argument(
        "--log-format",
        default="text",
        choices=("text", "json"),
        help="logs on standard error: readable text or JSON lines (default %(default)s)",
    )


def _default_model() -> str:
    return "NVIDIA H100 80GB HBM3"


class UsageError(ValueError):
    pass


def options_from_args(args: argparse.Namespace) -> UpOptions:
    """The options, checked; UsageError names the flag."""
    from shared.core.config import CoreConfig
    from shared.testing.kubelet_emulator import TopologyPolicy, parse_cpus
    from shared.tools.local.stack import UpOptions
    from shared.tools.local.topology import NodeShape, TopologyError, scenario_from_shape
    from shared.tools.simulate.scenario import ScenarioError, load_scenario

    if args.load_rate <= 0 or args.load_rate > 1000:
        raise UsageError(f"--load-rate must be above 0 and at most 1000, got {args.load_rate:g}")
    if args.load_max_pods < 1:
        raise UsageError(f"--load-max-pods must be at least 1, got {args.load_max_pods}")
    if not _DURATION.match(args.scrape_interval):
        raise UsageError(
            f"--scrape-interval must be a duration such as 1s or 15s, got {args.scrape_interval!r}"
        )
    if args.scenario is not None:
        given = [f"--{f.replace('_', '-')}" for f in _SHAPE_FLAGS if getattr(args, f) is not None]
        given += [
            f"--{f.replace('_', '-')}"
            for f in ("gpu_scheduler_policy", "node_scheduler_policy")
            if getattr(args, f) is not None
        ]
        if given:
            raise UsageError(f"--scenario gives the nodes and config; drop {', '.join(given)}")
        try:
            scenario = load_scenario(args.scenario)
        except ScenarioError as exc:
            raise UsageError(str(exc)) from exc
    else:
        try:
            cpus = parse_cpus(args.cpus) if args.cpus is not None else None
        except ValueError as exc:
            raise UsageError(f"--cpus: {exc}") from exc
        shape = NodeShape(
            nodes=args.nodes if args.nodes is not None else 1,
            gpus=args.gpus if args.gpus is not None else 8,
            policy=TopologyPolicy(args.topology_policy or "single-numa-node"),
            model=args.gpu_model if args.gpu_model is not None else _default_model(),
            memory_mib=args.gpu_memory if args.gpu_memory is not None else 81920,
            topology_nodes=args.nrt_nodes or 0,
            **({"cpus": cpus} if cpus is not None else {}),
        )
        config = CoreConfig(
            gpu_scheduler_policy=args.gpu_scheduler_policy or "spread",
            node_scheduler_policy=args.node_scheduler_policy or "binpack",
        )
        try:
            scenario = scenario_from_shape(shape, config)
        except TopologyError as exc:
            raise UsageError(str(exc)) from exc
    extra: dict[str, Any] = {}
    if args.state_dir is not None:
        extra["state_dir"] = args.state_dir.expanduser().absolute()
    return UpOptions(
        scenario=scenario,
        host=args.host,
        api_port=args.api_port,
        nats_port=args.nats_port,
        extender_port=args.extender_port,
        metrics_port_base=args.metrics_port_base,
        load=args.load,
        load_rate=args.load_rate,
        load_max_pods=args.load_max_pods,
        load_namespace=args.load_namespace,
        seed=args.seed,
        scrape_interval=args.scrape_interval,
        control_plane=args.control_plane,
        **extra,
    )


def _example(name: str) -> str:
    """examples/pods/<name> as a person in this directory would type it."""
    path = Path(__file__).resolve().parents[3] / "examples" / "pods" / name
    if not path.is_file():
        return f"examples/pods/{name}"
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def banner(stack: LocalStack) -> str:
    from shared.tools.local.topology import describe

    info = stack.describe()
    options = stack.options
    lines = [
        f"numafit is up in {stack.ready_seconds:.1f} s: {describe(options.scenario)}",
        "",
        f"    export KUBECONFIG={info['kubeconfig']}",
        "",
        f"  Kubernetes API      {info['api']}",
        f"  NATS                {info['nats']}",
        f"  scheduler extender  {info['extender']}  (POST /filter /prioritize /bind; webhook "
        "/webhook)",
    ]
    metrics = list(info["metrics"].items())
    width = max(len(name) for name, _ in metrics)
    for number, (name, url) in enumerate(metrics):
        label = "  metrics             " if number == 0 else " " * 22
        lines.append(f"{label}{name:<{width}}  {url}")
    data = stack.state_dir / "prometheus-data"
    lines.append(
        f"  Prometheus          prometheus --config.file={stack.prometheus_config} "
        f"--storage.tsdb.path={data}"
    )
    if options.load:
        lines.append(
            f"  load                {options.load_rate:g} pods/s in namespace "
            f"{options.load_namespace}, at most {options.load_max_pods} at a time"
        )
    else:
        lines.append("  load                off (--load keeps GPU pods coming)")
    if options.real:
        lines.append(
            "  control plane       real: etcd, kube-apiserver, kube-controller-manager, "
            "kube-scheduler (extender above)"
        )
    if options.host not in ("127.0.0.1", "localhost", "::1"):
        lines.append(f"  listening on        {options.host}")
    lines += [
        "",
        f"  try:  kubectl apply -f {_example('refit-best-effort.yaml')}",
        "        kubectl describe pod refit-best-effort     (Events: Scheduled, NumaRefitSucceed)",
        "",
        "Ctrl-C stops everything.",
        "",
    ]
    return "\n".join(lines)


async def _up(options: UpOptions, out: TextIO, began: float) -> None:
    from shared.service.lifecycle import stop_on_signals
    from shared.tools.local.defaults import StackError
    from shared.tools.local.stack import LocalStack

    stop = asyncio.Event()
    stop_on_signals(stop)
    stack = LocalStack(options)
    starting = asyncio.create_task(stack.start(log.info), name="up-start")
    stopping = asyncio.create_task(stop.wait(), name="up-signal")
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # raises what made the start fail
            stack.ready_seconds = time.monotonic() - began  # the command's start, imports included
            out.write(banner(stack))
            out.flush()
            failing = asyncio.create_task(stack.failure(), name="up-failure")
            done, _ = await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
            if failing in done:  # a service gave up: stop everything, exit 1
                raise StackError(failing.result())
            failing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await failing
        else:
            log.info("stopping before the stack was up")
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
    finally:
        stopping.cancel()
        log.info("stopping")
        await stack.stop()


def up_command(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Exit 0 after a clean stop, 2 for bad options, 1 when the stack cannot start."""
    began = time.monotonic()
    from shared.service.logs import configure_logging
    from shared.tools.local.defaults import StackError, check_ports

    try:
        options = options_from_args(args)
    except UsageError as exc:
        err.write(f"numafit up: {exc}\n")
        return EXIT_USAGE
    try:
        if options.real:
            from shared.tools.local.realplane import find_assets

            find_assets()  # one line naming KUBEBUILDER_ASSETS where the binaries are absent
        check_ports(options.host, options.fixed_ports())  # before anything starts or logs
    except StackError as exc:
        err.write(f"numafit up: {exc}\n")
        return EXIT_FAILURE
    configure_logging(args.log_level, args.log_format)
    try:
        asyncio.run(_up(options, out, began))
    except StackError as exc:
        err.write(f"numafit up: {exc}\n")
        return EXIT_FAILURE
    except Exception as exc:  # one line for the user; the logs have the rest
        err.write(f"numafit up: the stack failed: {type(exc).__name__}: {exc}\n")
        return EXIT_FAILURE
    return EXIT_OK
