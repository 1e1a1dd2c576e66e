"""`python -m shared.testing.kube_emulator --help`."""

from .cli import main

raise SystemExit(main(prog="python -m shared.testing.kube_emulator"))
