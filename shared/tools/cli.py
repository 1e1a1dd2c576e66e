"""The `numafit` command line (console script `numafit`, entry point `main`).

    plan       one refit decision offline, from a case file (shared.tools.plan)
    run        one component: a service (accounting, refit, scheduler, deviceplugin) or an
               emulator (kube-emulator, kubelet-emulator, sim-node), each with its own flags
    simulate   the whole system on emulated nodes, and a report (shared.tools.simulate)
    demo       `simulate` on the bundled scenario, explained
    up         the whole system on this machine until Ctrl-C, for kubectl and Prometheus
               (shared.tools.local)
    bench      refit round trips, scheduling throughput, filter latency, accounting memory
               (shared.tools.bench)

The top layer of the code: it imports the services, the emulators and the simulation, each
lazily by the command that needs it, and nothing imports it. Every command prints one clear
line and exits 2 on bad input; no traceback reaches a user.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from shared.tools.local import defaults
from shared.tools.plan import CaseError, explain, load_case, run_plan

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _read_case(path: str, stdin: TextIO) -> bytes:
    if path == "-":
        return stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
    with open(path, "rb") as handle:
        return handle.read()


def plan_command(path: str, want_explain: bool, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    """`numafit plan`: exit 0 with the decision (success or refusal), 2 for a malformed case."""
    try:
        raw = _read_case(path, stdin)
    except OSError as exc:
        err.write(f"numafit plan: cannot read {path}: {exc.strerror or exc}\n")
        return EXIT_USAGE
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        err.write(f"numafit plan: {path} is not valid JSON: {exc}\n")
        return EXIT_USAGE
    try:
        case = load_case(obj)
    except CaseError as exc:
        err.write(f"numafit plan: {path}: {exc}\n")
        return EXIT_USAGE
    result = run_plan(case)
    if want_explain:
        out.write(explain(result) + "\n")
    else:
        out.write(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    return EXIT_OK


DEMO_INTRO = """\
numafit demo: one GPU node, two NUMA nodes, eight GPUs, kubelet with the single-numa-node
Topology Manager. The scheduler extender spreads GPU work; kubelet pins each container's CPUs
to the lowest NUMA node that fits and only offers that node's GPUs. Pods that opted in with
hami.io/numa-alignment get their reservation refitted onto those GPUs; the others run on
kubelet's choice and accounting follows what runs. Everything below ran for real: nats-server,
the Kubernetes API emulator, accounting, refit, the scheduler extender, a kubelet emulator and
the device plugin over gRPC.
"""


def _progress(err: TextIO) -> Callable[[str], None]:
    tty = err.isatty()

    def show(message: str) -> None:
        if tty:
            err.write("\r\033[K" + message)
        else:
            err.write(message + "\n")
        err.flush()

    return show


def simulate_command(
    path: str | None, want_json: bool, out: TextIO, err: TextIO, serve: bool = False
) -> int:
    """`numafit simulate`: exit 0 with the report, 2 for a malformed scenario, 1 on failure.
    With `serve` (`numafit demo --serve`) the report is printed as soon as it is known, then
    every service's /metrics stays up on 127.0.0.1 and compose's ports until Ctrl-C."""
    import asyncio

    from shared.service.logs import configure_logging
    from shared.tools.simulate.report import public, render_table, simulate
    from shared.tools.simulate.scenario import ScenarioError, load_scenario

    configure_logging("critical", "text")  # the progress line and the report are the interface
    source = path or str(resources.files("shared") / "data" / "demo-scenario.yaml")
    try:
        scenario = load_scenario(source)
    except ScenarioError as exc:
        err.write(f"numafit simulate: {exc}\n")
        return EXIT_USAGE
    progress = _progress(err)

    def show(report: dict[str, Any]) -> None:
        if err.isatty():
            err.write("\r\033[K")
        if want_json:
            out.write(orjson.dumps(public(report), option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            render_table(report, out)
        out.flush()

    keep = ready = None
    if serve:
        keep, ready = serve_metrics(err, source=source), show
        try:
            check_demo_ports(defaults.HOST, defaults.METRICS_PORT_BASE, len(scenario.nodes))
        except defaults.StackError as exc:
            err.write(f"numafit demo --serve: {exc}\n")
            return EXIT_FAILURE
    try:
        report = asyncio.run(simulate(scenario, progress, keep, ready))
    except Exception as exc:
        err.write(f"\nnumafit simulate: the simulation failed: {exc}\n")
        return EXIT_FAILURE
    if not serve:
        show(report)
    return EXIT_OK


def bench_command(
    quick: bool, want_json: bool, out: TextIO, err: TextIO, real_only: bool = False
) -> int:
    import asyncio

    from shared.service.logs import configure_logging
    from shared.tools.bench import render, run_bench

    configure_logging("critical", "text")
    try:
        figures = asyncio.run(run_bench(quick, _progress(err), real_only))
    except Exception as exc:  # one line for the user
        err.write(f"\nnumafit bench: {exc}\n")
        return EXIT_FAILURE
    if err.isatty():
        err.write("\r\033[K")
    if want_json:
        out.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.write(render(figures) + "\n")
    return EXIT_OK


def check_demo_ports(host: str, base: int, nodes: int) -> None:
    """Refuse (StackError, one line) a metrics port `--serve` needs that is taken."""
    if base == 0:
        return
    names = [*defaults.SERVICES, *(f"device plugin {n + 1}" for n in range(nodes))]
    defaults.check_ports(host, {f"{name} metrics": base + i for i, name in enumerate(names)})


def serve_metrics(
    err: TextIO,
    *,
    host: str | None = None,
    base: int = defaults.METRICS_PORT_BASE,
    stop: Any = None,
    source: str = "",
) -> Callable[[Any], Any]:
    """With --serve: every service's /healthz, /readyz and /metrics on `host` (127.0.0.1) at
    compose's and `numafit up`'s ports from `base` (scheduler 9101, accounting 9102, refit 9103,
    then one device plugin per node; 0: free ones), each printed as listened on, until
    SIGINT/SIGTERM (or `stop`, an asyncio.Event, is set)."""

    async def keep(cluster: Any) -> None:
        import asyncio

        from shared.service.health import HealthServer
        from shared.service.lifecycle import stop_on_signals

        listen = host or defaults.HOST
        parts = [
            (name, cluster.registries[name], getattr(cluster, name)) for name in defaults.SERVICES
        ]
        parts += [
            (f"deviceplugin/{name}", node.registry, node.plugin)
            for name, node in sorted(cluster.nodes.items())
        ]
        servers = []
        try:
            err.write("\nserving every service's metrics:\n")
            for position, (name, registry, service) in enumerate(parts):
                port = base + position if base else 0
                server = HealthServer(registry, service.readiness, listen, port)
                await server.start()
                servers.append(server)
                shown = f"[{listen}]" if ":" in listen else listen
                err.write(f"  {name:<28} http://{shown}:{server.port}/metrics\n")
            again = f" --scenario {source}" if source else ""
            err.write(
                "the scenario's pods are done and nothing schedules new ones; for a stack that "
                f"schedules what kubectl creates, run `numafit up{again}`\n"
                "serving; Ctrl-C to stop\n"
            )
            err.flush()
            done = stop if stop is not None else asyncio.Event()
            if stop is None:
                stop_on_signals(done)
            await done.wait()
        finally:
            for server in servers:
                await server.stop()

    return keep


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numafit",
        description=(
            "numafit keeps fractional-GPU allocations on Kubernetes NUMA-aligned and their "
            "accounting exact (HAMi-compatible scheduler extender, device plugin and refit)."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    plan = commands.add_parser(
        "plan",
        help="decide one NUMA refit offline from a case file",
        description=(
            "Read a case (node with hami.io/node-nvidia-register, its pods, optional "
            "resourceQuotas and config, and a refit request) and print the refit decision as "
            "JSON: succeeded, code, containerDevices or failureReason, fitReasons, the "
            "annotations that would be patched and the node's usage afterwards. Exits 0 for "
            "every decision (moved or refused) and 2 when the case is malformed."
        ),
    )
    plan.add_argument("case", metavar="CASE.json", help="case file, or - for standard input")
    plan.add_argument(
        "--explain",
        action="store_true",
        help="print the decision for a person: devices considered, refusals, what moved",
    )
    run = commands.add_parser(
        "run",
        help="run one numafit component (a service or an emulator)",
        description="Run one component; `numafit run TARGET --help` lists its options.",
    )
    run.add_argument("target", choices=sorted(RUN_TARGETS), help="what to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the component's own options")
    simulate = commands.add_parser(
        "simulate",
        help="run the whole system on emulated nodes and report where everything landed",
        description=(
            "Start an embedded nats-server, the Kubernetes API emulator, the four services and, "
            "per node, a kubelet emulator driving the real device plugin on simulated GPUs; "
            "create the scenario's pods in order, schedule each through the extender as "
            "kube-scheduler would, admit it through the kubelet emulator, and report per "
            "container the GPUs and their NUMA nodes, the CPU NUMA node, alignment and the refit "
            "outcome, the final per-GPU usage and the metrics."
        ),
    )
    simulate.add_argument("scenario", metavar="SCENARIO.yaml", help="the scenario file")
    simulate.add_argument("--json", action="store_true", help="print the report as JSON")
    bench = commands.add_parser(
        "bench",
        help=(
            "measure refit round trips, scheduling throughput, extender filter latency and "
            "accounting memory"
        ),
        description=(
            "Measure, in one run on this machine: the refit round trip as the device plugin sees "
            "it (p50, p99, throughput at 1 and 64 concurrent) beside its floor, a bare nats-py "
            "echo on the same broker and a bare resourceVersion-guarded PATCH on the same API "
            "server; scheduling throughput (pods bound per second through /filter then /bind, "
            "one pod at a time, 20 nodes of 8 GPUs) and API writes per scheduled pod; extender "
            "filter latency at 100, 1000 and 5000 nodes of 8 GPUs; accounting memory per 10,000 "
            "reservations; and, where KUBEBUILDER_ASSETS names real kube-apiserver, "
            "kube-controller-manager and kube-scheduler binaries (etcd there or on PATH), plain "
            "kube-scheduler beside numafit (binpack, spread) on a real control plane."
        ),
    )
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.add_argument(
        "--quick", action="store_true", help="small sizes (seconds, for smoke tests)"
    )
    bench.add_argument(
        "--real-only",
        action="store_true",
        help="only the real-control-plane run (plain kube-scheduler beside numafit)",
    )
    demo = commands.add_parser(
        "demo",
        help="run the bundled scenario and explain it",
        description=(
            "Run `numafit simulate` on the bundled scenario (two NUMA nodes, eight GPUs, pods "
            "with and without hami.io/numa-alignment, init containers and sidecars) and show "
            "where each container landed, which refits moved what and why, and the GPU usage."
        ),
    )
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.add_argument(
        "--serve",
        action="store_true",
        help="print the report, then keep the system running with every service's /metrics on "
        "127.0.0.1 at compose's ports (scheduler 9101, accounting 9102, refit 9103, device "
        "plugin 9104) until Ctrl-C; for a stack kubectl can create pods in, use `numafit up`",
    )
    from shared.tools.local.command import add_arguments as add_up_arguments

    add_up_arguments(
        commands.add_parser(
            "up",
            help="run the whole system on this machine for kubectl and Prometheus (Ctrl-C stops)",
        )
    )
    return parser


def _run_accounting(argv: list[str]) -> int:
    from svc_accounting.__main__ import main as run_main

    return run_main(argv, prog="numafit run accounting")


def _run_refit(argv: list[str]) -> int:
    from svc_refit.__main__ import main as run_main

    return run_main(argv, prog="numafit run refit")


def _run_deviceplugin(argv: list[str]) -> int:
    from svc_deviceplugin.__main__ import main as run_main

    return run_main(argv, prog="numafit run deviceplugin")


def _run_scheduler(argv: list[str]) -> int:
    from svc_scheduler.__main__ import main as run_main

    return run_main(argv, prog="numafit run scheduler")


def _run_kube_emulator(argv: list[str]) -> int:
    from shared.testing.kube_emulator.cli import main as run_main

    return run_main(argv)


def _run_kubelet_emulator(argv: list[str]) -> int:
    from shared.testing.kubelet_emulator.cli import main as run_main

    return run_main(argv)


def _run_sim_node(argv: list[str]) -> int:
    from shared.tools.simulate.sim_node import main as run_main

    return run_main(argv)


RUN_TARGETS: dict[str, Callable[[list[str]], int]] = {
    "accounting": _run_accounting,
    "refit": _run_refit,
    "scheduler": _run_scheduler,
    "deviceplugin": _run_deviceplugin,
    "kube-emulator": _run_kube_emulator,
    "kubelet-emulator": _run_kubelet_emulator,
    "sim-node": _run_sim_node,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return RUN_TARGETS[args.target](list(args.args))
    if args.command == "plan":
        return plan_command(args.case, args.explain, sys.stdout, sys.stderr, sys.stdin)
    if args.command == "simulate":
        return simulate_command(args.scenario, args.json, sys.stdout, sys.stderr)
    if args.command == "bench":
        return bench_command(args.quick, args.json, sys.stdout, sys.stderr, args.real_only)
    if args.command == "demo":
        if not args.json:
            sys.stdout.write(DEMO_INTRO + "\n")
        return simulate_command(None, args.json, sys.stdout, sys.stderr, serve=args.serve)
    if args.command == "up":
        from shared.tools.local.command import up_command

        return up_command(args, sys.stdout, sys.stderr)
    return EXIT_USAGE  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
