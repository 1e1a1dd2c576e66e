"""The `numafit` command line: `plan`, `demo` (and, as services land, `run`, `simulate`, `bench`).

Every command prints one clear line and exits 2 on bad input; no traceback reaches a user.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from typing import TextIO

import orjson

from shared.plan import CaseError, explain, load_case, run_plan

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
numafit demo: the worked example of HAMi's NUMA refit.

Pod ml/train has an init container `prep` (1 GPU, 30000 MiB, 60% cores) and an app container
`main` (1 GPU, 20000 MiB, 30% cores). The scheduler put `prep` on GPU-b (NUMA 0) and `main` on
GPU-a (NUMA 1). kubelet pinned `main`'s CPUs to NUMA 0, so its Topology Manager only offers
GPU-b replicas: the device plugin asks for a refit of container 1 onto GPU-b.
Phase-aware capacity: `prep` and `main` never run together, so GPU-b needs max(30000, 20000)
= 30000 MiB, not 50000.
"""


def demo_command(out: TextIO, err: TextIO) -> int:
    case_file = resources.files("shared") / "data" / "plan-worked-example.json"
    out.write(DEMO_INTRO + "\n")
    out.write(f"$ numafit plan --explain {case_file}\n\n")
    return plan_command(str(case_file), True, out, err, sys.stdin)


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
    commands.add_parser(
        "demo",
        help="explain a refit on the bundled worked example",
        description="Run `numafit plan --explain` on the bundled worked example and say why.",
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


def _run_kube_emulator(argv: list[str]) -> int:
    from shared.kube_emulator.cli import main as run_main

    return run_main(argv)


def _run_kubelet_emulator(argv: list[str]) -> int:
    from shared.kubelet_emulator.cli import main as run_main

    return run_main(argv)


RUN_TARGETS: dict[str, Callable[[list[str]], int]] = {
    "accounting": _run_accounting,
    "refit": _run_refit,
    "deviceplugin": _run_deviceplugin,
    "kube-emulator": _run_kube_emulator,
    "kubelet-emulator": _run_kubelet_emulator,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return RUN_TARGETS[args.target](list(args.args))
    if args.command == "plan":
        return plan_command(args.case, args.explain, sys.stdout, sys.stderr, sys.stdin)
    if args.command == "demo":
        return demo_command(sys.stdout, sys.stderr)
    return EXIT_USAGE  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
