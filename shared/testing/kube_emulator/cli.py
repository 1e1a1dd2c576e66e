"""`python -m shared.testing.kube_emulator` (and `numafit run kube-emulator`): the emulator as
a process.

For out-of-process users: it listens, writes a kubeconfig (atomically, once it is listening, so
the file's appearance means "ready"), logs JSON lines to stderr, and on SIGTERM or SIGINT ends
its watches, finishes in-flight requests and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from shared.service.logs import add_log_level_argument, configure_logging

from . import kubeconfig
from .remote_webhook import remote_webhook
from .server import KubeEmulator

log = logging.getLogger("numafit.kube_emulator")


def build_parser(prog: str = "numafit run kube-emulator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "An in-memory Kubernetes API server for tests: pods (with binding and status), "
            "nodes, namespaces, events, resource quotas, config maps, NodeResourceTopologies; "
            "list, watch, patch, server-side apply, dry runs, OpenAPI and Table output for "
            "kubectl; fault injection under /_emulator/faults. No authentication, no "
            "persistence."
        ),
    )
    parser.add_argument(
        "--port", type=int, default=8080, help="TCP port; 0 picks a free one (default 8080)"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    parser.add_argument(
        "--kubeconfig-out",
        metavar="PATH",
        help="write a kubeconfig for the emulator here once it is listening",
    )
    parser.add_argument(
        "--advertise-url",
        metavar="URL",
        help="server URL written into the kubeconfig (default: the listen address; in compose "
        "e.g. http://kube-emulator:8080)",
    )
    parser.add_argument(
        "--admission-webhook",
        metavar="URL",
        help="call this AdmissionReview webhook on pod creation and update, as the API server "
        "would (e.g. numafit's http://scheduler:8888/webhook)",
    )
    parser.add_argument(
        "--admission-failure-policy",
        choices=["Fail", "Ignore"],
        default="Fail",
        help="when the webhook cannot be reached (default %(default)s)",
    )
    parser.add_argument(
        "--history-limit",
        type=int,
        default=10_000,
        help="changes kept for watches from an older resourceVersion (default 10000)",
    )
    add_log_level_argument(parser, help="debug logs every request (default %(default)s)")
    return parser


async def serve(
    port: int,
    host: str,
    kubeconfig_out: str | None,
    *,
    history_limit: int = 10_000,
    advertise_url: str | None = None,
    admission_webhook: str | None = None,
    ignore_webhook_failure: bool = False,
) -> None:
    """Run the emulator until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    caught: list[str] = []

    def on_signal(signum: signal.Signals) -> None:
        caught.append(signum.name)
        stopping.set()

    signals = (signal.SIGTERM, signal.SIGINT)
    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        async with KubeEmulator(host=host, port=port, history_limit=history_limit) as emulator:
            if admission_webhook:
                emulator.admission = remote_webhook(
                    admission_webhook, ignore_failure=ignore_webhook_failure
                )
            if kubeconfig_out:
                if advertise_url:
                    kubeconfig.write(kubeconfig_out, advertise_url)
                else:
                    emulator.write_kubeconfig(kubeconfig_out)
                log.info("kubeconfig written", extra={"path": kubeconfig_out})
            # The URL clients are given (the kubeconfig's), e.g. the advertised service name.
            log.info("ready", extra={"url": advertise_url or emulator.url})
            await stopping.wait()
            log.info("shutting down", extra={"signal": caught[0] if caught else None})
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


def main(argv: list[str] | None = None, prog: str = "numafit run kube-emulator") -> int:
    args = build_parser(prog).parse_args(argv)
    configure_logging(args.log_level, "json")
    try:
        asyncio.run(
            serve(
                args.port,
                args.host,
                args.kubeconfig_out,
                history_limit=args.history_limit,
                advertise_url=args.advertise_url,
                admission_webhook=args.admission_webhook,
                ignore_webhook_failure=args.admission_failure_policy == "Ignore",
            )
        )
    except OSError as error:
        log.error("cannot serve", extra={"error": str(error)})
        return 1
    return 0
